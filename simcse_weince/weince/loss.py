"""The WEINCE loss: a pure functional core (tensors in, tensors out, no model objects).

WEINCE blends, per anchor i, the InfoNCE logit ``s_ij / tau`` with the endpoint-shortfall logit
``-beta_i * log(1 - s_ij)``::

    logit_ij = (1 - lambda_i) * s_ij / tau + lambda_i * beta_i * (-log(1 - min(s_ij, 1 - eps)))

``lambda_i`` (the *mixing weight*) and ``beta_i`` are stop-gradient statistics of anchor i's hardest negatives
(how close they come to the endpoint 1, and whether a Weibull line fits their tail better than a Gumbel
line). ``lambda = 0`` is exactly InfoNCE. The method, every formula and default: docs/method.md#the-two-logits.

The stop-gradient side (the tail statistics and lambda, docs/method.md#tail-statistics) lives in
:mod:`simcse_weince.weince.tail`; this module holds the similarities, the logit and the losses, and dispatches to the
speed machinery of :mod:`simcse_weince.weince.speedups` (hand-written backward passes, numpy top-k), which computes
the same formula.
The formula read top to bottom, in plain autograd, is :mod:`simcse_weince.weince.reference`; the tests hold this
module to it. Everything is vectorised over anchors (one top-k and two closed-form regressions per batch) and runs in
float32 or float64 even when the inputs are half precision or an autocast region is active.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simcse_weince.deprecation import renamed_value
from simcse_weince.weince.config import GATES, WeinceConfig
from simcse_weince.weince.speedups import (
    _autocast_off,
    _blended_logits,
    _directions,
    _PreciseCosineSimilarity,
    _WeinceCrossEntropy,
)
from simcse_weince.weince.tail import (
    STATISTIC_KEYS,
    TailStatistics,
    mixing_weights,
    shortfall_exponent,
    statistics_dtype,
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
    The clamp: docs/method.md#the-clamp-near-the-endpoint.
    """
    scales = _logit_scales(mixing_weight, beta, float(temperature), similarities.dtype)
    return _blended_logits(similarities, *scales, eps)[0]


def _logit_scales(mixing_weight, beta, temperature: float, dtype):
    """The two per-row factors of the logit as A x 1 columns: ``(1 - lambda) / tau`` and ``lambda beta``."""
    infonce_scale = torch.rsub(mixing_weight, 1).div_(temperature).to(dtype).unsqueeze(1)
    return infonce_scale, torch.mul(mixing_weight, beta).to(dtype).unsqueeze(1)


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


def _batch_statistics(precise_sims, layout: _Layout, weince: WeinceConfig) -> TailStatistics:
    """Tail statistics of every anchor's negatives from float64 similarities, without gradient."""
    with torch.no_grad():  # in place: the float64 matrix serves nothing else
        for offset in layout.not_negative_diagonals:
            precise_sims.diagonal(offset).fill_(float("-inf"))
        return tail_statistics(precise_sims, weince, num_negatives=layout.num_negatives, overwrite=True)


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
    weince = weince or _DEFAULT_CONFIG
    if not isinstance(weince, WeinceConfig):
        raise TypeError(f"weince must be a WeinceConfig, got {type(weince).__name__}")
    _validate_embeddings(anchors, candidates, geometry, temperature)
    check_hardness_strength(hardness_strength)
    temperature = float(temperature)
    compute_dtype = statistics_dtype(anchors, candidates)
    sims, precise_sims = _PreciseCosineSimilarity.apply(anchors, candidates, geometry == "simclr", compute_dtype)
    layout = _layout(geometry, sims.shape[0], sims.shape[1], sims.device)
    stats = _batch_statistics(precise_sims, layout, weince)
    with torch.no_grad():
        weight, rho0 = mixing_weights(stats, weince)
        if mixing_weight is not None:
            weight = _given_mixing_weight(mixing_weight, weight, sims.device)
        beta = shortfall_exponent(stats, weince)
        infonce_scale, shortfall_scale = _logit_scales(weight, beta, temperature, compute_dtype)
        # a constant of the logits (no gradient through it), so the closed-form backward's slope is unchanged
        hardness_bias = (
            _hardness_bias(sims, hardness_strength, geometry, layout, hardness_mode) if hardness_strength else None
        )
    with _autocast_off(sims.device.type):
        loss, logits = _WeinceCrossEntropy.apply(
            sims, infonce_scale, shortfall_scale, layout, weince.eps, hardness_bias
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


def _given_mixing_weight(mixing_weight, weight: torch.Tensor, device) -> torch.Tensor:
    """The ``mixing_weight`` override (a scalar or one value per anchor) in the shape and dtype of the λ it
    replaces; refuses values outside [0, 1]."""
    weight = torch.as_tensor(mixing_weight, dtype=weight.dtype, device=device).expand_as(weight)
    if not bool(((weight >= 0) & (weight <= 1)).all()):  # NaN fails both comparisons
        raise ValueError(
            f"mixing_weight must be in [0, 1] (0: InfoNCE, 1: the shortfall logit alone), got "
            f"{_summarize_bad_weight(weight)}"
        )
    return weight


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
    ``all_negatives``: every column but its positive (docs/method.md#hardness-modes)."""
    if hardness_mode not in HARDNESS_MODES:
        raise ValueError(f"unknown hardness_mode {hardness_mode!r}; expected one of {HARDNESS_MODES}")
    rows = torch.arange(num_rows, device=device)[:, None]
    columns = torch.arange(num_columns, device=device)[None, :]
    if hardness_mode == "in_batch_negatives":
        return columns % num_rows != rows
    if hardness_mode == "hard_negatives":
        return (columns % num_rows == rows) & (columns >= num_rows)
    return columns != rows


def summarize_statistics(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-step λ statistics (docs/method.md#per-step-statistics) from ``weince_loss(..., return_stats=True)``'s
    dict: mean lambda, share of anchors with lambda > 0.5, rho_0, mean Delta-AIC, mean beta_hat, as 0-d tensors (no
    device sync)."""
    weight = stats["mixing_weight"]
    values = (
        weight.mean(),
        (weight > 0.5).float().mean(),
        stats["rho0"],
        stats["delta_aic"].mean(),
        stats["beta_hat"].mean(),
    )
    return dict(zip(STATISTIC_KEYS, values))  # the names of every log, defined once
