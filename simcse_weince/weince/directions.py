"""WEINCE and InfoNCE over sentence-transformers' ``directions`` and ``partition_mode``: :func:`directions_loss`.

sentence-transformers' ``MultipleNegativesRankingLoss`` (MNRL) scores, for anchor i (query q_i, its documents
d_i = its positive p_i and its hard negatives), up to four blocks of similarities:

* ``query_to_doc``: q_i against every document of the batch (positives, then each hard-negative column); the
  positive is p_i;
* ``query_to_query``: q_i against every query, q_i itself masked;
* ``doc_to_query``: p_i against every query; the positive is q_i (the same pair, seen from the document);
* ``doc_to_doc``: p_i against every document, q_i's own documents (p_i and its hard negatives) masked.

``partition_mode="joint"`` puts the blocks of anchor i side by side in one row, one softmax whose target is the
``query_to_doc`` positive; ``"per_direction"`` (``query_to_doc`` and ``doc_to_query`` only) gives every block its
own softmax and averages the losses. WEINCE on these rows (docs/method.md#what-each-row-holds): every row the loss
builds has its own λ and β; its *negatives* for the tail statistics are its finite entries other than its
positive(s) (in a joint row, the ``doc_to_query`` entry of the pair is the positive pair again and is not a
negative); the shortfall logit is blended into every finite entry (positives included, as in the single-direction
loss); masked entries (``-inf``) take no part in anything. ρ₀ is the quantile over the rows of one softmax: the
batch's anchors in ``joint``, each direction's rows separately in ``per_direction``. λ = 0 is MNRL exactly.

The single-direction default (``("query_to_doc",)``) is :func:`~simcse_weince.weince.loss.weince_loss`'s simcse
geometry; :func:`~simcse_weince.losses.from_embeddings.loss_from_embeddings` routes it there (its fast closed-form
backward), and everything else here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from simcse_weince.weince.config import WeinceConfig
from simcse_weince.weince.loss import hardness_mask, weince_logits
from simcse_weince.weince.speedups import _autocast_off, _PreciseCosineSimilarity
from simcse_weince.weince.tail import mixing_weights, shortfall_exponent, statistics_dtype, tail_statistics

__all__ = ["DIRECTIONS", "PARTITION_MODES", "directions_loss"]

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
PARTITION_MODES = ("joint", "per_direction")

_DEFAULT_CONFIG = WeinceConfig()


class _Block:
    """One direction's similarities for the batch's anchors: ``sims`` (compute dtype, with gradient), ``precise``
    (float64, no gradient; None without cosine), ``masked`` (entries out of the softmax), ``positive`` (the
    entries that are the anchor's positive pair; None when the block holds none)."""

    def __init__(self, sims, precise, masked, positive):
        self.sims, self.precise, self.masked, self.positive = sims, precise, masked, positive


def _own_columns(num_rows: int, num_columns: int, device) -> torch.Tensor:
    """A x C: anchor i's own candidate columns (i, i + A, i + 2A, ...: its positive and its hard negatives)."""
    rows = torch.arange(num_rows, device=device)[:, None]
    return torch.arange(num_columns, device=device)[None, :] % num_rows == rows


def _blocks(queries, documents, directions, similarity, compute_dtype) -> list[_Block]:
    """The blocks of ``directions`` in MNRL's order (query_to_doc, query_to_query, doc_to_query, doc_to_doc)."""
    positives = documents[: queries.shape[0]]
    num_anchors, device = queries.shape[0], queries.device
    eye = torch.eye(num_anchors, dtype=torch.bool, device=device)

    def pair(left, right):  # MNRL computes doc_to_query and doc_to_doc as similarity(others, p).T
        if similarity is None:
            return _PreciseCosineSimilarity.apply(left, right, False, compute_dtype)
        return similarity(left, right), None

    blocks = []
    sims, precise = pair(queries, documents)
    blocks.append(_Block(sims, precise, None, F.pad(eye, (0, documents.shape[0] - num_anchors))))
    if "query_to_query" in directions:
        sims, precise = pair(queries, queries)
        blocks.append(_Block(sims, precise, eye, None))
    if "doc_to_query" in directions:
        sims, precise = pair(queries, positives) if similarity is not None else pair(positives, queries)
        if similarity is not None:
            sims = sims.T
        blocks.append(_Block(sims, precise, None, eye))
    if "doc_to_doc" in directions:
        sims, precise = pair(documents, positives) if similarity is not None else pair(positives, documents)
        if similarity is not None:
            sims = sims.T
        blocks.append(_Block(sims, precise, _own_columns(num_anchors, documents.shape[0], device), None))
    return blocks


def _hardness_bias(block: _Block, hardness_mode: str | None, hardness_strength: float):
    if hardness_mode is None or not hardness_strength:
        return None
    mask = hardness_mask(hardness_mode, block.sims.shape[0], block.sims.shape[1], block.sims.device)
    return hardness_strength * block.sims.detach() * mask


def _softmax_rows(blocks, biases, *, temperature, weince, mixing_weight, statistics, eps):
    """Cross-entropy of one softmax over ``blocks`` side by side (target: the first block's positive, which is
    always ``query_to_doc``'s or, per direction, the block's own), and the rows' tail statistics if needed."""
    sims = blocks[0].sims if len(blocks) == 1 else torch.cat([block.sims for block in blocks], dim=1)
    num_anchors = sims.shape[0]

    def side_by_side(masks):
        if all(mask is None for mask in masks):
            return None
        return torch.cat([
            torch.zeros_like(block.sims, dtype=torch.bool) if mask is None else mask
            for block, mask in zip(blocks, masks)
        ], dim=1)  # fmt: skip

    masked = side_by_side([block.masked for block in blocks])
    needs_weights = mixing_weight is None or statistics or float(mixing_weight) != 0.0
    stats = weight = beta = rho0 = None
    if needs_weights:
        with torch.no_grad():
            precise = torch.cat([block.precise for block in blocks], dim=1)
            not_negative = side_by_side([block.positive for block in blocks])
            if masked is not None:
                not_negative = not_negative | masked
            stats = tail_statistics(precise.masked_fill_(not_negative, float("-inf")), weince, overwrite=True)
            weight, rho0 = mixing_weights(stats, weince)
            beta = shortfall_exponent(stats, weince)
    if mixing_weight is not None:
        weight = torch.full((num_anchors,), float(mixing_weight), dtype=sims.dtype, device=sims.device)
        beta = beta if beta is not None else torch.zeros_like(weight)
    with _autocast_off(sims.device.type):
        if mixing_weight is not None and float(mixing_weight) == 0.0:
            logits = sims / temperature  # InfoNCE: MNRL's logits, without a zero shortfall term added
        else:
            logits = weince_logits(sims, weight.to(sims.dtype), beta.to(sims.dtype), temperature, eps)
        if any(b is not None for b in biases):
            bias = torch.cat([
                torch.zeros_like(block.sims) if b is None else b for block, b in zip(blocks, biases)
            ], dim=1)  # fmt: skip
            logits = logits + bias
        if masked is not None:
            logits = logits.masked_fill(masked, float("-inf"))
        loss = F.cross_entropy(logits, torch.arange(num_anchors, device=sims.device))
    row_stats = None
    if statistics:
        row_stats = {"mixing_weight": weight, "delta_aic": stats.delta_aic, "rho": stats.rho,
                     "beta_hat": stats.beta_hat, "beta": beta, "rho0": rho0}  # fmt: skip
    return loss, row_stats


def directions_loss(
    queries: torch.Tensor,
    documents: torch.Tensor,
    *,
    directions: Sequence[str],
    partition_mode: str = "joint",
    temperature: float,
    weince: WeinceConfig | None = None,
    mixing_weight: float | None = None,
    hardness_mode: str | None = None,
    hardness_strength: float = 0.0,
    similarity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    return_stats: bool = False,
):
    """WEINCE (or, with ``mixing_weight=0``, InfoNCE = MNRL) over MNRL's ``directions`` and ``partition_mode``.

    Args:
        queries: ``A x d`` anchors (gathered across processes already, if asked).
        documents: ``C x d``, the positives (rows 0..A-1) then each hard-negative column, stacked.
        directions: a subset of :data:`DIRECTIONS` containing ``"query_to_doc"`` (checked by the caller:
            :func:`~simcse_weince.losses.from_embeddings.check_contrastive_options`).
        partition_mode: ``"joint"`` (one softmax per anchor over its blocks side by side) or ``"per_direction"``
            (one per direction, losses averaged).
        temperature: τ.
        weince: WEINCE's settings (the paper's for None).
        mixing_weight: override λ (0: InfoNCE, MNRL exactly); None: WEINCE's λ per row.
        hardness_mode, hardness_strength: MNRL's hardness weighting ``α · stop_grad(s)`` on the ``query_to_doc``
            entries the mode selects (None or α = 0: off).
        similarity: MNRL's ``similarity_fct`` for InfoNCE (``mixing_weight=0``); None: cosine (WEINCE needs it).
        return_stats: also return the rows' statistics (per-row ``mixing_weight``, ``delta_aic``, ``rho``,
            ``beta_hat``, ``beta`` concatenated over the softmaxes, and ``rho0``: their mean over the softmaxes).

    Returns:
        The scalar loss (float32, or float64 for float64 inputs), or ``(loss, stats)``.
    """
    weince = weince or _DEFAULT_CONFIG
    if similarity is not None and (mixing_weight is None or float(mixing_weight) != 0.0 or return_stats):
        raise ValueError("WEINCE's tail statistics and shortfall logit need cosine similarities (similarity=None)")
    compute_dtype = statistics_dtype(queries, documents)
    if similarity is None:
        queries, documents = queries.to(compute_dtype), documents.to(compute_dtype)
    blocks = _blocks(queries, documents, directions, similarity, compute_dtype)
    biases = [_hardness_bias(blocks[0], hardness_mode, hardness_strength)] + [None] * (len(blocks) - 1)
    options = {"temperature": float(temperature), "weince": weince, "mixing_weight": mixing_weight,
               "statistics": return_stats, "eps": weince.eps}  # fmt: skip
    if partition_mode == "joint":
        parts = [_softmax_rows(blocks, biases, **options)]
    else:
        parts = [_softmax_rows([block], [bias], **options) for block, bias in zip(blocks, biases)]
    loss = parts[0][0] if len(parts) == 1 else torch.stack([part[0] for part in parts]).mean()
    if not return_stats:
        return loss
    stats = {key: torch.cat([part[1][key] for part in parts]) for key in parts[0][1] if key != "rho0"}
    stats["rho0"] = torch.stack([part[1]["rho0"] for part in parts]).mean()
    return loss, stats
