"""Per-column embeddings to the contrastive loss and its statistics: :func:`loss_from_embeddings`.

The one path from embeddings to a loss in this package: the sentence-transformers losses
(:class:`~simcse_weince.WeinceLoss`, :class:`~simcse_weince.InfoNCELoss` and their cached versions) and both
trainers' objective (:class:`~simcse_weince.training.objective.ContrastiveObjective`) call it, so a fix here
reaches all of them.

Example::

    import torch
    from simcse_weince.losses.from_embeddings import loss_from_embeddings

    anchors, positives = torch.randn(8, 16), torch.randn(8, 16)
    result = loss_from_embeddings([anchors, positives], loss="weince", statistics=True)
    result.loss, result.statistics["lambda_mean"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from simcse_weince.distributed import gather_with_grad
from simcse_weince.settings import DIRECTIONS, HARDNESS_MODES, LOSSES, PARTITION_MODES
from simcse_weince.weince.loss import (
    DIAGNOSTIC_KEYS,
    GEOMETRIES,
    WeinceConfig,
    infonce_loss,
    raise_non_finite,
    summarize_statistics,
    weince_loss,
)

_HALF = (torch.float16, torch.bfloat16)


class EmbeddingsLoss(NamedTuple):
    """What :func:`loss_from_embeddings` returns."""

    loss: Tensor  # the scalar loss (float32; float64 for float64 embeddings)
    statistics: dict[str, Tensor]  # WEINCE's λ statistics of the batch (DIAGNOSTIC_KEYS), detached 0-d; {} if not asked
    anchors: Tensor  # the anchors the loss saw (gathered across processes when asked)
    candidates: Tensor  # every anchor's candidates, stacked: positives, then each hard-negative column


def anchors_and_candidates(columns: Sequence[Tensor], gather: bool) -> tuple[Tensor, Tensor]:
    """Column 0 are the anchors; columns 1.. (positives, then hard negatives) stacked are every anchor's candidates.

    Half-precision columns are cast to float32 first (the tail statistics need it; float64 stays). With ``gather``
    every column is gathered (with gradient) from all processes, column by column, so that candidate i stays
    anchor i's positive and the negatives span the global batch.
    """
    if len(columns) < 2:
        raise ValueError(f"expected anchor and positive embeddings, got {len(columns)} column(s)")
    columns = [column.float() if column.dtype in _HALF else column for column in columns]
    if gather:
        columns = [gather_with_grad(column) for column in columns]
    anchors, candidate_columns = columns[0], columns[1:]
    candidates = torch.cat(candidate_columns, dim=0)
    return anchors, candidates


# stub: replaced by the i53core branch (the interface the trainer plumbs; the rules are MNRL's)
DEFAULT_DIRECTIONS = ("query_to_doc",)


# stub: replaced by the i53core branch
def check_contrastive_options(
    directions: Sequence[str], partition_mode: str, hardness_mode: str | None, hardness_strength: float
) -> tuple[tuple[str, ...], str, str | None]:
    """``(directions, partition_mode, hardness_mode)`` checked as sentence-transformers'
    ``MultipleNegativesRankingLoss`` checks them; a bad value raises a ``ValueError`` naming it."""
    if isinstance(directions, str):
        directions = (directions,)
    directions = tuple(directions)
    if not directions:
        raise ValueError(f"directions must name at least one of {DIRECTIONS}")
    unknown = [direction for direction in directions if direction not in DIRECTIONS]
    if unknown:
        raise ValueError(f"unknown directions {unknown}; expected some of {DIRECTIONS}")
    if len(set(directions)) != len(directions):
        raise ValueError(f"directions {list(directions)} name a direction twice")
    if "query_to_doc" not in directions:
        raise ValueError(f"directions must include query_to_doc (it holds the positive pair), got {list(directions)}")
    if partition_mode not in PARTITION_MODES:
        raise ValueError(f"unknown partition_mode {partition_mode!r}; expected one of {PARTITION_MODES}")
    if partition_mode == "per_direction" and {"query_to_query", "doc_to_doc"} & set(directions):
        raise ValueError(
            "partition_mode='per_direction' needs every direction's candidates to hold the positive pair, which "
            "query_to_query and doc_to_doc do not; use partition_mode='joint'"
        )
    if hardness_mode is not None and hardness_mode not in HARDNESS_MODES:
        raise ValueError(f"unknown hardness_mode {hardness_mode!r}; expected None or one of {HARDNESS_MODES}")
    if isinstance(hardness_strength, bool) or not hardness_strength >= 0:
        raise ValueError(f"hardness_strength must be >= 0, got {hardness_strength!r}")
    return directions, partition_mode, hardness_mode


def loss_from_embeddings(
    columns: Sequence[Tensor],
    *,
    loss: str = "weince",
    temperature: float = 0.05,
    config: WeinceConfig | None = None,
    geometry: str = "simcse",
    gather: bool = False,
    hardness_strength: float = 0.0,
    statistics: bool = False,
    directions: Sequence[str] = DEFAULT_DIRECTIONS,
    partition_mode: str = "joint",
    hardness_mode: str | None = None,
) -> EmbeddingsLoss:
    """The loss of per-column embeddings: column 0 the anchors, column 1 their positives, further columns hard
    negatives (row i of each is anchor i's own; every anchor sees all of them as extra candidates).

    Args:
        columns: one ``(N, D)`` tensor per column (at least two).
        loss: ``"weince"`` or ``"infonce"``.
        temperature: τ.
        config: WEINCE's mixing-weight settings (the paper's for None).
        geometry: ``"simcse"`` (candidate i is anchor i's positive) or ``"simclr"`` (the 2N x 2N NT-Xent set of
            two views; no hard negatives).
        gather: gather every column from all processes (with gradient) first.
        hardness_strength: sentence-transformers' ``α · stop_grad(s_ij)`` on every in-batch negative (0: off).
        statistics: also return WEINCE's λ statistics; for ``"infonce"`` they are those λ would have been computed
            from (the loss is then WEINCE's at λ = 0, which is InfoNCE).
        directions, partition_mode, hardness_mode: sentence-transformers' ``MultipleNegativesRankingLoss``
            options (see :func:`check_contrastive_options`); the defaults are today's loss (stub: replaced by the
            i53core branch, which implements the others).
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
    if geometry not in GEOMETRIES:
        raise ValueError(f"unknown geometry {geometry!r}; expected one of {GEOMETRIES}")
    if len(columns) > 2 and geometry != "simcse":
        raise ValueError(f"hard negatives need the simcse geometry, not {geometry!r}")
    # stub: replaced by the i53core branch
    if (tuple(directions), partition_mode, hardness_mode) != (DEFAULT_DIRECTIONS, "joint", None):
        raise NotImplementedError("directions, partition_mode and hardness_mode come with the i53core branch")
    anchors, candidates = anchors_and_candidates(columns, gather)
    options = {"temperature": temperature, "geometry": geometry, "hardness_strength": hardness_strength}
    if loss == "infonce" and not statistics:
        return EmbeddingsLoss(infonce_loss(anchors, candidates, **options), {}, anchors, candidates)
    if not statistics:
        return EmbeddingsLoss(weince_loss(anchors, candidates, config=config, **options), {}, anchors, candidates)
    mixing_weight = 0.0 if loss == "infonce" else None
    value, stats = weince_loss(anchors, candidates, config=config, return_stats=True, mixing_weight=mixing_weight,
                               **options)  # fmt: skip
    return EmbeddingsLoss(value, summarize_statistics(stats), anchors, candidates)


def read_diagnostics(last: EmbeddingsLoss | None) -> dict[str, float]:
    """The statistics of a loss's last batch as floats; a non-finite last loss is reported here with the culprit
    rows. The check is deferred to this read (one device synchronisation) so that training steps do not wait."""
    if last is None:
        return {}
    if not torch.isfinite(last.loss).item():
        raise_non_finite(last.anchors, last.candidates)
    return {key: float(last.statistics[key]) for key in DIAGNOSTIC_KEYS} if last.statistics else {}
