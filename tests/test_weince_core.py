"""Invariants, gradients, numerics and input validation of the functional core."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from simcse_weince import WeinceConfig, infonce_loss, mixing_weights, tail_statistics, weince_logits, weince_loss
from simcse_weince.weince.loss import STATISTIC_KEYS, TailStatistics, cosine_similarity_matrix, summarize_statistics


def _views(n=16, d=24, m=0, seed=0, dtype=torch.float64):
    """n anchors, their noisy positives, then m unrelated extra negatives."""
    generator = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, d, generator=generator, dtype=dtype)
    positives = anchors + 0.3 * torch.randn(n, d, generator=generator, dtype=dtype)
    extra_negatives = torch.randn(m, d, generator=generator, dtype=dtype)
    return anchors, torch.cat([positives, extra_negatives])


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
def test_zero_mixing_weight_is_infonce(geometry):
    anchors, candidates = _views(40, 16)
    anchors.requires_grad_(True)
    forced, stats = weince_loss(
        anchors, candidates, temperature=0.1, geometry=geometry, mixing_weight=0.0, return_stats=True
    )
    (grad_forced,) = torch.autograd.grad(forced, anchors)
    plain = infonce_loss(anchors, candidates, temperature=0.1, geometry=geometry)
    (grad_plain,) = torch.autograd.grad(plain, anchors)
    torch.testing.assert_close(forced, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_forced, grad_plain, rtol=0, atol=1e-12)
    assert stats["mixing_weight"].abs().max() == 0
    assert stats["rho"].shape == (anchors.shape[0] * (2 if geometry == "simclr" else 1),)


def test_zero_mixing_weight_equals_sentence_transformers_mnrl(minilm):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    anchors, candidates = _views(32, 64, m=32, dtype=torch.float32)
    temperature = 0.05
    mnrl = MultipleNegativesRankingLoss(minilm, scale=1 / temperature)
    expected = mnrl.compute_loss_from_embeddings([anchors, candidates[:32], candidates[32:]], labels=None)
    forced = weince_loss(anchors, candidates, temperature=temperature, mixing_weight=0.0)
    plain = infonce_loss(anchors, candidates, temperature=temperature)
    assert abs(forced.item() - expected.item()) <= 1e-6
    assert abs(plain.item() - expected.item()) <= 1e-6


def test_weince_differs_from_infonce_when_tails_are_weibull():
    anchors, candidates = _views(64, 32)
    weince, stats = weince_loss(anchors, candidates, temperature=0.05, return_stats=True)
    assert stats["mixing_weight"].max() > 0.1
    assert not torch.isclose(weince, infonce_loss(anchors, candidates, temperature=0.05))


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
def test_permutation_equivariance(geometry):
    """Permuting the items permutes the per-anchor statistics and leaves the loss unchanged."""
    anchors, candidates = _views(48, 16, seed=3)
    permutation = torch.randperm(48, generator=torch.Generator().manual_seed(1))
    loss, stats = weince_loss(anchors, candidates, temperature=0.1, geometry=geometry, return_stats=True)
    loss_p, stats_p = weince_loss(
        anchors[permutation], candidates[permutation], temperature=0.1, geometry=geometry, return_stats=True
    )
    torch.testing.assert_close(loss, loss_p, rtol=0, atol=1e-12)
    index = permutation if geometry == "simcse" else torch.cat([permutation, permutation + 48])
    for key in ("mixing_weight", "delta_aic", "rho", "beta_hat"):
        torch.testing.assert_close(stats[key][index], stats_p[key], rtol=0, atol=1e-10)
    torch.testing.assert_close(stats["rho0"], stats_p["rho0"])


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
def test_gradient_matches_finite_differences(geometry):
    anchors, candidates = _views(6, 5, seed=2)
    anchors.requires_grad_(True)
    candidates.requires_grad_(True)
    config = WeinceConfig(min_tail_points=4, beta=1.5)  # a fixed beta: only lambda is a statistic

    # The statistics are stop-gradient: freeze lambda at the evaluation point (gradcheck perturbs in place).
    _, stats = weince_loss(
        anchors.detach().clone(),
        candidates.detach().clone(),
        temperature=0.2,
        weince=config,
        geometry=geometry,
        return_stats=True,
    )
    frozen_weight = stats["mixing_weight"].clone()
    assert frozen_weight.max() > 0.05  # the shortfall term is really exercised

    def loss_fn(a, c):
        return weince_loss(a, c, temperature=0.2, weince=config, geometry=geometry, mixing_weight=frozen_weight)

    assert torch.autograd.gradcheck(loss_fn, (anchors, candidates), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("geometry", ["simcse", "simclr"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hand_written_backward_equals_autograd(geometry, dtype):
    """The loss's forward and hand-written backward equal autograd through weince_logits + F.cross_entropy, with a
    floored shortfall (an exact duplicate) and, in simclr, the anchor masked out of its own softmax."""
    anchors, candidates = _views(24, 8, m=8 if geometry == "simcse" else 0, seed=5, dtype=dtype)
    candidates[3] = anchors[3]  # cosine 1: the shortfall is floored at eps and its term has no gradient
    candidates[5] = anchors[2]  # a duplicate among the negatives (simcse) / another anchor's view (simclr)
    temperature = 0.1
    loss, stats = weince_loss(
        anchors.requires_grad_(True),
        candidates.requires_grad_(True),
        temperature=temperature,
        geometry=geometry,
        return_stats=True,
    )
    assert stats["mixing_weight"].max() > 0.1
    grads = torch.autograd.grad(loss, (anchors, candidates))

    a, c = anchors.detach().clone().requires_grad_(True), candidates.detach().clone().requires_grad_(True)
    if geometry == "simcse":
        sims, positives, self_mask = cosine_similarity_matrix(a, c), torch.arange(24), None
    else:
        views = torch.cat([a, c])
        sims, positives = cosine_similarity_matrix(views, views), torch.arange(48).roll(24)
        self_mask = torch.eye(48, dtype=torch.bool)
    weight, beta = stats["mixing_weight"].to(dtype), stats["beta"].to(dtype)
    logits = weince_logits(sims, weight, beta, temperature)
    if self_mask is not None:
        logits = logits.masked_fill(self_mask, float("-inf"))
    expected = F.cross_entropy(logits, positives)
    expected_grads = torch.autograd.grad(expected, (a, c))
    tol = dict(rtol=0, atol=1e-10) if dtype == torch.float64 else dict(rtol=0, atol=2e-5)
    torch.testing.assert_close(loss, expected, **tol)
    for grad, expected_grad in zip(grads, expected_grads):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, expected_grad, **tol)


def test_statistics_carry_no_gradient():
    anchors, candidates = _views(32, 16)
    anchors.requires_grad_(True)
    _, stats = weince_loss(anchors, candidates, temperature=0.05, return_stats=True)
    for key in ("mixing_weight", "delta_aic", "rho", "beta_hat", "beta", "rho0", "logits"):
        assert not stats[key].requires_grad, key


def test_extra_negatives_are_candidates_for_every_anchor():
    anchors, candidates = _views(16, 16, m=16)
    _, stats = weince_loss(anchors, candidates, temperature=0.05, return_stats=True)
    assert stats["logits"].shape == (16, 32)
    hard = candidates[16:].clone()
    hard[0] = anchors[0] * 3  # a hard negative identical in direction to anchor 0
    _, stats_hard = weince_loss(anchors, torch.cat([candidates[:16], hard]), temperature=0.05, return_stats=True)
    assert stats_hard["rho"][0] == pytest.approx(1e-6)  # floored at eps, not 0


def test_beta_modes():
    anchors, candidates = _views(64, 16)
    _, estimated = weince_loss(anchors, candidates, temperature=0.05, return_stats=True)
    assert torch.equal(estimated["beta"], estimated["beta_hat"].clamp(0.5, 16.0))
    _, fixed = weince_loss(anchors, candidates, temperature=0.05, weince=WeinceConfig(beta=2.5), return_stats=True)
    assert torch.all(fixed["beta"] == 2.5)
    assert WeinceConfig.reference().beta == 1.0


def test_gates():
    anchors, candidates = _views(64, 16)
    weights = {}
    for gate in ("both", "rho", "aic"):
        _, stats = weince_loss(anchors, candidates, temperature=0.05, weince=WeinceConfig(gate=gate), return_stats=True)
        weights[gate] = stats["mixing_weight"]
    torch.testing.assert_close(weights["both"], weights["rho"] * weights["aic"])


def _float64(values):
    return torch.tensor(values, dtype=torch.float64)


def _hand_statistics(rho, delta_aic):
    rho, delta_aic = _float64(rho), _float64(delta_aic)
    return TailStatistics(rho, delta_aic, torch.zeros_like(rho), torch.full_like(rho, 11), False)


def test_each_gate_by_hand():
    """rho doubling from anchor to anchor and Delta-AIC offsets of +-log 3 make every sigmoid a simple fraction."""
    log3 = math.log(3.0)
    stats = _hand_statistics([0.04, 0.01, 0.02, 0.08, 0.16], [2.0, 2.0 + log3, 2.0 - log3, 0.0, 10.0])
    # rho_0: sorted rho = [0.01, 0.02, 0.04, 0.08, 0.16], index round(0.2 * 4) = 1 -> 0.02
    # gate="rho": sigmoid(10 log(0.02 / rho)) = 1 / (1 + (rho / 0.02) ** 10)
    exact = dict(rtol=0, atol=1e-14)
    expected_rho = _float64([1 / (1 + 2**10), 2**10 / (2**10 + 1), 0.5, 1 / (1 + 2**20), 1 / (1 + 2**30)])
    # gate="aic": sigmoid(1 * (Delta-AIC - 2)): sigmoid(0) = 1/2, sigmoid(log 3) = 3/4, sigmoid(-log 3) = 1/4
    expected_aic = _float64([0.5, 0.75, 0.25, 1 / (1 + math.e**2), 1 / (1 + math.e**-8)])
    for gate, expected in (("rho", expected_rho), ("aic", expected_aic), ("both", expected_rho * expected_aic)):
        weight, rho0 = mixing_weights(stats, WeinceConfig(gate=gate))
        assert rho0.item() == 0.02
        torch.testing.assert_close(weight, expected, **exact, msg=gate)
    # the slopes and the margin enter where docs/method.md#the-two-gates puts them: kappa_rho = 5 halves the log-odds
    # of lambda_rho, kappa_aic = 2 and m = 0 give sigmoid(2 Delta-AIC)
    weight, _ = mixing_weights(stats, WeinceConfig(gate="rho", kappa_rho=5.0))
    torch.testing.assert_close(weight[:2], _float64([1 / (1 + 2**5), 2**5 / (2**5 + 1)]), **exact)
    weight, _ = mixing_weights(stats, WeinceConfig(gate="aic", kappa_aic=2.0, aic_margin=0.0))
    torch.testing.assert_close(weight[3], _float64(0.5), **exact)
    torch.testing.assert_close(weight[0], _float64(1 / (1 + math.e**-4)), **exact)
    # quantile 0.5 -> index round(0.5 * 4) = 2 -> rho_0 = 0.04, so anchor 0 sits at lambda_rho = 1/2
    weight, rho0 = mixing_weights(stats, WeinceConfig(gate="rho", quantile=0.5))
    assert rho0.item() == 0.04 and weight[0].item() == pytest.approx(0.5, abs=1e-14)


def test_delta_aic_by_hand():
    """Delta-AIC = AIC(Gumbel) - AIC(Weibull) with AIC = n log(SSE / n) + 4, the lines fitted by numpy.polyfit."""
    import numpy as np

    negatives = np.array([0.97, 0.9, 0.88, 0.8, 0.79, 0.7, 0.61, 0.6, 0.52, 0.5, 0.41, 0.3])  # K = 12: k = 12
    stats = tail_statistics(torch.from_numpy(negatives)[None], WeinceConfig())
    x = np.log(1 - negatives[1:])  # burn-in max(1, 12 // 20) = 1: ranks 2..12, n = 11
    plotting = np.arange(2, 13) / 13
    fits = {}
    for name, y in (("weibull", np.log(plotting)), ("gumbel", np.log(-np.log(plotting)))):
        slope, intercept = np.polyfit(x, y, 1)
        fits[name] = (slope, ((y - (intercept + slope * x)) ** 2).sum())
    assert fits["weibull"][0] > 0 > fits["gumbel"][0]  # right-signed slopes: no 1e6 penalty
    aic = {name: 11 * math.log(sse / 11) + 4 for name, (_, sse) in fits.items()}
    assert stats.delta_aic.item() == pytest.approx(aic["gumbel"] - aic["weibull"], abs=1e-9)
    assert stats.beta_hat.item() == pytest.approx(fits["weibull"][0], abs=1e-12)
    assert stats.rho.item() == pytest.approx(0.03, abs=1e-15) and stats.tail_points.item() == 11
    # a flat tail (every negative the same): both slopes are 0, both lines wrong-signed, both SSEs get + 1e6
    flat = tail_statistics(torch.full((1, 12), 0.5, dtype=torch.float64), WeinceConfig())
    sse_weibull = ((np.log(plotting) - np.log(plotting).mean()) ** 2).sum() + 1e6
    gumbel_y = np.log(-np.log(plotting))
    sse_gumbel = ((gumbel_y - gumbel_y.mean()) ** 2).sum() + 1e6
    assert flat.delta_aic.item() == pytest.approx(11 * math.log(sse_gumbel / sse_weibull), abs=1e-9)
    assert flat.beta_hat.item() == 0.0


def test_summarize_statistics_by_hand():
    stats = {
        "mixing_weight": torch.tensor([0.1, 0.5, 0.6, 0.9]),
        "rho0": torch.tensor(0.03),
        "delta_aic": torch.tensor([-1.0, 3.0, 4.0, 6.0]),
        "beta_hat": torch.tensor([0.0, 1.0, 2.0, 5.0]),
        "beta": torch.tensor([0.5, 1.0, 2.0, 5.0]),  # the clamped exponent is not what is summarised
    }
    summary = summarize_statistics(stats)
    assert list(summary) == list(STATISTIC_KEYS)
    expected = {
        "lambda_mean": 0.525,
        "lambda_above_half": 0.5,
        "rho0": 0.03,
        "delta_aic_mean": 3.0,
        "beta_hat_mean": 2.0,
    }  # fmt: skip  (lambda = 0.5 exactly is not above one half)
    assert {key: value.item() for key, value in summary.items()} == pytest.approx(expected, abs=1e-7)
    assert all(value.dim() == 0 for value in summary.values())


def test_tail_statistics_follow_the_spec_by_hand():
    """One anchor, 12 negatives: tail size max(10, ...) = 12, burn-in 1, 11 regression points."""
    negatives = torch.linspace(0.2, 0.95, 12, dtype=torch.float64)[None].flip(1)
    stats = tail_statistics(negatives, WeinceConfig())
    shortfalls = (1 - negatives[0]).clamp_min(1e-6)  # ascending, r = 1..12
    x = shortfalls[1:].log()
    ranks = torch.arange(2, 13, dtype=torch.float64)
    y_weibull = (ranks / 13).log()
    slope = ((x - x.mean()) * (y_weibull - y_weibull.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert stats.rho.item() == pytest.approx(0.05)
    assert stats.beta_hat.item() == pytest.approx(max(slope.item(), 0.0), abs=1e-12)
    assert stats.tail_points.item() == 11


def test_padding_is_excluded_from_the_tail():
    generator = torch.Generator().manual_seed(0)
    sims = torch.rand(4, 60, generator=generator, dtype=torch.float64) * 1.6 - 0.8
    padded = torch.cat([sims, torch.full((4, 20), float("-inf"), dtype=torch.float64)], dim=1)
    padded[1, 40:60] = float("-inf")  # anchor 1 has only 40 valid negatives
    full = tail_statistics(sims)
    masked = tail_statistics(padded)
    for key in ("rho", "delta_aic", "beta_hat"):
        torch.testing.assert_close(getattr(masked, key)[[0, 2, 3]], getattr(full, key)[[0, 2, 3]])
    only_40 = tail_statistics(sims[1:2, :40])
    torch.testing.assert_close(masked.delta_aic[1:2], only_40.delta_aic)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hardest_shortfalls_are_the_sorted_top_k(dtype):
    """The top-k behind the tail statistics (numpy's partition on the CPU) against a full sort, with ties,
    padding, a cosine above 1 (rounding) and the input left untouched unless it may be overwritten."""
    from simcse_weince.weince.speedups import _hardest_shortfalls

    generator = torch.Generator().manual_seed(3)
    sims = (torch.rand(16, 100, generator=generator, dtype=dtype) * 2 - 1).round(decimals=2)  # many ties
    sims[0, :30] = float("-inf")
    sims[1, 5] = 1 + 1e-7
    original = sims.clone()
    expected = torch.rsub(sims.sort(dim=1, descending=True).values[:, :40], 1).clamp_min(1e-6)
    torch.testing.assert_close(_hardest_shortfalls(sims, 40, 1e-6), expected, rtol=0, atol=0)
    assert torch.equal(sims, original)
    torch.testing.assert_close(_hardest_shortfalls(sims.clone(), 40, 1e-6, overwrite=True), expected, rtol=0, atol=0)


PRESELECTION_CASES = ["cosines", "tie across the threshold", "equal values at the threshold", "nan", "padding"]


@pytest.mark.parametrize("case", PRESELECTION_CASES)
def test_float32_preselection_finds_the_float64_top_k(case, monkeypatch):
    """Wide float64 rows find their top k through float32 roundings (numpy sorts 32-bit floats with vector
    instructions, 64-bit ones without): the values must be exactly a float64 sort's, and a row where more than k
    values round to the threshold (or a NaN) must send the batch to the float64 partition."""
    from simcse_weince.weince import speedups
    from simcse_weince.weince.speedups import _hardest_shortfalls, _largest_by_float32

    generator = torch.Generator().manual_seed(11)
    directions = F.normalize(torch.randn(600, 32, generator=generator, dtype=torch.float64), dim=1)
    sims = directions[:40] @ directions[40:].T  # 40 x 560 cosines
    sims[:, :40].diagonal().fill_(float("-inf"))
    k = 56
    threshold = sims[7].sort(descending=True).values[k - 1].item()
    if case == "tie across the threshold":  # a new (k+1)-th value: the k-th's float32 rounding, but smaller
        sims[7, sims[7].argsort()[0]] = threshold - 1e-13
    elif case == "equal values at the threshold":
        sims[7, sims[7].argsort()[0]] = threshold
    elif case == "nan":
        sims[7, 3] = float("nan")
    elif case == "padding":  # fewer finite values than k in one row
        sims[7, 10:] = float("-inf")
    assert speedups._preselects_in_float32(sims)

    calls = []
    original = speedups._largest_by_float32
    monkeypatch.setattr(speedups, "_largest_by_float32", lambda *a: calls.append(original(*a)) or calls[-1])
    shortfalls = _hardest_shortfalls(sims, k, 1e-6)
    assert (calls[0] is not None) == (case == "cosines")  # every other case falls back to the float64 partition
    if case == "nan":  # NaN sorts last in both numpy and torch: it is the row's "largest" value either way
        assert shortfalls[7, 0].isnan() and not shortfalls[[0, 8]].isnan().any()
        return
    expected = torch.rsub(sims.sort(dim=1, descending=True).values[:, :k], 1).clamp_min(1e-6)
    torch.testing.assert_close(shortfalls, expected, rtol=0, atol=0)
    if case == "cosines":
        assert _largest_by_float32(sims, k).shape == (40, k)


def test_degenerate_tail_falls_back_to_median():
    anchors, candidates = _views(2, 8)  # simclr with N = 2: 2 negatives per anchor, no regression possible
    loss, stats = weince_loss(anchors, candidates, temperature=0.5, geometry="simclr", return_stats=True)
    assert torch.isfinite(loss)
    assert torch.all(stats["delta_aic"] == 0) and torch.all(stats["beta_hat"] == 0)
    assert stats["rho0"] == stats["rho"].sort().values[1]  # lower median of 4 values
    weight, rho0 = mixing_weights(tail_statistics(torch.rand(3, 2, dtype=torch.float64)))
    assert weight.shape == (3,)


# --------------------------------------------------------------------------------- numerics (property tests)


@st.composite
def _awkward_batches(draw):
    n = draw(st.integers(2, 12))
    d = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    anchors = torch.randn(n, d, generator=generator)
    kind = draw(st.sampled_from(["duplicates", "identical", "zeros", "scaled", "random"]))
    if kind == "duplicates":
        anchors[n // 2 :] = anchors[: n - n // 2].clone()
    elif kind == "identical":
        anchors[:] = anchors[0]
    elif kind == "zeros":
        anchors[draw(st.integers(0, n - 1))] = 0
    elif kind == "scaled":
        anchors = anchors * draw(st.sampled_from([1e-3, 1e3]))
    candidates = anchors.clone() if draw(st.booleans()) else anchors + 0.01 * torch.randn(n, d, generator=generator)
    if kind == "zeros" and draw(st.booleans()):
        candidates[0] = 0
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    geometry = draw(st.sampled_from(["simcse", "simclr"]))
    gate = draw(st.sampled_from(["both", "rho", "aic"]))
    beta = draw(st.sampled_from(["estimated", 1.0]))
    return anchors.to(dtype), candidates.to(dtype), geometry, WeinceConfig(gate=gate, beta=beta)


@settings(max_examples=120, deadline=None)
@given(_awkward_batches())
def test_loss_and_gradients_stay_finite(batch):
    anchors, candidates, geometry, config = batch
    anchors.requires_grad_(True)
    candidates.requires_grad_(True)
    loss, stats = weince_loss(
        anchors, candidates, temperature=0.05, weince=config, geometry=geometry, return_stats=True
    )
    loss.backward()
    assert loss.dtype in (torch.float32, torch.float64)
    assert torch.isfinite(loss)
    assert torch.isfinite(anchors.grad).all() and torch.isfinite(candidates.grad).all()
    for key in ("mixing_weight", "delta_aic", "rho", "beta_hat", "beta"):
        assert torch.isfinite(stats[key]).all(), key
    assert ((stats["mixing_weight"] >= 0) & (stats["mixing_weight"] <= 1)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_and_autocast_use_float32(dtype):
    anchors, candidates = _views(32, 16, dtype=torch.float32)
    reference = weince_loss(anchors, candidates, temperature=0.05)
    half_anchors = anchors.to(dtype).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = weince_loss(half_anchors, candidates.to(dtype), temperature=0.05)
    loss.backward()
    assert loss.dtype == torch.float32
    assert half_anchors.grad.dtype == dtype and torch.isfinite(half_anchors.grad).all()
    # Only the rounding of the inputs differs: the computation itself ran in float32.
    assert abs(loss.item() - reference.item()) < 0.05 * abs(reference.item()) + 0.05
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cosine_similarity_matrix(anchors, candidates).dtype == torch.float32


def test_duplicate_sentences_in_a_batch_are_finite():
    anchors, candidates = _views(16, 8, dtype=torch.float32)
    anchors[1] = anchors[0]
    candidates[1] = candidates[0] = anchors[0]
    anchors.requires_grad_(True)
    loss, stats = weince_loss(anchors, candidates, temperature=0.05, return_stats=True)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(anchors.grad).all()
    assert stats["rho"][0] == pytest.approx(1e-6)
    assert stats["logits"].max() < 1 / 0.05 + 14.0  # -log(eps) ~ 13.8 bounds the shortfall logit


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(4, 6)), ValueError, "same embedding dimension"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(3, 8)), ValueError, "at least as many candidates"),
        (dict(anchors=torch.randn(1, 8), candidates=torch.randn(3, 8)), ValueError, "at least 2 anchors"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(4, 8), temperature=0.0), ValueError, "temperature"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(4, 8), temperature=-1), ValueError, "temperature"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(4, 8), geometry="moco"), ValueError, "geometry"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(6, 8), geometry="simclr"), ValueError, "two views"),
        (dict(anchors=torch.randn(4), candidates=torch.randn(4, 8)), ValueError, "2-D"),
        (dict(anchors=torch.randn(4, 8).numpy(), candidates=torch.randn(4, 8)), TypeError, "torch.Tensor"),
        (dict(anchors=torch.ones(4, 8, dtype=torch.long), candidates=torch.randn(4, 8)), TypeError, "floating"),
        (dict(anchors=torch.randn(4, 8), candidates=torch.randn(4, 8), temperature="0.05"), TypeError, "temperature"),
    ],
)
def test_bad_inputs_are_rejected_clearly(kwargs, error, message):
    kwargs.setdefault("temperature", 0.05)
    with pytest.raises(error, match=message):
        weince_loss(**kwargs)
    if "geometry" not in kwargs or kwargs["geometry"] != "moco":
        with pytest.raises(error, match=message):
            infonce_loss(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(gate="max"), "unknown gate"),
        (dict(beta=0.0), "beta must be > 0"),
        (dict(beta=-2), "beta must be > 0"),
        (dict(beta="fitted"), "beta must be 'estimated'"),
        (dict(quantile=1.5), "quantile"),
        (dict(eps=0), "eps"),
    ],
)
def test_bad_config_is_rejected_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WeinceConfig(**kwargs)


def test_config_must_be_a_weince_config():
    with pytest.raises(TypeError, match="WeinceConfig"):
        weince_loss(torch.randn(4, 8), torch.randn(4, 8), temperature=0.05, weince={"quantile": 0.2})


@pytest.mark.parametrize("loss_fn", [weince_loss, infonce_loss])
def test_non_finite_embeddings_are_named(loss_fn):
    anchors, candidates = torch.randn(8, 4), torch.randn(8, 4)
    candidates[3, 1] = float("nan")
    with pytest.raises(ValueError, match=r"candidates rows \[3\]"):
        loss_fn(anchors, candidates, temperature=0.05)
    anchors[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"anchors rows \[5\]"):
        loss_fn(anchors, candidates, temperature=0.05)


def test_float32_preselection_leaves_the_loss_bit_identical(monkeypatch):
    """A simclr batch wide enough for the float32 preselection gives the same loss, statistics and gradients, bit
    for bit, as the float64 partition."""
    from simcse_weince.weince import speedups

    # 320 x 320 similarities, 318 negatives per anchor
    anchors, candidates = _views(160, 32, seed=9, dtype=torch.float32)

    def run():
        a, c = anchors.clone().requires_grad_(True), candidates.clone().requires_grad_(True)
        loss, stats = weince_loss(a, c, temperature=0.1, geometry="simclr", return_stats=True)
        return loss, stats, torch.autograd.grad(loss, (a, c))

    found = []  # the preselection must have run (not fallen back), or the comparison below proves nothing
    original = speedups._largest_by_float32
    monkeypatch.setattr(speedups, "_largest_by_float32", lambda *a: found.append(original(*a)) or found[-1])
    loss, stats, grads = run()
    assert len(found) == 1 and found[0] is not None
    monkeypatch.setattr(speedups, "_FLOAT32_PRESELECTION_MIN_COLUMNS", 10**9)
    expected_loss, expected_stats, expected_grads = run()
    assert torch.equal(loss, expected_loss)
    for key in ("mixing_weight", "delta_aic", "rho", "beta_hat", "logits"):
        assert torch.equal(stats[key], expected_stats[key]), key
    assert all(torch.equal(g, e) for g, e in zip(grads, expected_grads))
