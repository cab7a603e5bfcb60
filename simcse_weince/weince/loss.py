"""The WEINCE loss: a pure functional core (tensors in, tensors out, no model objects).

WEINCE blends, per anchor i, the InfoNCE logit ``s_ij / tau`` with the endpoint-shortfall logit
``-beta_i * log(1 - s_ij)``::

    logit_ij = (1 - lambda_i) * s_ij / tau + lambda_i * beta_i * (-log(1 - min(s_ij, 1 - eps)))

``lambda_i`` (the *mixing weight*) and ``beta_i`` are stop-gradient statistics of anchor i's hardest negatives
(how close they come to the endpoint 1, and whether a Weibull line fits their tail better than a Gumbel
line). ``lambda = 0`` is exactly InfoNCE. The normative spec is ``docs/WEINCE.md`` of the project's shared
folder; section numbers below refer to it.

The stop-gradient side (the tail statistics and lambda, spec sections 4-5) lives in :mod:`simcse_weince.weince.tail`;
this module holds the similarities, the logit and the losses. Everything is vectorised over anchors (one top-k and
two closed-form regressions per batch) and runs in float32 or float64 even when the inputs are half precision or an
autocast region is active.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simcse_weince.deprecation import renamed_value
from simcse_weince.weince.config import GATES, WeinceConfig
from simcse_weince.weince.tail import (
    STATISTIC_KEYS,
    TailStatistics,
    mixing_weights,
    shortfall_exponent,
    statistics_dtype,
    summarize_statistics,
    tail_statistics,
)

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
    "STATISTIC_KEYS",
    "GEOMETRIES",
    "GATES",
    "HARDNESS_MODES",
    "hardness_mask",
]

GEOMETRIES = ("simcse", "simclr")
# what a call without a config uses: built (and validated) once, not on every loss call; only read here
_DEFAULT_CONFIG = WeinceConfig()


# ----------------------------------------------------------------------------------------------- helpers


def _autocast_off(device_type: str):
    """A region with autocast off; a no-op context when autocast is not on (entering one is not free)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def _directions(x: torch.Tensor, in_place: bool = False):
    """Unit rows and inverse norms; a zero row stays zero with inverse norm 0, so it gets a zero gradient (it has
    no direction; unmasked, its gradient would be ~1/tiny, which overflows when cast back to fp16)."""
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    tiny = torch.finfo(x.dtype).tiny ** 0.5
    inv_norms = (norms > tiny) / norms.clamp_min(tiny)  # clamped, so the backward through 1/norm stays finite
    return (x.mul_(inv_norms) if in_place else x * inv_norms), inv_norms


def _normalize(x: torch.Tensor) -> torch.Tensor:
    return _directions(x)[0]


