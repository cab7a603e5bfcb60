"""The optimised core held to the package's readable reference, :mod:`simcse_weince.weince.reference`.

The reference is the method (docs/method.md) in plain autograd: each anchor's tail sorted and regressed one anchor at a
time, the logits and cross-entropy differentiated by autograd, so its gradients do not come from the core's
closed-form backward. The authors' own numbers (test_weince_reference.py) cover the simclr geometry with beta = 1;
these cases add the simcse geometry with estimated beta-hat, extra hard-negative columns, lambda well above 0, each
gate, a fixed lambda, the hardness weighting, and exact duplicates and similarities next to the endpoint.
"""

from __future__ import annotations

import pytest
import torch

from simcse_weince import WeinceConfig, weince_loss
from simcse_weince.weince.reference import reference_weince_loss

pytestmark = pytest.mark.usefixtures("one_thread")

STATISTICS = ("mixing_weight", "beta", "rho", "delta_aic", "beta_hat", "rho0", "logits")


def _compare(anchors, candidates, tol=1e-9, **options):
    """Run the core and the reference on copies of the inputs; assert loss, statistics and both gradients agree."""
    core_anchors = anchors.clone().requires_grad_(True)
    core_candidates = candidates.clone().requires_grad_(True)
    loss, stats = weince_loss(core_anchors, core_candidates, return_stats=True, **options)
    loss.backward()
    ref_anchors = anchors.clone().requires_grad_(True)
    ref_candidates = candidates.clone().requires_grad_(True)
    expected_loss, expected = reference_weince_loss(ref_anchors, ref_candidates, **options)
    expected_loss.backward()

    close = dict(rtol=tol, atol=tol)
    torch.testing.assert_close(loss.double(), expected_loss.detach(), **close)
    for name in STATISTICS:
        torch.testing.assert_close(stats[name].double(), expected[name], **close, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(core_anchors.grad.double(), ref_anchors.grad.double(), **close)
    torch.testing.assert_close(core_candidates.grad.double(), ref_candidates.grad.double(), **close)
    return expected


def _case(kind: str, n: int, d: int, extra: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    if kind == "random":
        anchors = randn(n, d)
        candidates = torch.cat([anchors + 0.4 * randn(n, d), randn(extra, d)])
    else:  # clustered: items share a few centres, so hard negatives come close to cosine 1 and lambda is large
        centres = randn(4, d)
        labels = torch.randint(0, 4, (n + extra,), generator=generator)
        items = centres[labels] + 0.15 * randn(n + extra, d)
        anchors = items[:n] + 0.02 * randn(n, d)
        candidates = torch.cat([items[:n] + 0.02 * randn(n, d), items[n:]])
    return anchors, candidates


CASES = [
    # kind, anchors, dim, extra hard-negative rows, seed, temperature, config
    ("random", 16, 8, 0, 0, 0.05, WeinceConfig()),
    ("random", 48, 16, 0, 1, 0.05, WeinceConfig()),
    ("random", 24, 12, 24, 2, 0.05, WeinceConfig()),
    ("random", 64, 32, 320, 3, 0.1, WeinceConfig()),  # K = 383 negatives: k = round(0.1 K) = 38, burn-in 1
    ("random", 6, 4, 0, 4, 0.05, WeinceConfig()),  # K = 5 < 10: the tail is every negative
    ("random", 3, 4, 0, 5, 0.05, WeinceConfig()),  # K = 2: one point after burn-in, the degenerate fallback
    ("clustered", 32, 16, 0, 6, 0.05, WeinceConfig()),
    ("clustered", 40, 16, 40, 7, 0.05, WeinceConfig()),
    ("clustered", 40, 16, 80, 8, 0.05, WeinceConfig(gate="rho")),
    ("clustered", 40, 16, 80, 9, 0.05, WeinceConfig(gate="aic")),
    ("clustered", 32, 16, 32, 10, 0.05, WeinceConfig(beta=1.0)),
    ("clustered", 50, 8, 200, 11, 0.07, WeinceConfig(quantile=0.5, kappa_rho=5.0, kappa_aic=2.0, aic_margin=0.0)),
    ("random", 40, 16, 40, 12, 0.05, WeinceConfig(tail_fraction=0.5, min_tail_points=12, beta_max=3.0)),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}x{c[3]}-seed{c[4]}-{c[6].gate}" for c in CASES])
def test_core_equals_the_reference(case):
    kind, n, d, extra, seed, temperature, config = case
    anchors, candidates = _case(kind, n, d, extra, seed)
    _compare(anchors, candidates, temperature=temperature, weince=config)


@pytest.mark.parametrize("kind", ["random", "clustered"])
def test_core_equals_the_reference_in_the_simclr_geometry(kind):
    anchors, candidates = _case(kind, 40, 16, 0, seed=20)
    expected = _compare(anchors, candidates, temperature=0.1, weince=WeinceConfig(), geometry="simclr")
    assert expected["logits"].shape == (80, 79)


OPTIONS = {
    "lambda 0": dict(mixing_weight=0.0),
    "lambda 1": dict(mixing_weight=1.0),
    "lambda per anchor": dict(mixing_weight="linspace"),  # 0 to 1 over the anchors
    "hardness in-batch": dict(hardness_strength=5.0),
    "hardness hard negatives": dict(hardness_strength=5.0, hardness_mode="hard_negatives"),
    "hardness all negatives": dict(hardness_strength=5.0, hardness_mode="all_negatives"),
    "hardness beta 1 gate rho": dict(hardness_strength=2.0, weince=WeinceConfig(beta=1.0, gate="rho")),
}


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_core_equals_the_reference_with_each_option(geometry, option):
    """A fixed lambda (0: InfoNCE, 1: the shortfall logit alone) and the hardness weighting, on clustered items."""
    anchors, candidates = _case("clustered", 16, 8, 16, seed=30)
    options = dict(OPTIONS[option])
    if geometry == "simclr":  # two views of 16 items: 32 anchors
        candidates = candidates[:16]
    if options.get("mixing_weight") == "linspace":
        options["mixing_weight"] = torch.linspace(0, 1, 16 if geometry == "simcse" else 32, dtype=torch.float64)
    _compare(anchors, candidates, temperature=0.05, geometry=geometry, **options)


def _at_shortfall(direction: torch.Tensor, shortfall: float, generator) -> torch.Tensor:
    """A vector whose cosine with ``direction`` is exactly representable as ``1 - shortfall`` (up to rounding)."""
    unit = direction / direction.norm()
    other = torch.randn(direction.shape, generator=generator, dtype=torch.float64)
    other = other - (other @ unit) * unit
    angle = torch.tensor(1 - shortfall, dtype=torch.float64).acos()
    return 2.5 * (angle.cos() * unit + angle.sin() * other / other.norm())


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
def test_core_equals_the_reference_next_to_the_endpoint(geometry):
    """Exact duplicates (cosine 1: the shortfall floored at eps, its term without gradient), negatives just inside
    and just outside the floor, and hardest negatives whose shortfalls sit a few eps above it."""
    generator = torch.Generator().manual_seed(40)
    anchors, candidates = _case("clustered", 24, 8, 0, seed=41)
    candidates[3] = anchors[3]  # the positive pair is an exact duplicate
    candidates[6] = anchors[4]  # a negative is an exact duplicate of anchor 4 (simclr: of its item's other view)
    anchors[9] = anchors[8]  # two anchors are the same sentence
    for row, (anchor, shortfall) in enumerate([(0, 4e-7), (1, 3e-6), (2, 1.5e-6), (5, 1e-5)], start=12):
        candidates[row] = _at_shortfall(anchors[anchor], shortfall, generator)
    if geometry == "simcse":  # the same, as hard-negative columns
        extra = [_at_shortfall(anchors[i], shortfall, generator) for i, shortfall in ((7, 2e-6), (10, 5e-7))]
        candidates = torch.cat([candidates, torch.stack(extra), anchors[11:12].clone()])
    expected = _compare(anchors, candidates, temperature=0.05, geometry=geometry)
    assert expected["rho"].min() == 1e-6 and expected["mixing_weight"].max() > 0.5  # the floor is reached, and used
    assert torch.isfinite(expected["logits"][expected["logits"] > -torch.inf]).all()


def test_core_equals_the_reference_for_float32_inputs():
    """Float32 inputs: the statistics come from float64 similarities in both; the logits are float32 in the core."""
    anchors, candidates = _case("clustered", 32, 16, 32, seed=50)
    _compare(anchors.float(), candidates.float(), tol=2e-5, temperature=0.05)


def test_the_cases_exercise_the_correction():
    """The comparison above is only a check of WEINCE if lambda is far from 0 and beta-hat varies in many cases."""
    strong = 0
    for kind, n, d, extra, seed, temperature, config in CASES:
        anchors, candidates = _case(kind, n, d, extra, seed)
        _, expected = reference_weince_loss(anchors, candidates, temperature=temperature, weince=config)
        strong += bool(expected["mixing_weight"].max() > 0.5 and expected["beta"].std() > 0.1)
    assert strong >= 6
