"""WEINCE's tail statistics and mixing weight: tensors in, detached tensors out.

The method: docs/method.md#tail-statistics and docs/method.md#the-mixing-weight.

Per anchor, the hardest negatives' shortfalls ``1 - s`` are regressed on two link lines (Weibull: ``log F``;
Gumbel: ``log(-log F)``); their AIC difference, the Weibull slope and how close the hardest negative comes to the
endpoint set the mixing weight lambda_i of :mod:`simcse_weince.weince`. No gradient flows through anything here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from simcse_weince.deprecation import renamed_value
from simcse_weince.weince.config import STATISTIC_KEYS, WeinceConfig
from simcse_weince.weince.speedups import _hardest_shortfalls

__all__ = [
    "TailStatistics",
    "tail_statistics",
    "mixing_weights",
    "statistics_dtype",
    "shortfall_exponent",
    "STATISTIC_KEYS",
]

# what a call without a WeinceConfig uses: built (and validated) once, not on every call; only read here
_DEFAULT_CONFIG = WeinceConfig()


@dataclass
class TailStatistics:
    """Per-anchor tail statistics (docs/method.md#tail-statistics); all detached, float32 or float64."""

    rho: torch.Tensor  # shortfall 1 - s of the hardest negative, floored at eps
    delta_aic: torch.Tensor  # AIC(Gumbel) - AIC(Weibull); positive favours the Weibull line
    beta_hat: torch.Tensor  # Weibull slope of the tail, clamped below at 0
    tail_points: torch.Tensor  # n, the number of points in the regressions
    any_degenerate: bool  # some anchor had < 2 tail points after burn-in: rho_0 falls back to the median


def statistics_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs, float32 otherwise.

    Tail statistics and WEINCE logits never run in half precision: 1 - s loses every digit near 1
    (docs/method.md#precision).
    """
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


# ----------------------------------------------------------------------------------- tail statistics


def _tail_size(num_negatives: int, weince: WeinceConfig) -> int:
    """k, the number of hardest negatives that form an anchor's tail (docs/method.md#step-1-the-tail-size-k)."""
    k = max(int(weince.min_tail_points), round(weince.tail_fraction * num_negatives))
    k = min(k, num_negatives)
    k = max(10, k)
    return min(k, num_negatives)


def _burn_in(tail_size: int) -> int:
    """How many of the hardest points the regressions skip, the top 5%, at least one
    (docs/method.md#step-3-plotting-positions-and-the-skipped-top-points)."""
    return max(1, tail_size // 20)


_PLOTTING_POSITIONS_CACHE: dict = {}


def _link_targets(plotting_positions: torch.Tensor) -> torch.Tensor:
    """The two regression targets of the tail, stacked on dim -2: the Weibull line ``log F`` and the Gumbel line
    ``log(-log F)`` with its sign flipped, so that a tail of either type has a positive slope
    (docs/method.md#step-4-the-weibull-and-gumbel-lines)."""
    log_f = plotting_positions.log()
    return torch.stack([log_f, -(-log_f).log()], dim=-2)


def _centred_link_targets(k: int, burn_in: int, dtype, device) -> torch.Tensor:
    """:func:`_link_targets` of the tail ranks, centred, as a 2 x n tensor.

    They depend only on the tail size, so they are computed once per (k, dtype, device).
    """
    key = (k, burn_in, dtype, device)
    targets = _PLOTTING_POSITIONS_CACHE.get(key)
    if targets is None:
        ranks = torch.arange(burn_in + 1, k + 1, dtype=torch.float64)
        targets = _link_targets(ranks / (k + 1))
        targets = (targets - targets.mean(dim=1, keepdim=True)).to(dtype=dtype, device=device)
        _PLOTTING_POSITIONS_CACHE[key] = targets
    return targets


def tail_statistics(
    negative_similarities: torch.Tensor,
    weince: WeinceConfig | None = None,
    *,
    num_negatives: int | None = None,
    overwrite: bool = False,
    config: WeinceConfig | None = None,
) -> TailStatistics:
    """Per-anchor tail statistics of the hardest negatives (docs/method.md#tail-statistics), without gradient.

    Args:
        negative_similarities: ``A x K`` cosine similarities of each anchor to its negatives. Entries that
            are not negatives (the positive, the anchor itself, padding) must be ``-inf``: they are left out.
        weince: a :class:`WeinceConfig` (tail_fraction, min_tail_points and eps are used; ``config=`` is its old,
            deprecated name).
        num_negatives: when every row holds exactly this many finite entries, say so: the statistics then
            take the fast path with no per-row counting (and no device synchronisation).
        overwrite: the caller will not read ``negative_similarities`` again (float32/float64 only), so the top-k may
            reorder it in place instead of copying it.

    Returns:
        :class:`TailStatistics` with ``rho``, ``delta_aic``, ``beta_hat`` (length A) in float32/float64.
    """
    if config is not None:  # its old name
        weince = renamed_value(config, weince, "config", "weince", "tail_statistics")
    weince = weince or _DEFAULT_CONFIG
    if negative_similarities.dim() != 2 or negative_similarities.shape[1] < 1:
        raise ValueError(
            f"negative_similarities must be A x K with K >= 1, got shape {tuple(negative_similarities.shape)}"
        )
    sims = negative_similarities.detach()
    sims = sims.to(statistics_dtype(sims))
    if num_negatives is None:
        counts = torch.isfinite(sims).sum(dim=1).tolist()
        if min(counts) < 1:
            raise ValueError("every anchor needs at least one finite negative similarity")
        if len(set(counts)) > 1:
            return _masked_tail_statistics(sims, counts, weince)
        num_negatives = counts[0]
    return _uniform_tail_statistics(sims, _tail_size(num_negatives, weince), weince.eps, overwrite)


def _fit_lines(log_shortfalls: torch.Tensor, centred_targets: torch.Tensor, weights=None):
    """Least-squares lines of both targets on x = log shortfall, per anchor; returns slopes and SSEs (A x 2).

    ``log_shortfalls`` is A x n; ``centred_targets`` is 2 x n (or A x 2 x n, already centred per anchor
    under ``weights``). With weights (A x n of 0/1), only weighted points count.
    """
    if weights is None:
        x_centred = log_shortfalls.sub_(log_shortfalls.mean(dim=1, keepdim=True))
        sxx = torch.linalg.vecdot(x_centred, x_centred).clamp_min_(1e-12)  # A
        slopes = torch.mm(x_centred, centred_targets.mT).div_(sxx.unsqueeze(1))  # A x 2
        residuals = torch.addcmul(centred_targets, slopes.unsqueeze(2), x_centred.unsqueeze(1), value=-1)
    else:
        counts = weights.sum(dim=1, keepdim=True).clamp_min(1)
        x_centred = (log_shortfalls - (log_shortfalls * weights).sum(dim=1, keepdim=True) / counts) * weights
        sxx = (x_centred * x_centred).sum(dim=1).clamp_min(1e-12)
        slopes = (centred_targets * x_centred[:, None, :]).sum(dim=2) / sxx[:, None]
        residuals = (centred_targets - slopes[:, :, None] * x_centred[:, None, :]) * weights[:, None, :]
    return slopes, torch.linalg.vecdot(residuals, residuals).clamp_min_(1e-12)


def _aic_statistics(slopes, sse, n):
    """Delta-AIC and beta_hat from the two fits (docs/method.md#step-5-delta-aic-and-the-tail-index). ``n`` is a
    scalar or length A.

    ``AIC = n log(SSE / n) + 4`` for both lines, so ``Delta-AIC = AIC_Gumbel - AIC_Weibull = n log(SSE_G / SSE_W)``.
    A line with the wrong-signed slope does not describe the tail: its SSE gets the authors' 1e6 penalty.
    """
    log_sse = sse.add_(slopes <= 0, alpha=1e6).log_()
    return (log_sse.select(1, 1) - log_sse.select(1, 0)).mul_(n), slopes.select(1, 0).clamp_min(0)


def _uniform_tail_statistics(sims: torch.Tensor, k: int, eps: float, overwrite: bool = False) -> TailStatistics:
    shortfalls = _hardest_shortfalls(sims, k, eps, overwrite)
    rho = shortfalls.select(1, 0)
    burn_in = _burn_in(k)
    n = k - burn_in
    if n < 2:  # the authors' fallback for degenerate tails (docs/method.md#step-6-degenerate-tails)
        zeros = torch.zeros_like(rho)
        return TailStatistics(rho, zeros, zeros.clone(), torch.full_like(rho, max(n, 0)), True)
    targets = _centred_link_targets(k, burn_in, sims.dtype, sims.device)
    slopes, sse = _fit_lines(shortfalls.narrow(1, burn_in, n).log(), targets)
    delta_aic, beta_hat = _aic_statistics(slopes, sse, float(n))
    return TailStatistics(rho, delta_aic, beta_hat, torch.full_like(rho, n), False)


def _masked_tail_statistics(sims: torch.Tensor, counts: list[int], weince: WeinceConfig):
    """Tail statistics when anchors have different numbers of valid negatives (padding excluded)."""
    sizes = [_tail_size(c, weince) for c in counts]
    tail_sizes = torch.tensor(sizes, device=sims.device)
    k_max = max(sizes)
    hardest_shortfalls = _hardest_shortfalls(sims, k_max, weince.eps)
    ranks = torch.arange(1, k_max + 1, device=sims.device, dtype=sims.dtype)[None, :]  # 1 x k_max
    k = tail_sizes.to(sims.dtype)[:, None]
    burn_in = torch.tensor([_burn_in(k) for k in sizes], device=sims.device, dtype=sims.dtype)[:, None]
    weights = ((ranks > burn_in) & (ranks <= k)).to(sims.dtype)
    n = weights.sum(dim=1)
    shortfalls = torch.where(ranks <= k, hardest_shortfalls, torch.ones_like(hardest_shortfalls))
    rho = shortfalls[:, 0]
    plotting_positions = torch.where(ranks <= k, ranks / (k + 1), torch.full_like(ranks * k, 0.5))
    targets = _link_targets(plotting_positions)  # A x 2 x k_max
    w = weights[:, None, :]
    targets = (targets - (targets * w).sum(dim=2, keepdim=True) / n.clamp_min(1)[:, None, None]) * w
    slopes, sse = _fit_lines(shortfalls.log(), targets, weights)
    delta_aic, beta_hat = _aic_statistics(slopes, sse, n.clamp_min(1))
    degenerate = n < 2
    delta_aic = delta_aic.masked_fill(degenerate, 0.0)
    beta_hat = beta_hat.masked_fill(degenerate, 0.0)
    return TailStatistics(rho, delta_aic, beta_hat, n, bool(degenerate.any()))


def mixing_weights(stats: TailStatistics, weince: WeinceConfig | None = None, *, config: WeinceConfig | None = None):
    """Mixing weight lambda_i in [0, 1] per anchor and the batch reference rho_0 (docs/method.md#the-mixing-weight),
    under ``weince`` (``config=`` is its old, deprecated name).

    Returns ``(mixing_weight, rho0)``.
    """
    if config is not None:  # its old name
        weince = renamed_value(config, weince, "config", "weince", "mixing_weights")
    weince = weince or _DEFAULT_CONFIG
    rho = stats.rho
    # the authors' fallback for degenerate tails is the lower median
    rank = (rho.numel() - 1) // 2 if stats.any_degenerate else round(weince.quantile * (rho.numel() - 1))
    rho0 = rho.kthvalue(rank + 1).values
    lambda_rho = torch.div(rho0, rho).log_().mul_(weince.kappa_rho).sigmoid_()  # sigmoid(kappa log(rho0 / rho))
    if weince.gate == "rho":
        return lambda_rho, rho0
    lambda_aic = stats.delta_aic.sub(weince.aic_margin).mul_(weince.kappa_aic).sigmoid_()
    if weince.gate == "aic":
        return lambda_aic, rho0
    return lambda_rho.mul_(lambda_aic), rho0


def shortfall_exponent(stats: TailStatistics, weince: WeinceConfig) -> torch.Tensor:
    """beta_i of the shortfall logit: the clamped Weibull slope (the paper) or the WeinceConfig's constant
    (docs/method.md#the-shortfall-exponent)."""
    if weince.beta == "estimated":
        return stats.beta_hat.clamp(weince.beta_min, weince.beta_max)
    return torch.full_like(stats.beta_hat, float(weince.beta))
