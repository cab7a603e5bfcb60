"""An independent brute-force reference for the ``simcse`` geometry, written from docs/WEINCE.md alone.

One plain loop over anchors: each anchor's negatives are listed, sorted and regressed with Python floats (spec
sections 4-5), then its logits and cross-entropy are built with autograd (section 3), so the gradients of the
reference come from autograd through the loop, not from the core's closed-form backward. The authors' reference
cases (test_weince_reference.py) cover the simclr geometry with beta = 1; this file covers what they do not: the
simcse geometry with estimated beta-hat, extra hard-negative columns, lambda well above 0, each gate.
"""

from __future__ import annotations

import math

import pytest
import torch

from simcse_weince import WeinceConfig, weince_loss

pytestmark = pytest.mark.usefixtures("one_thread")


def _line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and SSE (clamped below at 1e-12), spec section 4 step 4."""
    n = len(xs)
    x_bar, y_bar = sum(xs) / n, sum(ys) / n
    sxx = sum((x - x_bar) ** 2 for x in xs)
    slope = sum((x - x_bar) * (y - y_bar) for x, y in zip(xs, ys)) / max(sxx, 1e-12)
    sse = sum((y - (y_bar + slope * (x - x_bar))) ** 2 for x, y in zip(xs, ys))
    return slope, max(sse, 1e-12)


def _anchor_tail(negatives: list[float], config: WeinceConfig) -> dict:
    """rho, Delta-AIC, beta-hat and the degenerate flag of one anchor from its negative similarities."""
    num_negatives = len(negatives)
    k = max(config.min_tail_points, round(config.tail_fraction * num_negatives))
    k = min(k, num_negatives)
    k = max(10, k)
    k = min(k, num_negatives)
    hardest = sorted(negatives, reverse=True)[:k]
    shortfalls = [max(1.0 - s, config.eps) for s in hardest]  # ascending
    rho = shortfalls[0]
    burn_in = max(1, k // 20)
    n = k - burn_in
    if n < 2:
        return dict(rho=rho, delta_aic=0.0, beta_hat=0.0, degenerate=True)
    ranks = range(burn_in + 1, k + 1)
    xs = [math.log(shortfalls[r - 1]) for r in ranks]
    weibull_y = [math.log(r / (k + 1)) for r in ranks]
    gumbel_y = [math.log(-math.log(r / (k + 1))) for r in ranks]
    weibull_slope, weibull_sse = _line_fit(xs, weibull_y)
    gumbel_slope, gumbel_sse = _line_fit(xs, gumbel_y)
    if weibull_slope <= 0:
        weibull_sse += 1e6
    if gumbel_slope >= 0:
        gumbel_sse += 1e6
    aic_weibull = n * math.log(weibull_sse / n) + 4
    aic_gumbel = n * math.log(gumbel_sse / n) + 4
    return dict(rho=rho, delta_aic=aic_gumbel - aic_weibull, beta_hat=max(weibull_slope, 0.0), degenerate=False)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def reference_simcse(anchors, candidates, temperature, config: WeinceConfig):
    """Loss, per-anchor lambda / beta / rho / Delta-AIC / beta-hat, rho_0 and the logits, by a loop over anchors."""
    num_anchors = anchors.shape[0]
    similarity_rows = []
    for i in range(num_anchors):
        row = (candidates @ anchors[i]) / (candidates.norm(dim=1) * anchors[i].norm())
        similarity_rows.append(row)
    tails = []
    for i, row in enumerate(similarity_rows):
        negatives = [float(s) for j, s in enumerate(row.detach()) if j != i]  # every candidate but the positive
        tails.append(_anchor_tail(negatives, config))
    rhos = sorted(t["rho"] for t in tails)
    if any(t["degenerate"] for t in tails):
        rho0 = rhos[(num_anchors - 1) // 2]
    else:
        rho0 = rhos[round(config.quantile * (num_anchors - 1))]
    losses, logit_rows, lambdas, betas = [], [], [], []
    for i, row in enumerate(similarity_rows):
        tail = tails[i]
        lambda_rho = _sigmoid(config.kappa_rho * (math.log(rho0) - math.log(tail["rho"])))
        lambda_aic = _sigmoid(config.kappa_aic * (tail["delta_aic"] - config.aic_margin))
        mixing = {"both": lambda_rho * lambda_aic, "rho": lambda_rho, "aic": lambda_aic}[config.gate]
        if config.beta == "estimated":
            beta = min(max(tail["beta_hat"], config.beta_min), config.beta_max)
        else:
            beta = float(config.beta)
        shortfall_logit = -torch.log(1 - torch.clamp(row, max=1 - config.eps))
        logits = (1 - mixing) * row / temperature + mixing * beta * shortfall_logit
        losses.append(torch.logsumexp(logits, dim=0) - logits[i])
        logit_rows.append(logits)
        lambdas.append(mixing)
        betas.append(beta)
    loss = torch.stack(losses).mean()
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64)  # noqa: E731
    return loss, {
        "mixing_weight": as_tensor(lambdas),
        "beta": as_tensor(betas),
        "rho": as_tensor([t["rho"] for t in tails]),
        "delta_aic": as_tensor([t["delta_aic"] for t in tails]),
        "beta_hat": as_tensor([t["beta_hat"] for t in tails]),
        "rho0": rho0,
        "logits": torch.stack(logit_rows).detach(),
    }


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
def test_core_equals_the_loop_reference(case):
    kind, n, d, extra, seed, temperature, config = case
    anchors, candidates = _case(kind, n, d, extra, seed)
    core_anchors = anchors.clone().requires_grad_(True)
    core_candidates = candidates.clone().requires_grad_(True)
    loss, stats = weince_loss(core_anchors, core_candidates, temperature=temperature, weince=config, return_stats=True)
    loss.backward()
    ref_anchors = anchors.clone().requires_grad_(True)
    ref_candidates = candidates.clone().requires_grad_(True)
    expected_loss, expected = reference_simcse(ref_anchors, ref_candidates, temperature, config)
    expected_loss.backward()

    tol = dict(rtol=0, atol=1e-9)
    assert abs(loss.item() - expected_loss.item()) <= 1e-9
    for name in ("mixing_weight", "beta", "rho", "delta_aic", "beta_hat", "logits"):
        torch.testing.assert_close(stats[name], expected[name], **tol, msg=lambda m, name=name: f"{name}: {m}")
    assert abs(stats["rho0"].item() - expected["rho0"]) <= 1e-12
    torch.testing.assert_close(core_anchors.grad, ref_anchors.grad, **tol)
    torch.testing.assert_close(core_candidates.grad, ref_candidates.grad, **tol)


def test_the_cases_exercise_the_correction():
    """The comparison above is only a check of WEINCE if lambda is far from 0 and beta-hat varies in many cases."""
    strong = 0
    for kind, n, d, extra, seed, temperature, config in CASES:
        anchors, candidates = _case(kind, n, d, extra, seed)
        _, expected = reference_simcse(anchors, candidates, temperature, config)
        strong += bool(expected["mixing_weight"].max() > 0.5 and expected["beta"].std() > 0.1)
    assert strong >= 6
