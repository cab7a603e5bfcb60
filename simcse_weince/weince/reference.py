"""WEINCE as the method writes it, in plain autograd: the readable reference of the loss.

This is the formula of the paper (``docs/method.md``; the comments below name its headings), read top to bottom:
cosine similarities, each anchor's tail of hardest negatives, its statistics and mixing weight λ_i (no gradient), the
blended logits, cross-entropy. Float64 throughout, one anchor at a time where
the method speaks of one anchor, no in-place operation and no hand-written gradient: autograd differentiates it.

:func:`~simcse_weince.weince.loss.weince_loss` computes the same loss fast (a closed-form backward, a numpy top-k,
float64 similarities only where the statistics need them: :mod:`simcse_weince.weince.speedups`), and
``tests/test_weince_bruteforce.py`` holds it to this function: loss, gradients, λ and every statistic.

Covered: both geometries, extra hard-negative candidates (simcse), every :class:`WeinceConfig` option, a fixed
``mixing_weight``, and our hardness weighting (``hardness_strength``, ``hardness_mode``; not the paper's). Not
covered: input checks, half-precision inputs (the reference always computes in float64), and the multi-direction
rows of :mod:`simcse_weince.weince.directions`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from simcse_weince.weince.config import WeinceConfig

__all__ = ["reference_weince_loss"]


def reference_weince_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    *,
    geometry: str = "simcse",
    temperature: float,
    weince: WeinceConfig | None = None,
    mixing_weight: float | torch.Tensor | None = None,
    hardness_strength: float = 0.0,
    hardness_mode: str = "in_batch_negatives",
):
    """The WEINCE loss and its statistics, as :func:`~simcse_weince.weince.loss.weince_loss` with ``return_stats``.

    Returns ``(loss, stats)``: the float64 scalar loss, and per anchor ``mixing_weight``, ``delta_aic``, ``rho``,
    ``beta_hat``, ``beta``, the scalar ``rho0`` and the ``logits`` (simcse: anchors x candidates; simclr: 2N x
    (2N-1), the positive first, then the negatives in row order).
    """
    weince = weince or WeinceConfig()
    # docs/method.md#notation-and-candidate-sets: similarities, and each anchor's positive and negatives
    if geometry == "simclr":  # every row of z = [u; v] is an anchor; its positive is its other view
        anchors = candidates = torch.cat([anchors, candidates])
    a, c = anchors.double(), candidates.double()
    sims = (a / a.norm(dim=1, keepdim=True)) @ (c / c.norm(dim=1, keepdim=True)).T
    num_anchors, num_candidates = sims.shape
    rows = torch.arange(num_anchors)
    if geometry == "simcse":
        positives, candidate_of = rows, torch.ones(num_anchors, num_candidates, dtype=torch.bool)
    else:
        positives, candidate_of = (rows + num_anchors // 2) % num_anchors, ~torch.eye(num_anchors, dtype=torch.bool)
    negative_of = candidate_of & (torch.arange(num_candidates) != positives[:, None])

    # docs/method.md#tail-statistics and docs/method.md#the-mixing-weight: without gradient
    tails = [_anchor_tail(sims[i][negative_of[i]].detach(), weince) for i in range(num_anchors)]
    rho, delta_aic, beta_hat = torch.tensor([tail[:3] for tail in tails], dtype=torch.float64).T
    degenerate = any(tail[3] for tail in tails)
    rho0 = rho.sort().values[(num_anchors - 1) // 2 if degenerate else round(weince.quantile * (num_anchors - 1))]
    lambda_rho = torch.sigmoid(weince.kappa_rho * (rho0.log() - rho.log()))
    lambda_aic = torch.sigmoid(weince.kappa_aic * (delta_aic - weince.aic_margin))
    weight = {"both": lambda_rho * lambda_aic, "rho": lambda_rho, "aic": lambda_aic}[weince.gate]
    if mixing_weight is not None:
        weight = torch.as_tensor(mixing_weight, dtype=torch.float64).expand(num_anchors)
    if weince.beta == "estimated":
        beta = beta_hat.clamp(weince.beta_min, weince.beta_max)
    else:
        beta = torch.full((num_anchors,), float(weince.beta), dtype=torch.float64)

    # docs/method.md#the-blended-logit (gradients flow through s in both terms), then InfoNCE's cross-entropy
    lam, beta_col = weight[:, None], beta[:, None]
    shortfall_logit = -torch.log(1 - torch.clamp(sims, max=1 - weince.eps))
    logits = (1 - lam) * sims / temperature + lam * beta_col * shortfall_logit
    if hardness_strength:  # ours (docs/experiments.md, Studies 2-3): α · stop_grad(s) on the chosen negatives
        chosen = _hardness_columns(hardness_mode, num_anchors, num_candidates) if geometry == "simcse" else negative_of
        logits = logits + hardness_strength * sims.detach() * chosen
    loss = F.cross_entropy(logits.masked_fill(~candidate_of, -math.inf), positives)

    if geometry == "simclr":  # the documented layout of the logits: the positive first, then the negatives in order
        logits = torch.cat([logits[rows, positives][:, None], logits[negative_of].view(num_anchors, -1)], dim=1)
    stats = dict(mixing_weight=weight, delta_aic=delta_aic, rho=rho, beta_hat=beta_hat, beta=beta, rho0=rho0)
    return loss, {**stats, "logits": logits.detach()}


def _anchor_tail(negatives: torch.Tensor, weince: WeinceConfig):
    """``(rho, delta_aic, beta_hat, degenerate)`` of one anchor's negative similarities
    (docs/method.md#tail-statistics)."""
    num_negatives = negatives.numel()
    k = max(weince.min_tail_points, round(weince.tail_fraction * num_negatives))
    k = min(k, num_negatives)
    k = max(10, k)
    k = min(k, num_negatives)
    shortfalls = (1 - negatives.sort(descending=True).values[:k]).clamp_min(weince.eps)  # ascending
    burn_in = max(1, k // 20)
    n = k - burn_in
    if n < 2:  # the authors' fallback for degenerate tails
        return float(shortfalls[0]), 0.0, 0.0, True
    plotting_positions = torch.arange(burn_in + 1, k + 1, dtype=torch.float64) / (k + 1)
    x = shortfalls[burn_in:].log()
    weibull_slope, weibull_sse = _least_squares(x, plotting_positions.log())
    gumbel_slope, gumbel_sse = _least_squares(x, (-plotting_positions.log()).log())
    weibull_sse += 1e6 if weibull_slope <= 0 else 0.0  # a wrong-signed line does not describe the tail
    gumbel_sse += 1e6 if gumbel_slope >= 0 else 0.0
    aic_weibull, aic_gumbel = (n * math.log(sse / n) + 4 for sse in (weibull_sse, gumbel_sse))
    return float(shortfalls[0]), aic_gumbel - aic_weibull, max(weibull_slope, 0.0), False


def _least_squares(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Slope and SSE (clamped below at 1e-12) of the least-squares line of y on x
    (docs/method.md#step-4-the-weibull-and-gumbel-lines)."""
    x_bar, y_bar = x.mean(), y.mean()
    slope = ((x - x_bar) * (y - y_bar)).sum() / ((x - x_bar) ** 2).sum().clamp_min(1e-12)
    sse = ((y - (y_bar + slope * (x - x_bar))) ** 2).sum()
    return float(slope), max(float(sse), 1e-12)


def _hardness_columns(hardness_mode: str, num_anchors: int, num_candidates: int) -> torch.Tensor:
    """The simcse columns each ``hardness_mode`` weights; anchor i's own columns are i, i + A, i + 2A, ..."""
    own = torch.arange(num_candidates)[None, :] % num_anchors == torch.arange(num_anchors)[:, None]
    is_positive = torch.arange(num_candidates)[None, :] == torch.arange(num_anchors)[:, None]
    return {"in_batch_negatives": ~own, "hard_negatives": own & ~is_positive, "all_negatives": ~is_positive}[
        hardness_mode
    ]