def cosine_similarity_matrix(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Cosine similarities ``anchors x candidates`` in float32 (float64 for float64 inputs), autocast off."""
    dtype = statistics_dtype(anchors, candidates)
    with _autocast_off(anchors.device.type):
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
    if loss.device.type != "cpu" or math.isfinite(loss.item()):
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
            "the embeddings contain NaN or inf values: "
            + "; ".join(problems)
            + ". Check the encoder (e.g. fp16 overflow, a diverged learning rate)."
        )
    raise ValueError("the contrastive loss is not finite although the embeddings are; please report this.")


# ------------------------------------------------------------------------------------------ the logit


def weince_logits(similarities, mixing_weight, beta, temperature: float, eps: float = 1e-6):
    """``(1 - lambda_i) s_ij / tau + lambda_i beta_i (-log(1 - min(s_ij, 1 - eps)))`` for a similarity matrix.

    ``mixing_weight`` and ``beta`` are per-row (length A) and treated as constants (detach them first).
    Differentiable by autograd; :func:`weince_loss` computes the same logits with a closed-form backward.
    """
    scales = _logit_scales(mixing_weight, beta, float(temperature), similarities.dtype)
    return _blended_logits(similarities, *scales, eps)[0]


def _logit_scales(mixing_weight, beta, temperature: float, dtype):
    """The two per-row factors of the logit as A x 1 columns: ``(1 - lambda) / tau`` and ``lambda beta``."""
    infonce_scale = torch.rsub(mixing_weight, 1).div_(temperature).to(dtype).unsqueeze(1)
    return infonce_scale, torch.mul(mixing_weight, beta).to(dtype).unsqueeze(1)


def _blended_logits(sims, infonce_scale, shortfall_scale, eps: float):
    """The WEINCE logit (the one place it is written), and the shortfalls ``1 - s`` as a fresh tensor.

    ``-log(max(1 - s, eps))`` is ``-log(1 - min(s, 1 - eps))``, written this way because 1 - eps is not
    representable in float32 next to 1. In place on fresh temporaries only, so autograd can differentiate it.
    """
    shortfall = torch.rsub(sims, 1)
    logits = torch.clamp_min(shortfall, eps).log_().mul_(-shortfall_scale).addcmul_(sims, infonce_scale)
    return logits, shortfall


# ------------------------------------------------------------------------------------------ the losses


@dataclass(frozen=True)
class _Layout:
    """Where each anchor's positive is, and which entries of its similarity row are not negatives.

    Those entries lie on diagonals of the similarity matrix (simcse: the main one; simclr: the anchor itself on the
    main one, its other view at offsets +N and -N), so masking them in place costs O(A), not a pass over A x C.
    """

    rows: torch.Tensor  # arange(A)
    positives: torch.Tensor  # length A: column of each anchor's positive
    positive_diagonals: tuple[int, ...]
    not_negative_diagonals: tuple[int, ...]  # the positives and (simclr) the anchors themselves
    not_negative: torch.Tensor  # A x C bool, the same entries as a mask
    self_mask: torch.Tensor | None  # simclr: the diagonal, excluded from the softmax too
    num_negatives: int


@functools.lru_cache(maxsize=32)
def _layout(geometry: str, num_rows: int, num_columns: int, device: torch.device) -> _Layout:
    rows = torch.arange(num_rows, device=device)
    if geometry == "simcse":
        positives, positive_diagonals, self_mask = rows, (0,), None
    else:
        n = num_rows // 2
        positives = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(device)
        positive_diagonals = (n, -n)
        self_mask = torch.eye(num_rows, dtype=torch.bool, device=device)
    not_negative = F.one_hot(positives, num_columns).bool()
    if self_mask is not None:
        not_negative |= self_mask
    return _Layout(
        rows=rows,
        positives=positives,
        positive_diagonals=positive_diagonals,
        not_negative_diagonals=positive_diagonals + ((0,) if self_mask is not None else ()),
        not_negative=not_negative,
        self_mask=self_mask,
        num_negatives=num_columns - (1 if self_mask is None else 2),
    )


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
    instead of adding a second pass. Anchors and candidates are normalised together as one stacked copy;
    ``gram=True`` gives the Gram matrix of that stack (simclr), otherwise anchors x candidates.
    """

    @staticmethod
    def forward(ctx, anchors, candidates, gram: bool, compute_dtype):
        num_anchors = anchors.shape[0]
        with _autocast_off(anchors.device.type):
            dirs, inv_norms = _float64_directions(anchors, candidates)
            precise = dirs @ dirs.T if gram else dirs[:num_anchors] @ dirs[num_anchors:].T
        ctx.gram, ctx.num_anchors, ctx.input_dtypes = gram, num_anchors, (anchors.dtype, candidates.dtype)
        ctx.save_for_backward(dirs.to(compute_dtype), inv_norms.to(compute_dtype))
        ctx.mark_non_differentiable(precise)
        ctx.set_materialize_grads(False)  # no A x C zeros for the float64 output's (absent) gradient
        sims = precise.clone() if compute_dtype == torch.float64 else precise.to(compute_dtype)
        return sims, precise

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_sims, _grad_precise):
        if grad_sims is None:
            return None, None, None, None
        dirs, inv_norms = ctx.saved_tensors
        n = ctx.num_anchors
        with _autocast_off(grad_sims.device.type):
            grad_sims = grad_sims.to(dirs.dtype)
            if ctx.gram:  # s_ij depends on rows i and j of the same stack: (G + G^T) u, as two matmuls (no
                # strided pass over G^T)
                grad_dirs = torch.mm(grad_sims, dirs).addmm_(grad_sims.mT, dirs)
            else:
                grad_dirs = torch.empty_like(dirs)
                torch.mm(grad_sims, dirs[n:], out=grad_dirs[:n])
                torch.mm(grad_sims.T, dirs[:n], out=grad_dirs[n:])
            grad = _normalization_backward_(grad_dirs, dirs, inv_norms)
        return grad[:n].to(ctx.input_dtypes[0]), grad[n:].to(ctx.input_dtypes[1]), None, None


