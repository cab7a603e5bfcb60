"""The core's speed machinery: what makes :func:`~simcse_weince.weince.loss.weince_loss` fast, without changing the
formula it computes (the readable version is :mod:`simcse_weince.weince.reference`).

==================================  ==================================================================================
:class:`_PreciseCosineSimilarity`   float64 forward of the similarities (for the tail statistics), hand-written
                                    backward in the compute dtype
:class:`_WeinceCrossEntropy`        the WEINCE logits' cross-entropy with a closed-form backward
:func:`_blended_logits`             the WEINCE logit in place on fresh temporaries (shared with ``weince_logits``)
:func:`_hardest_shortfalls`         each row's top k through numpy's partition (and a float32 preselection)
==================================  ==================================================================================

Each piece is held to autograd and to the reference by tests (``tests/test_weince_core.py``,
``tests/test_weince_bruteforce.py``); why each exists, with the measurements: ``docs/performance.md``, sections 10
and 12.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from simcse_weince.weince.loss import _Layout

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


def _blended_logits(sims, infonce_scale, shortfall_scale, eps: float):
    """The WEINCE logit (the one place it is written), and the shortfalls ``1 - s`` as a fresh tensor.

    ``-log(max(1 - s, eps))`` is ``-log(1 - min(s, 1 - eps))``, written this way because 1 - eps is not
    representable in float32 next to 1. In place on fresh temporaries only, so autograd can differentiate it.
    """
    shortfall = torch.rsub(sims, 1)
    logits = torch.clamp_min(shortfall, eps).log_().mul_(-shortfall_scale).addcmul_(sims, infonce_scale)
    return logits, shortfall


# ------------------------------------------------------------------------- the hand-written backward passes


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


class _WeinceCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the WEINCE logits of a similarity matrix, with a closed-form backward.

    The logit's slope in s is ``(1 - lambda_i) / tau + lambda_i beta_i / (1 - s)`` (without the second term where
    1 - s is floored at eps), so the gradient is ``(softmax - one-hot) * slope / A``. Autograd through
    :func:`weince_logits` would keep half a dozen A x C intermediates and make a dozen passes over them; this keeps
    the logits (which it returns anyway) and the slope, and the backward makes three passes (softmax, the slope and
    the scale). What that buys: docs/performance.md#weince-speedups (``scripts/benchmarks/bench_loss.py``).
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
        # torch's CPU addcdiv with A x 1 operands broadcast over A x C is slower (docs/performance.md#weince-speedups)
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
        # softmax of the logits (the masked diagonal gives 0); on the CPU torch's softmax kernel is faster than
        # exp(log_probs), whose exp slows down on the large negative values of log-probabilities (why:
        # docs/performance.md#weince-speedups)
        grad = F.softmax(logits, dim=1)
        for offset in ctx.layout.positive_diagonals:  # minus the one-hot of the positives
            grad.diagonal(offset).sub_(1)
        return grad.mul_(slope).mul_(grad_loss / grad.shape[0]), None, None, None, None, None


# ------------------------------------------------------------------------------- the top-k of the tail


# numpy sorts and partitions 32-bit floats with vector instructions but 64-bit ones (on the CPUs measured) without,
# so a wide float64 matrix is partitioned faster through its float32 rounding; below this many columns the float64
# partition is as fast (why: docs/performance.md#the-numbers-behind-the-codes-choices).
_FLOAT32_PRESELECTION_MIN_COLUMNS = 256


def _preselects_in_float32(sims: torch.Tensor) -> bool:
    return sims.dtype == torch.float64 and sims.shape[1] >= _FLOAT32_PRESELECTION_MIN_COLUMNS


def _largest_by_float32(sims: torch.Tensor, k: int) -> np.ndarray | None:
    """Each row's k largest float64 values (unordered, A x k), found through their float32 roundings.

    Rounding is monotone, so a value whose rounding is above the row's k-th largest rounding is in the top k; when
    exactly k values of every row round to that threshold or above, they are the top k, the values a float64
    partition gives. None when a row ties across the threshold (or holds NaN): the caller partitions in float64.
    """
    values = sims.numpy()
    rounded = values.astype(np.float32)
    num_columns = values.shape[1]
    # a full float32 sort finds the threshold faster than a float32 partition does
    # (docs/performance.md#the-numbers-behind-the-codes-choices)
    kth = np.sort(rounded, axis=1)[:, num_columns - k, None]
    selected = np.compress((rounded >= kth).ravel(), values.ravel())  # row by row, so k per row in order
    if selected.size != values.shape[0] * k:
        return None
    return selected.reshape(-1, k)


def _hardest_shortfalls(sims: torch.Tensor, k: int, eps: float, overwrite: bool = False) -> torch.Tensor:
    """Shortfalls ``max(1 - s, eps)`` of each row's k largest similarities, ascending (no gradient).

    On the CPU this is numpy's introselect on the values, faster than ``torch.topk`` (which sorts (value, index)
    pairs; docs/performance.md#weince-speedups), in place when ``overwrite`` allows it; wide float64 rows are first
    narrowed down through their float32 roundings (:func:`_largest_by_float32`, the same values). On a CPU-sized
    batch this is WEINCE's largest single cost over InfoNCE.
    """
    if sims.device.type != "cpu":
        return torch.rsub(sims.topk(k, dim=1, largest=True, sorted=True).values, 1).clamp_min_(eps)
    num_columns = sims.shape[1]
    largest = _largest_by_float32(sims, k) if _preselects_in_float32(sims) else None
    if largest is None:
        values = sims.numpy()
        if overwrite:
            values.partition(num_columns - k, axis=1)
        else:
            values = np.partition(values, num_columns - k, axis=1)
        largest = values[:, num_columns - k :]
    largest.sort(axis=1)
    shortfalls = np.subtract(1.0, largest[:, ::-1])
    return torch.from_numpy(np.maximum(shortfalls, eps, out=shortfalls))
