"""The core against the authors' own implementation (../shared/data/weince_reference), case by case."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from train_helpers import SHARED_DATA, data_required

from simcse_weince import WeinceConfig, infonce_loss, weince_loss


def _load_cases():
    folder = SHARED_DATA / "weince_reference"
    if not folder.is_dir():
        return [], None
    cases = json.loads((folder / "tlambda_select_cases.json").read_text())
    return cases, np.load(folder / "tlambda_select_cases.npz")


CASES, ARRAYS = _load_cases()
pytestmark = pytest.mark.skipif(not CASES and not data_required(), reason="../shared/data/weince_reference is missing")


def test_reference_cases_are_present():
    """Under CI the authors' cases must be there (the parametrised tests below would otherwise be empty)."""
    assert CASES, f"{SHARED_DATA / 'weince_reference'} is missing: the reference tests cannot run"
    assert len(CASES) == 20


def _run(case, dtype):
    prefix = case["case"] + "_"
    z_i = torch.tensor(ARRAYS[prefix + "z_i"], dtype=dtype, requires_grad=True)
    z_j = torch.tensor(ARRAYS[prefix + "z_j"], dtype=dtype, requires_grad=True)
    config = WeinceConfig.reference(
        quantile=case["q"], aic_margin=case["margin"], kappa_rho=case["kr"], kappa_aic=case["ka"]
    )
    loss, stats = weince_loss(z_i, z_j, temperature=case["tau"], weince=config, geometry="simclr", return_stats=True)
    loss.backward()
    return loss, stats, z_i.grad, z_j.grad


def _expected(case, name):
    return torch.from_numpy(ARRAYS[case["case"] + "_" + name])


@pytest.mark.parametrize("case", CASES, ids=[c["case"] + "-" + c["kind"] for c in CASES])
def test_reference_case_float64(case):
    loss, stats, grad_i, grad_j = _run(case, torch.float64)
    tol = dict(rtol=0, atol=1e-9)
    assert loss.dtype == torch.float64
    assert abs(loss.item() - case["loss"]) <= 1e-9
    torch.testing.assert_close(stats["mixing_weight"], _expected(case, "lambda"), **tol)
    torch.testing.assert_close(stats["delta_aic"], _expected(case, "delta_aic"), **tol)
    torch.testing.assert_close(stats["rho"], _expected(case, "rho"), **tol)
    torch.testing.assert_close(stats["beta_hat"], _expected(case, "beta_hat"), **tol)
    torch.testing.assert_close(stats["logits"], _expected(case, "logits"), **tol)
    torch.testing.assert_close(grad_i, _expected(case, "grad_z_i"), **tol)
    torch.testing.assert_close(grad_j, _expected(case, "grad_z_j"), **tol)
    assert abs(stats["rho0"].item() - case["rho0"]) <= 1e-9
    assert abs(stats["mixing_weight"].mean().item() - case["lambda_mean"]) <= 1e-9
    assert abs(stats["mixing_weight"].max().item() - case["lambda_max"]) <= 1e-9
    z_i = torch.from_numpy(ARRAYS[case["case"] + "_z_i"])
    z_j = torch.from_numpy(ARRAYS[case["case"] + "_z_j"])
    plain = infonce_loss(z_i, z_j, temperature=case["tau"], geometry="simclr")
    assert abs(plain.item() - case["infonce_loss"]) <= 1e-9


@pytest.mark.parametrize("case", CASES, ids=[c["case"] + "-" + c["kind"] for c in CASES])
def test_reference_case_float32(case):
    loss, stats, grad_i, grad_j = _run(case, torch.float32)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - case["loss"]) <= 1e-5
    torch.testing.assert_close(stats["mixing_weight"].double(), _expected(case, "lambda"), rtol=0, atol=1e-5)
    torch.testing.assert_close(grad_i.double(), _expected(case, "grad_z_i"), rtol=0, atol=1e-5)
    torch.testing.assert_close(grad_j.double(), _expected(case, "grad_z_j"), rtol=0, atol=1e-5)


def test_reference_cosine_matrix_matches():
    from simcse_weince.weince.loss import cosine_similarity_matrix

    case = CASES[0]
    views = torch.cat([_expected(case, "z_i"), _expected(case, "z_j")])
    torch.testing.assert_close(cosine_similarity_matrix(views, views), _expected(case, "cos_sim"), rtol=0, atol=1e-12)
