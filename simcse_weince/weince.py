"""The WEINCE loss: a pure functional core (tensors in, tensors out, no model objects).

WEINCE blends, per anchor i, the InfoNCE logit ``s_ij / tau`` with the endpoint-shortfall logit
``-beta_i * log(1 - s_ij)``::

    logit_ij = (1 - lambda_i) * s_ij / tau + lambda_i * beta_i * (-log(1 - min(s_ij, 1 - eps)))

``lambda_i`` (the *mixing weight*) and ``beta_i`` are stop-gradient statistics of anchor i's hardest negatives
(how close they come to the endpoint 1, and whether a Weibull line fits their tail better than a Gumbel
line). ``lambda = 0`` is exactly InfoNCE. The normative spec is ``docs/WEINCE.md`` of the project's shared
folder; section numbers below refer to it.

Everything here is vectorised over anchors (one top-k and two closed-form regressions per batch) and runs in
float32 or float64 even when the inputs are half precision or an autocast region is active.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "WeinceConfig",
    "TailStatistics",
    "weince_loss",
    "infonce_loss",
    "cosine_similarity_matrix",
    "tail_statistics",
    "mixing_weights",
    "summarize_statistics",
    "weince_logits",
    "GEOMETRIES",
    "GATES",
]

GEOMETRIES = ("simcse", "simclr")
GATES = ("both", "rho", "aic")


@dataclass
class WeinceConfig:
    """Hyper-parameters of the WEINCE mixing weight (spec sections 3-5). No trainable parameters.

    Args:
        quantile: q, the batch quantile of the hardness rho_i that sets the reference rho_0.
        aic_margin: m, the Delta-AIC (Gumbel minus Weibull) at which the AIC gate is one half.
        kappa_rho: slope of the hardness sigmoid.
        kappa_aic: slope of the Delta-AIC sigmoid.
        tail_fraction: share of each anchor's negatives that form its tail.
        min_tail_points: at least this many tail points (when the anchor has that many negatives).
        beta: ``"estimated"`` (the paper: per-anchor Weibull slope, clamped to [beta_min, beta_max]) or a
            positive float (``1.0`` is the authors' released code).
        beta_min, beta_max: clamp of the estimated beta.
        gate: ``"both"`` (lambda = lambda_rho * lambda_aic), ``"rho"`` or ``"aic"``.
        eps: shortfalls are floored at eps, so a negative at cosine 1 gives ``-log(eps)`` and not inf.
    """

    quantile: float = 0.2
    aic_margin: float = 2.0
    kappa_rho: float = 10.0
    kappa_aic: float = 1.0
    tail_fraction: float = 0.10
    min_tail_points: int = 32
    beta: float | Literal["estimated"] = "estimated"
    beta_min: float = 0.5
    beta_max: float = 16.0
    gate: Literal["both", "rho", "aic"] = "both"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if isinstance(self.beta, str):
            if self.beta != "estimated":
                raise ValueError(f"beta must be 'estimated' or a positive number, got {self.beta!r}")
        elif isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)):
            raise TypeError(f"beta must be 'estimated' or a positive number, got {type(self.beta).__name__}")
        elif not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"beta must be > 0 (or 'estimated'), got {self.beta}")
        if self.gate not in GATES:
            raise ValueError(f"unknown gate {self.gate!r}; expected one of {GATES}")
        if not 0.0 <= self.quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {self.quantile}")
        if not 0.0 < self.tail_fraction <= 1.0:
            raise ValueError(f"tail_fraction must be in (0, 1], got {self.tail_fraction}")
        if int(self.min_tail_points) != self.min_tail_points or self.min_tail_points < 1:
            raise ValueError(f"min_tail_points must be a positive integer, got {self.min_tail_points}")
        if not 0.0 < self.eps < 1.0:
            raise ValueError(f"eps must be in (0, 1), got {self.eps}")
        if not 0.0 < self.beta_min <= self.beta_max:
            raise ValueError(f"need 0 < beta_min <= beta_max, got {self.beta_min}, {self.beta_max}")
        for name in ("kappa_rho", "kappa_aic", "aic_margin"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")

    @classmethod
    def reference(cls, **overrides) -> WeinceConfig:
        """The authors' released ``tlambda_select`` path: a fixed shortfall exponent beta = 1."""
        return cls(**{"beta": 1.0, **overrides})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TailStatistics:
    """Per-anchor tail statistics (spec section 4); all detached, float32 or float64."""

    rho: torch.Tensor  # shortfall 1 - s of the hardest negative, floored at eps
    delta_aic: torch.Tensor  # AIC(Gumbel) - AIC(Weibull); positive favours the Weibull line
    beta_hat: torch.Tensor  # Weibull slope of the tail, clamped below at 0
    tail_points: torch.Tensor  # n, the number of points in the regressions
    any_degenerate: bool  # some anchor had < 2 tail points after burn-in: rho_0 falls back to the median


# ----------------------------------------------------------------------------------------------- helpers


def _statistics_dtype(*tensors: torch.Tensor) -> torch.dtype:
    # Tail statistics and WEINCE logits never run in half precision: 1 - s loses every digit near 1.
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _directions(x: torch.Tensor):
    """Unit rows and inverse norms; a zero row stays zero with inverse norm 0, so it gets a zero gradient (it has
    no direction; unmasked, its gradient would be ~1/tiny, which overflows when cast back to fp16)."""
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    tiny = torch.finfo(x.dtype).tiny ** 0.5
    inv_norms = (norms > tiny) / norms.clamp_min(tiny)  # clamped, so the backward through 1/norm stays finite
    return x * inv_norms, inv_norms


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return _directions(x)[0]


def cosine_similarity_matrix(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``anchors x candidates`` in float32 (float64 for float64 inputs), autocast off."""
    dtype = _statistics_dtype(anchors, candidates)
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        return _normalize(anchors.to(dtype)) @ _normalize(candidates.to(dtype)).T


def _validate_embeddings(anchors, candidates, geometry: str, temperature: float) -> None:
    for name, tensor in (("anchors", anchors), ("candidates", candidates)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor (batch x dim), got shape {tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; expected one of {GEOMETRIES}")
    if isinstance(temperature, torch.Tensor):
        if temperature.numel() != 1:
            raise ValueError("temperature must be a scalar")
        temperature = float(temperature)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a positive number, got {type(temperature).__name__}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be > 0, got {temperature}")
    num_anchors, dim = anchors.shape
    num_candidates, candidate_dim = candidates.shape
    if dim != candidate_dim:
        raise ValueError(
            f"anchors and candidates must have the same embedding dimension, got {dim} and {candidate_dim}"
        )
    if anchors.device != candidates.device:
        raise ValueError(f"anchors are on {anchors.device} but candidates on {candidates.device}")
    if num_anchors < 2:
        raise ValueError(f"need at least 2 anchors (a contrastive batch), got {num_anchors}")
    if geometry == "simcse" and num_candidates < num_anchors:
        raise ValueError(
            f"simcse geometry needs at least as many candidates as anchors (candidate i is the positive of "
            f"anchor i), got {num_candidates} candidates for {num_anchors} anchors"
        )
    if geometry == "simclr" and num_candidates != num_anchors:
        raise ValueError(
            f"simclr geometry needs two views of the same items: anchors and candidates must both be N x d, "
            f"got {tuple(anchors.shape)} and {tuple(candidates.shape)}"
        )


def _raise_if_not_finite(loss: torch.Tensor, anchors: torch.Tensor, candidates: torch.Tensor) -> None:
    """Name the culprit when the loss is not finite.

    On the CPU the check is free. On an accelerator it would force a device synchronisation on every step,
    so there it is left to whoever reads the loss (the sentence-transformers adapter and our trainer check
    when they log it).
    """
    if loss.device.type != "cpu" or torch.isfinite(loss).item():
        return
    raise_non_finite(anchors, candidates)


def raise_non_finite(anchors: torch.Tensor, candidates: torch.Tensor) -> None:
    """Raise a ValueError saying which embeddings hold NaN/inf (called once a loss came out non-finite)."""
    problems = []
    for name, tensor in (("anchors", anchors), ("candidates", candidates)):
        bad_rows = (~torch.isfinite(tensor.detach())).any(dim=-1)
        if bad_rows.any():
            rows = bad_rows.nonzero().flatten().tolist()
            shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
            problems.append(f"{name} rows [{shown}] ({len(rows)} of {tensor.shape[0]})")
    if problems:
        raise ValueError(
            "the embeddings contain NaN or inf values: " + "; ".join(problems)
            + ". Check the encoder (e.g. fp16 overflow, a diverged learning rate)."
        )
    raise ValueError("the contrastive loss is not finite although the embeddings are; please report this.")


# ----------------------------------------------------------------------------------- tail statistics


def _tail_size(num_negatives: int, config: WeinceConfig) -> int:
    k = max(int(config.min_tail_points), round(config.tail_fraction * num_negatives))
    k = min(k, num_negatives)
    k = max(10, k)
    return min(k, num_negatives)


_PLOTTING_POSITIONS_CACHE: dict = {}


def _centred_link_targets(k: int, burn_in: int, dtype, device) -> torch.Tensor:
    """The two regression targets (Weibull ``log F``, Gumbel ``log(-log F)``), centred, as a 2 x n tensor.

    They depend only on the tail size, so they are computed once per (k, dtype, device).
    """
    key = (k, burn_in, dtype, device)
    targets = _PLOTTING_POSITIONS_CACHE.get(key)
    if targets is None:
        ranks = torch.arange(burn_in + 1, k + 1, dtype=torch.float64)
        plotting_positions = ranks / (k + 1)
        weibull = plotting_positions.log()
        gumbel = (-plotting_positions.log()).log()
        targets = torch.stack([weibull - weibull.mean(), gumbel - gumbel.mean()]).to(dtype=dtype, device=device)
        _PLOTTING_POSITIONS_CACHE[key] = targets
    return targets


def tail_statistics(
    negative_similarities: torch.Tensor,
    config: WeinceConfig | None = None,
    *,
    num_negatives: int | None = None,
) -> TailStatistics:
    """Per-anchor tail statistics of the hardest negatives (spec section 4), without gradient.

    Args:
        negative_similarities: ``A x K`` cosine similarities of each anchor to its negatives. Entries that
            are not negatives (the positive, the anchor itself, padding) must be ``-inf``: they are left out.
        config: a :class:`WeinceConfig` (tail_fraction, min_tail_points and eps are used).
        num_negatives: when every row holds exactly this many finite entries, say so: the statistics then
            take the fast path with no per-row counting (and no device synchronisation).

    Returns:
        :class:`TailStatistics` with ``rho``, ``delta_aic``, ``beta_hat`` (length A) in float32/float64.
    """
    config = config or WeinceConfig()
    if negative_similarities.dim() != 2 or negative_similarities.shape[1] < 1:
        raise ValueError(
            f"negative_similarities must be A x K with K >= 1, got shape {tuple(negative_similarities.shape)}"
        )
    sims = negative_similarities.detach()
    sims = sims.to(_statistics_dtype(sims))
    if num_negatives is None:
        counts = torch.isfinite(sims).sum(dim=1).tolist()
        if min(counts) < 1:
            raise ValueError("every anchor needs at least one finite negative similarity")
        if len(set(counts)) > 1:
            return _masked_tail_statistics(sims, counts, config)
        num_negatives = counts[0]
    return _uniform_tail_statistics(sims, _tail_size(num_negatives, config), config.eps)


def _fit_lines(log_shortfalls: torch.Tensor, centred_targets: torch.Tensor, weights=None):
    """Least-squares lines of both targets on x = log shortfall, per anchor; returns slopes and SSEs (A x 2).

    ``log_shortfalls`` is A x n; ``centred_targets`` is 2 x n (or A x 2 x n, already centred per anchor
    under ``weights``). With weights (A x n of 0/1), only weighted points count.
    """
    if weights is None:
        x_centred = log_shortfalls - log_shortfalls.mean(dim=1, keepdim=True)
        sxx = (x_centred * x_centred).sum(dim=1).clamp_min(1e-12)  # A
        slopes = (x_centred @ centred_targets.T) / sxx[:, None]  # A x 2
        residuals = centred_targets[None] - slopes[:, :, None] * x_centred[:, None, :]  # A x 2 x n
        sse = (residuals * residuals).sum(dim=2)
    else:
        counts = weights.sum(dim=1, keepdim=True).clamp_min(1)
        x_centred = (log_shortfalls - (log_shortfalls * weights).sum(dim=1, keepdim=True) / counts) * weights
        sxx = (x_centred * x_centred).sum(dim=1).clamp_min(1e-12)
        slopes = (centred_targets * x_centred[:, None, :]).sum(dim=2) / sxx[:, None]
        residuals = (centred_targets - slopes[:, :, None] * x_centred[:, None, :]) * weights[:, None, :]
        sse = (residuals * residuals).sum(dim=2)
    return slopes, sse.clamp_min(1e-12)


def _aic_statistics(slopes, sse, n):
    """Delta-AIC and beta_hat from the two fits (spec section 4, step 4-5). ``n`` is a scalar or length A."""
    weibull_sse = sse[:, 0] + 1e6 * (slopes[:, 0] <= 0)
    gumbel_sse = sse[:, 1] + 1e6 * (slopes[:, 1] >= 0)
    aic_weibull = n * torch.log(weibull_sse / n) + 4
    aic_gumbel = n * torch.log(gumbel_sse / n) + 4
    return aic_gumbel - aic_weibull, slopes[:, 0].clamp_min(0)


def _uniform_tail_statistics(sims: torch.Tensor, k: int, eps: float) -> TailStatistics:
    hardest = sims.topk(k, dim=1, largest=True, sorted=True).values  # descending similarity
    shortfalls = (1 - hardest).clamp_min(eps)  # ascending shortfall
    rho = shortfalls[:, 0]
    burn_in = max(1, k // 20)
    n = k - burn_in
    if n < 2:  # the authors' fallback for degenerate tails
        zeros = torch.zeros_like(rho)
        return TailStatistics(rho, zeros, zeros.clone(), torch.full_like(rho, max(n, 0)), True)
    targets = _centred_link_targets(k, burn_in, sims.dtype, sims.device)
    slopes, sse = _fit_lines(shortfalls[:, burn_in:].log(), targets)
    delta_aic, beta_hat = _aic_statistics(slopes, sse, float(n))
    return TailStatistics(rho, delta_aic, beta_hat, torch.full_like(rho, n), False)


def _masked_tail_statistics(sims: torch.Tensor, counts: list[int], config: WeinceConfig):
    """Tail statistics when anchors have different numbers of valid negatives (padding excluded)."""
    tail_sizes = torch.tensor([_tail_size(c, config) for c in counts], device=sims.device)
    k_max = int(tail_sizes.max())
    hardest = sims.topk(k_max, dim=1, largest=True, sorted=True).values
    ranks = torch.arange(1, k_max + 1, device=sims.device, dtype=sims.dtype)[None, :]  # 1 x k_max
    k = tail_sizes.to(sims.dtype)[:, None]
    burn_in = (tail_sizes // 20).clamp_min(1).to(sims.dtype)[:, None]
    weights = ((ranks > burn_in) & (ranks <= k)).to(sims.dtype)
    n = weights.sum(dim=1)
    shortfalls = torch.where(ranks <= k, (1 - hardest).clamp_min(config.eps), torch.ones_like(hardest))
    rho = shortfalls[:, 0]
    plotting_positions = torch.where(ranks <= k, ranks / (k + 1), torch.full_like(ranks * k, 0.5))
    log_f = plotting_positions.log()
    targets = torch.stack([log_f, (-log_f).log()], dim=1)  # A x 2 x k_max
    w = weights[:, None, :]
    targets = (targets - (targets * w).sum(dim=2, keepdim=True) / n.clamp_min(1)[:, None, None]) * w
    slopes, sse = _fit_lines(shortfalls.log(), targets, weights)
    delta_aic, beta_hat = _aic_statistics(slopes, sse, n.clamp_min(1))
    degenerate = n < 2
    delta_aic = delta_aic.masked_fill(degenerate, 0.0)
    beta_hat = beta_hat.masked_fill(degenerate, 0.0)
    return TailStatistics(rho, delta_aic, beta_hat, n, bool(degenerate.any()))


def mixing_weights(stats: TailStatistics, config: WeinceConfig | None = None):
    """Mixing weight lambda_i in [0, 1] per anchor and the batch reference rho_0 (spec section 5).

    Returns ``(mixing_weight, rho0)``.
    """
    config = config or WeinceConfig()
    rho = stats.rho
    sorted_rho = rho.sort().values
    if stats.any_degenerate:
        rho0 = sorted_rho[(rho.numel() - 1) // 2]  # the authors' fallback: lower median
    else:
        rho0 = sorted_rho[round(config.quantile * (rho.numel() - 1))]
    lambda_rho = torch.sigmoid(config.kappa_rho * (rho0.log() - rho.log()))
    lambda_aic = torch.sigmoid(config.kappa_aic * (stats.delta_aic - config.aic_margin))
    if config.gate == "both":
        weight = lambda_rho * lambda_aic
    elif config.gate == "rho":
        weight = lambda_rho
    else:
        weight = lambda_aic
    return weight, rho0


def _shortfall_exponent(stats: TailStatistics, config: WeinceConfig) -> torch.Tensor:
    if config.beta == "estimated":
        return stats.beta_hat.clamp(config.beta_min, config.beta_max)
    return torch.full_like(stats.beta_hat, float(config.beta))


def weince_logits(similarities, mixing_weight, beta, temperature: float, eps: float = 1e-6):
    """``(1 - lambda_i) s_ij / tau + lambda_i beta_i (-log(1 - min(s_ij, 1 - eps)))`` for a similarity matrix.

    ``mixing_weight`` and ``beta`` are per-row (length A) and treated as constants (detach them first).
    """
    # -log(max(1 - s, eps)) == -log(1 - min(s, 1 - eps)); written this way because 1 - eps is not
    # representable in float32 next to 1.
    log_shortfall = torch.log((1 - similarities).clamp_min(eps))
    infonce_scale = ((1 - mixing_weight) / temperature)[:, None]
    shortfall_scale = (-mixing_weight * beta)[:, None]
    return torch.addcmul(similarities * infonce_scale, shortfall_scale, log_shortfall)


DIAGNOSTIC_KEYS = ("lambda_mean", "lambda_above_half", "rho0", "delta_aic_mean", "beta_hat_mean")


def summarize_statistics(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-step diagnostics of spec section 5 from ``weince_loss(..., return_stats=True)``'s dict: mean lambda,
    share of anchors with lambda > 0.5, rho_0, mean Delta-AIC, mean beta_hat, as 0-d tensors (no device sync)."""
    weight = stats["mixing_weight"]
    return {
        "lambda_mean": weight.mean(),
        "lambda_above_half": (weight > 0.5).float().mean(),
        "rho0": stats["rho0"],
        "delta_aic_mean": stats["delta_aic"].mean(),
        "beta_hat_mean": stats["beta_hat"].mean(),
    }


# ------------------------------------------------------------------------------------------ the losses


@dataclass(frozen=True)
class _Layout:
    """Where each anchor's positive is, and which entries of its similarity row are not negatives."""

    positives: torch.Tensor  # length A: column of each anchor's positive
    not_negative: torch.Tensor  # A x C bool: the positive, and (simclr) the anchor itself
    self_mask: torch.Tensor | None  # simclr: the diagonal, excluded from the softmax too
    num_negatives: int


@functools.lru_cache(maxsize=32)
def _layout(geometry: str, num_rows: int, num_columns: int, device: torch.device) -> _Layout:
    if geometry == "simcse":
        positives = torch.arange(num_rows, device=device)
        self_mask = None
    else:
        n = num_rows // 2
        positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(device)
        self_mask = torch.eye(num_rows, dtype=torch.bool, device=device)
    not_negative = F.one_hot(positives, num_columns).bool()
    if self_mask is not None:
        not_negative |= self_mask
    return _Layout(positives, not_negative, self_mask, num_columns - (1 if self_mask is None else 2))


def _similarities(anchors, candidates, geometry):
    """simcse: anchors x candidates; simclr: the 2N x 2N matrix of z = [anchors; candidates]."""
    if geometry == "simcse":
        return cosine_similarity_matrix(anchors, candidates)
    views = torch.cat([anchors, candidates], dim=0)
    return cosine_similarity_matrix(views, views)


class _PreciseCosineSimilarity(torch.autograd.Function):
    """Cosine similarities whose forward pass runs in float64, with a backward pass in the compute dtype.

    The tail statistics look at shortfalls 1 - s down to 1e-6, where float32 cosines keep a digit or two; the
    float64 matrix feeds them (no gradient) and, rounded to the compute dtype, the logits. Only the backward
    matmuls carry gradients, so they stay in float32: one float64 matmul replaces the float32 forward matmul
    instead of adding a second pass. ``candidates=None`` means the Gram matrix of ``anchors`` (simclr).
    """

    @staticmethod
    def forward(ctx, anchors, candidates, compute_dtype):
        with torch.autocast(device_type=anchors.device.type, enabled=False):
            anchor_dirs, anchor_inv_norms = _directions(anchors.detach().double())
            if candidates is None:
                candidate_dirs = anchor_dirs
            else:
                candidate_dirs, candidate_inv_norms = _directions(candidates.detach().double())
            precise = anchor_dirs @ candidate_dirs.T
        ctx.input_dtypes = (anchors.dtype, None if candidates is None else candidates.dtype)
        saved = [anchor_dirs.to(compute_dtype), anchor_inv_norms.to(compute_dtype)]
        if candidates is not None:
            saved += [candidate_dirs.to(compute_dtype), candidate_inv_norms.to(compute_dtype)]
        ctx.save_for_backward(*saved)
        ctx.mark_non_differentiable(precise)
        sims = precise.clone() if compute_dtype == torch.float64 else precise.to(compute_dtype)
        return sims, precise

    @staticmethod
    def backward(ctx, grad_sims, _grad_precise):
        anchor_dirs, anchor_inv_norms, *candidate_saved = ctx.saved_tensors
        with torch.autocast(device_type=grad_sims.device.type, enabled=False):
            grad_sims = grad_sims.to(anchor_dirs.dtype)
            if not candidate_saved:  # Gram matrix: s_ij depends on row i and row j of the same input
                grad_dirs = (grad_sims + grad_sims.T) @ anchor_dirs
                grad = _normalization_backward(grad_dirs, anchor_dirs, anchor_inv_norms)
                return grad.to(ctx.input_dtypes[0]), None, None
            candidate_dirs, candidate_inv_norms = candidate_saved
            grad_anchors = _normalization_backward(grad_sims @ candidate_dirs, anchor_dirs, anchor_inv_norms)
            grad_candidates = _normalization_backward(grad_sims.T @ anchor_dirs, candidate_dirs, candidate_inv_norms)
        return grad_anchors.to(ctx.input_dtypes[0]), grad_candidates.to(ctx.input_dtypes[1]), None


def _normalization_backward(grad_dirs, dirs, inv_norms):
    # d(x/|x|)^T g = (g - u (u . g)) / |x|
    return (grad_dirs - dirs * (grad_dirs * dirs).sum(dim=-1, keepdim=True)) * inv_norms


def _precise_similarities(anchors, candidates, geometry):
    """``(sims, precise)``: the similarity matrix with gradient in the compute dtype, and its float64 values."""
    compute_dtype = _statistics_dtype(anchors, candidates)
    if geometry == "simclr":
        return _PreciseCosineSimilarity.apply(torch.cat([anchors, candidates], dim=0), None, compute_dtype)
    return _PreciseCosineSimilarity.apply(anchors, candidates, compute_dtype)


def _batch_statistics(precise_sims, layout: _Layout, config: WeinceConfig) -> TailStatistics:
    """Tail statistics of every anchor's negatives from float64 similarities, without gradient."""
    with torch.no_grad():  # in place: the float64 matrix serves nothing else
        negatives = precise_sims.masked_fill_(layout.not_negative, float("-inf"))
        return tail_statistics(negatives, config, num_negatives=layout.num_negatives)


def _cross_entropy(logits, layout: _Layout):
    if layout.self_mask is not None:
        logits = logits.masked_fill(layout.self_mask, float("-inf"))
    return F.cross_entropy(logits, layout.positives)


def _stats_logits(logits, layout: _Layout):
    """Logits in the documented layout: simcse as is; simclr as 2N x (2N-1), positive first, then the
    negatives in row order."""
    logits = logits.detach()
    if layout.self_mask is None:
        return logits
    negatives = logits[~layout.not_negative].view(logits.shape[0], layout.num_negatives)
    return torch.cat([logits.gather(1, layout.positives[:, None]), negatives], dim=1)


def weince_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    *,
    temperature: float,
    config: WeinceConfig | None = None,
    geometry: str = "simcse",
    return_stats: bool = False,
    mixing_weight: torch.Tensor | None = None,
):
    """WEINCE contrastive loss (mean over anchors).

    Args:
        anchors: ``N x d`` embeddings (need not be normalised).
        candidates: ``simcse``: ``M x d`` with ``M >= N``; candidate i is anchor i's positive, every other
            candidate (including extra hard negatives in rows N..M-1) is a negative.
            ``simclr``: the second views, ``N x d``; every one of the 2N rows of ``[anchors; candidates]`` is an
            anchor whose positive is its other view and whose negatives are the other 2N - 2 rows.
        temperature: tau > 0 of the InfoNCE part.
        config: :class:`WeinceConfig` (defaults to the paper's settings).
        geometry: ``"simcse"`` or ``"simclr"``.
        return_stats: also return a dict of detached statistics: per-anchor ``mixing_weight``, ``delta_aic``,
            ``rho``, ``beta_hat``, ``beta`` (the exponent used), the scalar ``rho0``, and ``logits`` (simcse:
            anchors x candidates, positive at column i; simclr: 2N x (2N-1), positive in column 0).
        mixing_weight: override lambda (a scalar or one value per anchor), e.g. 0 for InfoNCE through this
            code path. The tail statistics are still computed and reported.

    Returns:
        The scalar loss (float32, or float64 for float64 inputs), or ``(loss, stats)``.
    """
    config = config or WeinceConfig()
    if not isinstance(config, WeinceConfig):
        raise TypeError(f"config must be a WeinceConfig, got {type(config).__name__}")
    _validate_embeddings(anchors, candidates, geometry, temperature)
    temperature = float(temperature)
    sims, precise_sims = _precise_similarities(anchors, candidates, geometry)
    layout = _layout(geometry, sims.shape[0], sims.shape[1], sims.device)
    stats = _batch_statistics(precise_sims, layout, config)
    with torch.no_grad():
        weight, rho0 = mixing_weights(stats, config)
        if mixing_weight is not None:
            weight = torch.as_tensor(mixing_weight, dtype=weight.dtype, device=sims.device).expand_as(weight)
        beta = _shortfall_exponent(stats, config)
    with torch.autocast(device_type=sims.device.type, enabled=False):
        logits = weince_logits(sims, weight.to(sims.dtype), beta.to(sims.dtype), temperature, config.eps)
        loss = _cross_entropy(logits, layout)
    _raise_if_not_finite(loss, anchors, candidates)
    if not return_stats:
        return loss
    return loss, {
        "mixing_weight": weight,
        "delta_aic": stats.delta_aic,
        "rho": stats.rho,
        "beta_hat": stats.beta_hat,
        "beta": beta,
        "rho0": rho0,
        "logits": _stats_logits(logits, layout),
    }


def infonce_loss(anchors: torch.Tensor, candidates: torch.Tensor, *, temperature: float, geometry: str = "simcse"):
    """InfoNCE / NT-Xent on cosine similarities: cross-entropy of the positive among the candidates.

    Same geometries and inputs as :func:`weince_loss`; in the simcse geometry this is sentence-transformers'
    ``MultipleNegativesRankingLoss`` with ``scale = 1 / temperature``.
    """
    _validate_embeddings(anchors, candidates, geometry, temperature)
    sims = _similarities(anchors, candidates, geometry)
    layout = _layout(geometry, sims.shape[0], sims.shape[1], sims.device)
    with torch.autocast(device_type=sims.device.type, enabled=False):
        loss = _cross_entropy(sims / float(temperature), layout)
    _raise_if_not_finite(loss, anchors, candidates)
    return loss