def _float64_directions(*tensors: torch.Tensor):
    """:func:`_directions` of the rows of the tensors, stacked into one float64 copy that is normalised in place."""
    stacked = torch.empty(
        sum(t.shape[0] for t in tensors), tensors[0].shape[1], dtype=torch.float64, device=tensors[0].device
    )
    return _directions(torch.cat(tensors, out=stacked), in_place=True)


def _normalization_backward_(grad_dirs, dirs, inv_norms):
    """Gradient through u = x / |x|, in place on ``grad_dirs``: (g - u (u . g)) / |x|."""
    radial = torch.linalg.vecdot(grad_dirs, dirs).unsqueeze(-1)
    return grad_dirs.addcmul_(dirs, radial, value=-1).mul_(inv_norms)


def _batch_statistics(precise_sims, layout: _Layout, config: WeinceConfig) -> TailStatistics:
    """Tail statistics of every anchor's negatives from float64 similarities, without gradient."""
    with torch.no_grad():  # in place: the float64 matrix serves nothing else
        for offset in layout.not_negative_diagonals:
            precise_sims.diagonal(offset).fill_(float("-inf"))
        return tail_statistics(precise_sims, config, num_negatives=layout.num_negatives, overwrite=True)


class _WeinceCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the WEINCE logits of a similarity matrix, with a closed-form backward.

    The logit's slope in s is ``(1 - lambda_i) / tau + lambda_i beta_i / (1 - s)`` (without the second term where
    1 - s is floored at eps), so the gradient is ``(softmax - one-hot) * slope / A``. Autograd through
    :func:`weince_logits` would keep half a dozen A x C intermediates and make a dozen passes over them; this keeps
    the logits (which it returns anyway) and the slope, and the backward makes three passes (softmax, the slope and
    the scale): with the float64 similarities and the numpy top-k, this is what keeps WEINCE within 2x of InfoNCE
    on a CPU (``scripts/benchmarks/bench_loss.py``).
    ``infonce_scale`` = (1 - lambda) / tau and ``shortfall_scale`` = lambda beta are A x 1 columns.
    It computes :func:`weince_logits` followed by ``F.cross_entropy`` (a test compares both passes with autograd's).
    """

    @staticmethod
    def forward(ctx, sims, infonce_scale, shortfall_scale, layout: _Layout, eps: float, bias=None):
        logits, shortfall = _blended_logits(sims, infonce_scale, shortfall_scale, eps)
        if bias is not None:  # hardness weighting: a constant added to the logits, outside the slope
            logits.add_(bias)
        # d logit / d s, in place on the shortfalls; where 1 - s is floored at eps the shortfall term is constant:
        # the shortfall becomes inf there and 1 / inf = 0 drops it
        F.threshold_(shortfall, eps, math.inf)
        # what addcdiv computes (lambda beta / (1 - s) + (1 - lambda) / tau), bit for bit, in two vectorised passes:
        # torch's CPU addcdiv with A x 1 operands broadcast over A x C takes 3-4x as long
        slope = torch.div(shortfall_scale, shortfall, out=shortfall).add_(infonce_scale)
        if layout.self_mask is not None:  # simclr: an anchor is not its own candidate
            logits.diagonal().fill_(-math.inf)
        log_probs = F.log_softmax(logits, dim=1)
        loss = log_probs[layout.rows, layout.positives].mean().neg()
        ctx.layout = layout
        ctx.save_for_backward(logits, slope)  # the logits, not log_probs: see backward
        ctx.mark_non_differentiable(logits)
        ctx.set_materialize_grads(False)  # no A x C zeros for the logits' (absent) gradient
        return loss, logits

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_logits):
        if grad_loss is None:
            return None, None, None, None, None, None
        logits, slope = ctx.saved_tensors
        # softmax of the logits (the masked diagonal gives 0); on the CPU torch's softmax kernel takes about half the
        # time of exp(log_probs), whose exp slows down on the large negative values of log-probabilities
        grad = F.softmax(logits, dim=1)
        for offset in ctx.layout.positive_diagonals:  # minus the one-hot of the positives
            grad.diagonal(offset).sub_(1)
        return grad.mul_(slope).mul_(grad_loss / grad.shape[0]), None, None, None, None, None


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
    weince: WeinceConfig | None = None,
    geometry: str = "simcse",
    return_stats: bool = False,
    mixing_weight: torch.Tensor | None = None,
    hardness_strength: float = 0.0,
    hardness_mode: str = "in_batch_negatives",
    config: WeinceConfig | None = None,
):
    """WEINCE contrastive loss (mean over anchors).

    Args:
        anchors: ``N x d`` embeddings (need not be normalised).
        candidates: ``simcse``: ``M x d`` with ``M >= N``; candidate i is anchor i's positive, every other
            candidate (including extra hard negatives in rows N..M-1) is a negative.
            ``simclr``: the second views, ``N x d``; every one of the 2N rows of ``[anchors; candidates]`` is an
            anchor whose positive is its other view and whose negatives are the other 2N - 2 rows.
        temperature: tau > 0 of the InfoNCE part.
        weince: :class:`WeinceConfig` (defaults to the paper's settings; ``config=`` is its old, deprecated name).
        geometry: ``"simcse"`` or ``"simclr"``.
        return_stats: also return a dict of detached statistics: per-anchor ``mixing_weight``, ``delta_aic``,
            ``rho``, ``beta_hat``, ``beta`` (the exponent used), the scalar ``rho0``, and ``logits`` (simcse:
            anchors x candidates, positive at column i; simclr: 2N x (2N-1), positive in column 0).
        mixing_weight: override lambda (a scalar or one value per anchor), e.g. 0 for InfoNCE through this
            code path. The tail statistics are still computed and reported.
        hardness_strength: α > 0 adds ``α · stop_grad(s_ij)`` to the WEINCE logit of every in-batch negative, the
            term of :func:`infonce_loss`'s ``hardness_strength`` (sentence-transformers' hardness weighting). **Ours,
            not the paper's** (Studies 2 and 3 in ``docs/experiments.md``); 0, the default, is the paper's loss. At
            λ = 0 it equals ``infonce_loss(..., hardness_strength=α)``. The tail statistics and λ do not see it.
        hardness_mode: which negatives get that term (:func:`hardness_mask`): ``"in_batch_negatives"`` (the default),
            ``"hard_negatives"`` (the anchor's own hard-negative columns) or ``"all_negatives"`` (both); simclr has
            in-batch negatives only.

    Returns:
        The scalar loss (float32, or float64 for float64 inputs), or ``(loss, stats)``.
    """
    if config is not None:  # its old name
        weince = renamed_value(config, weince, "config", "weince", "weince_loss")
    config = weince or _DEFAULT_CONFIG
    if not isinstance(config, WeinceConfig):
        raise TypeError(f"weince must be a WeinceConfig, got {type(config).__name__}")
    _validate_embeddings(anchors, candidates, geometry, temperature)
    check_hardness_strength(hardness_strength)
    temperature = float(temperature)
    compute_dtype = statistics_dtype(anchors, candidates)
    sims, precise_sims = _PreciseCosineSimilarity.apply(anchors, candidates, geometry == "simclr", compute_dtype)
    layout = _layout(geometry, sims.shape[0], sims.shape[1], sims.device)
    stats = _batch_statistics(precise_sims, layout, config)
    with torch.no_grad():
        weight, rho0 = mixing_weights(stats, config)
        if mixing_weight is not None:
            weight = torch.as_tensor(mixing_weight, dtype=weight.dtype, device=sims.device).expand_as(weight)
            if not bool(((weight >= 0) & (weight <= 1)).all()):  # NaN fails both comparisons
                raise ValueError(
                    f"mixing_weight must be in [0, 1] (0: InfoNCE, 1: the shortfall logit alone), got "
                    f"{_summarize_bad_weight(weight)}"
                )
        beta = shortfall_exponent(stats, config)
        infonce_scale, shortfall_scale = _logit_scales(weight, beta, temperature, compute_dtype)
        # a constant of the logits (no gradient through it), so the closed-form backward's slope is unchanged
        hardness_bias = (
            _hardness_bias(sims, hardness_strength, geometry, layout, hardness_mode) if hardness_strength else None
        )
    with _autocast_off(sims.device.type):
        loss, logits = _WeinceCrossEntropy.apply(
            sims, infonce_scale, shortfall_scale, layout, config.eps, hardness_bias
        )
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


def _summarize_bad_weight(weight: torch.Tensor):
    bad = weight[~((weight >= 0) & (weight <= 1))]
    return float(bad[0]) if bad.numel() else weight.tolist()


def infonce_loss(
    anchors: torch.Tensor,
    candidates: torch.Tensor,
    *,
    temperature: float,
    geometry: str = "simcse",
    hardness_strength: float = 0.0,
    hardness_mode: str = "in_batch_negatives",
):
    """InfoNCE / NT-Xent on cosine similarities: cross-entropy of the positive among the candidates.

    Same geometries and inputs as :func:`weince_loss`; in the simcse geometry this is sentence-transformers'
    ``MultipleNegativesRankingLoss`` with ``scale = 1 / temperature``.

    ``hardness_strength`` α > 0 adds ``α · stop_grad(s_ij)`` to the logit of every in-batch negative (not the
    anchor's own positive or hard-negative columns), so harder negatives weigh more in the softmax (Lan et al.,
    2025, LLaVE, eq. 5): sentence-transformers' ``MultipleNegativesRankingLoss(hardness_mode="in_batch_negatives",
    hardness_strength=α)``, the parameter-free hard-negative weighting a user would otherwise pick. 0 (the
    default) is plain InfoNCE. ``hardness_mode`` picks the negatives that get it, as in :func:`weince_loss`.
    """
    _validate_embeddings(anchors, candidates, geometry, temperature)
    check_hardness_strength(hardness_strength)
    sims = _similarities(anchors, candidates, geometry)
    layout = _layout(geometry, sims.shape[0], sims.shape[1], sims.device)
    with _autocast_off(sims.device.type):
        logits = sims / float(temperature)
        if hardness_strength:
            logits = logits + _hardness_bias(sims, hardness_strength, geometry, layout, hardness_mode)
        loss = _cross_entropy(logits, layout)
    _raise_if_not_finite(loss, anchors, candidates)
    return loss


def check_hardness_strength(hardness_strength: float) -> None:
    """Reject α < 0, NaN and inf with a clear error: the check of both core losses and of ``WeinceLoss``."""
    if not (hardness_strength >= 0 and math.isfinite(hardness_strength)):
        raise ValueError(f"hardness_strength must be a finite number >= 0, got {hardness_strength}")


def _hardness_bias(
    sims: torch.Tensor, hardness_strength: float, geometry: str, layout: _Layout, hardness_mode: str
) -> torch.Tensor:
    """``α · stop_grad(s_ij)`` on the negatives ``hardness_mode`` selects, 0 elsewhere: LLaVE's hardness weighting
    as logits."""
    if geometry == "simclr":  # no hard negatives: every negative is an in-batch one
        mask = ~layout.not_negative
    else:
        mask = hardness_mask(hardness_mode, sims.shape[0], sims.shape[1], sims.device)
    return hardness_strength * sims.detach() * mask


HARDNESS_MODES = ("in_batch_negatives", "hard_negatives", "all_negatives")


def hardness_mask(hardness_mode: str, num_rows: int, num_columns: int, device) -> torch.Tensor:
    """A x C mask of the entries sentence-transformers' ``hardness_mode`` weights, in the simcse layout (candidate
    columns: the positives 0..A-1, then each hard-negative column; anchor i's own are i, i + A, i + 2A, ...):
    ``in_batch_negatives``: every column but the anchor's own; ``hard_negatives``: its own hard negatives only;
    ``all_negatives``: every column but its positive."""
    if hardness_mode not in HARDNESS_MODES:
        raise ValueError(f"unknown hardness_mode {hardness_mode!r}; expected one of {HARDNESS_MODES}")
    rows = torch.arange(num_rows, device=device)[:, None]
    columns = torch.arange(num_columns, device=device)[None, :]
    if hardness_mode == "in_batch_negatives":
        return columns % num_rows != rows
    if hardness_mode == "hard_negatives":
        return (columns % num_rows == rows) & (columns >= num_rows)
    return columns != rows
