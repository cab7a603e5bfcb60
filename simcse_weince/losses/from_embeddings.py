"""Per-column embeddings to the contrastive loss and its statistics: :func:`contrastive_loss` under validated
:class:`ContrastiveSettings`, and :func:`loss_from_embeddings`, which validates its options on every call.

The one path from embeddings to a loss in this package: the sentence-transformers losses
(:class:`~simcse_weince.WeinceLoss`, :class:`~simcse_weince.InfoNCELoss` and their cached versions) and both
trainers' objective (:class:`ContrastiveObjective`, here) build their settings
once and call :func:`contrastive_loss` every step, so a fix here reaches all of them.

Example::

    import torch
    from simcse_weince.losses.from_embeddings import loss_from_embeddings

    anchors, positives = torch.randn(8, 16), torch.randn(8, 16)
    result = loss_from_embeddings([anchors, positives], loss="weince", statistics=True)
    result.loss, result.statistics["lambda_mean"]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from simcse_weince.deprecation import renamed_keywords
from simcse_weince.settings import LOSSES
from simcse_weince.weince.directions import DIRECTIONS, PARTITION_MODES, directions_loss
from simcse_weince.weince.loss import (
    GEOMETRIES,
    HARDNESS_MODES,
    STATISTIC_KEYS,
    WeinceConfig,
    infonce_loss,
    raise_non_finite,
    summarize_statistics,
    weince_loss,
)

_HALF = (torch.float16, torch.bfloat16)

DEFAULT_DIRECTIONS = ("query_to_doc",)
# MNRL's: no hardness weighting, whatever hardness_strength says (a strength applies to the negatives a mode names)
DEFAULT_HARDNESS_MODE = None
#: why WEINCE and its statistics refuse a similarity_fct (ContrastiveSettings, contrastive_loss)
COSINE_ONLY = (
    "WEINCE (and its statistics) need cosine similarity: the shortfall logit -log(1 - s) is defined for similarities "
    "bounded by 1; leave similarity_fct unset"
)


def check_contrastive_options(
    directions: Sequence[str] | str = DEFAULT_DIRECTIONS,
    partition_mode: str = "joint",
    hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
    hardness_strength: float = 0.0,
) -> tuple[tuple[str, ...], str, str | None]:
    """Validate sentence-transformers' ``MultipleNegativesRankingLoss`` options as it does (with messages that name
    the option and the value) and return them normalised: ``(directions, partition_mode, hardness_mode)``, the
    directions as a tuple without repeats (one name alone is taken as a one-direction tuple).

    The one check of these options: :class:`ContrastiveSettings` calls it when built.
    """
    if isinstance(directions, str):
        directions = (directions,)
    try:
        directions = tuple(dict.fromkeys(directions))
    except TypeError:
        raise ValueError(f"directions must be a sequence of direction names, got {directions!r}") from None
    if not directions:
        raise ValueError(f"directions must name at least one direction of {DIRECTIONS}")
    unknown = [name for name in directions if name not in DIRECTIONS]
    if unknown:
        raise ValueError(f"unknown directions {unknown}; expected names from {DIRECTIONS}")
    if "query_to_doc" not in directions:
        raise ValueError(f"directions must include 'query_to_doc' (it holds the positive pair), got {directions}")
    if partition_mode not in PARTITION_MODES:
        raise ValueError(f"partition_mode must be one of {PARTITION_MODES}, got {partition_mode!r}")
    same_type = [name for name in directions if name in ("query_to_query", "doc_to_doc")]
    if partition_mode == "per_direction" and same_type:
        raise ValueError(
            f"partition_mode='per_direction' needs every direction to hold the positive pair, and {same_type} "
            f"compare queries with queries or documents with documents only; use partition_mode='joint'"
        )
    if hardness_mode is not None and hardness_mode not in HARDNESS_MODES:
        raise ValueError(f"hardness_mode must be None or one of {HARDNESS_MODES}, got {hardness_mode!r}")
    if (
        isinstance(hardness_strength, bool)
        or not isinstance(hardness_strength, (int, float))
        or not (hardness_strength >= 0 and math.isfinite(hardness_strength))
    ):
        raise ValueError(f"hardness_strength must be a finite number >= 0, got {hardness_strength!r}")
    return directions, partition_mode, hardness_mode


class EmbeddingsLoss(NamedTuple):
    """What :func:`loss_from_embeddings` returns."""

    loss: Tensor  # the scalar loss (float32; float64 for float64 embeddings)
    statistics: dict[str, Tensor]  # WEINCE's λ statistics (STATISTIC_KEYS), detached 0-d; {} if not asked
    anchors: Tensor  # the anchors the loss saw (gathered across processes when asked)
    candidates: Tensor  # every anchor's candidates, stacked: positives, then each hard-negative column


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, keeping the gradient path (sentence-transformers'
    ``all_gather_with_grad``: torch's differentiable ``all_gather``, whose backward sums the gradients of every
    process and keeps this process's rows).

    Without a process group (or with one process) the tensor is returned as is. Every process must pass the
    same shape (drop the last incomplete batch).

    Every process then computes the *same* global loss. The backward pass sums the gradients of all processes
    (world_size times the gradient of the global loss w.r.t. the local rows), and DDP averages parameter gradients
    over processes: the two factors cancel, so the update is the gradient of the global-batch loss, exactly as on
    one device with the whole batch.
    """
    if world_size() == 1:
        return tensor
    from sentence_transformers.util import all_gather_with_grad

    return all_gather_with_grad(tensor.contiguous())


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


@dataclasses.dataclass(frozen=True)
class ContrastiveSettings:
    """The options of a contrastive loss, validated once, when built (frozen: change one with
    ``dataclasses.replace``, which validates again). What :func:`contrastive_loss` computes with; the loss classes
    and :class:`ContrastiveObjective` build one and call it every step
    without checking again. The fields are :func:`loss_from_embeddings`'s options (``weince``: the
    :class:`~simcse_weince.WeinceConfig`, the paper's for None); the MNRL options are stored normalised by
    :func:`check_contrastive_options`."""

    loss: str = "weince"
    temperature: float = 0.05
    weince: WeinceConfig | None = None
    geometry: str = "simcse"
    gather: bool = False
    hardness_strength: float = 0.0
    directions: tuple[str, ...] = DEFAULT_DIRECTIONS
    partition_mode: str = "joint"
    hardness_mode: str | None = DEFAULT_HARDNESS_MODE
    similarity_fct: Callable[[Tensor, Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"unknown geometry {self.geometry!r}; expected one of {GEOMETRIES}")
        if self.weince is not None and not isinstance(self.weince, WeinceConfig):
            raise TypeError(f"weince must be a WeinceConfig, got {type(self.weince).__name__}")
        directions, partition_mode, hardness_mode = check_contrastive_options(
            self.directions, self.partition_mode, self.hardness_mode, self.hardness_strength
        )
        # simclr's negatives are all in-batch ones: hardness_mode in_batch_negatives is its only weighting
        non_default = directions != DEFAULT_DIRECTIONS or hardness_mode not in (None, "in_batch_negatives")
        if self.geometry != "simcse" and (non_default or partition_mode != "joint"):
            # simclr's 2N x 2N set treats both views alike already; MNRL's options are defined on (query, doc)
            raise ValueError(
                f"directions, partition_mode and hardness_mode are for the simcse geometry (text); the "
                f"{self.geometry} geometry (two views, no queries and documents) takes no directions, "
                f"partition_mode or hardness_mode; got directions={list(directions)}, "
                f"partition_mode={partition_mode!r}, hardness_mode={hardness_mode!r}"
            )
        if self.similarity_fct is not None and self.loss == "weince":
            raise ValueError(COSINE_ONLY)
        object.__setattr__(self, "directions", directions)
        object.__setattr__(self, "partition_mode", partition_mode)
        object.__setattr__(self, "hardness_mode", hardness_mode)
        object.__setattr__(self, "hardness_strength", float(self.hardness_strength))


def contrastive_loss(
    columns: Sequence[Tensor],
    settings: ContrastiveSettings,
    *,
    statistics: bool = False,
    mixing_weight: float | None = None,
) -> EmbeddingsLoss:
    """The loss of per-column embeddings under validated ``settings``: what :func:`loss_from_embeddings`, the loss
    classes and the trainers' objective compute. ``mixing_weight`` fixes WEINCE's λ for every anchor (the
    objective's check of the extreme cosines; None: the paper's λ, or 0 for InfoNCE). ``statistics`` needs cosine
    similarity (``settings.similarity_fct`` None), or it is refused."""
    if len(columns) > 2 and settings.geometry != "simcse":
        raise ValueError(f"hard negatives need the simcse geometry, not {settings.geometry!r}")
    if statistics and settings.similarity_fct is not None:
        raise ValueError(COSINE_ONLY)
    hardness_strength, hardness_mode = settings.hardness_strength, settings.hardness_mode
    if hardness_mode is None:  # MNRL: no hardness weighting, whatever hardness_strength says
        hardness_strength, hardness_mode = 0.0, "in_batch_negatives"
    by_directions = settings.directions != DEFAULT_DIRECTIONS or settings.similarity_fct is not None
    if mixing_weight is None and settings.loss == "infonce" and (statistics or by_directions):
        mixing_weight = 0.0  # InfoNCE is WEINCE at λ = 0 wherever the InfoNCE core does not compute it
    anchors, candidates = anchors_and_candidates(columns, settings.gather)
    if anchors.shape[0] < 2 and settings.geometry == "simcse":
        # A batch of one anchor (the last batch of an epoch without drop_last): its tail holds too few negatives
        # for WEINCE's statistics (none at all for a pair), so it trains at λ = 0, which is MNRL's loss (0 for a
        # pair), and reports no statistics
        value = directions_loss(
            anchors, candidates, directions=settings.directions, partition_mode=settings.partition_mode,
            temperature=settings.temperature, mixing_weight=0.0, hardness_mode=hardness_mode,
            hardness_strength=hardness_strength, similarity=settings.similarity_fct,
        )  # fmt: skip
        return EmbeddingsLoss(value, {}, anchors, candidates)
    if by_directions:
        value = directions_loss(
            anchors, candidates, directions=settings.directions, partition_mode=settings.partition_mode,
            temperature=settings.temperature, weince=settings.weince, mixing_weight=mixing_weight,
            hardness_mode=hardness_mode, hardness_strength=hardness_strength, similarity=settings.similarity_fct,
            return_stats=statistics,
        )  # fmt: skip
        if not statistics:
            return EmbeddingsLoss(value, {}, anchors, candidates)
        return EmbeddingsLoss(value[0], summarize_statistics(value[1]), anchors, candidates)
    options = {"temperature": settings.temperature, "geometry": settings.geometry,
               "hardness_strength": hardness_strength, "hardness_mode": hardness_mode}  # fmt: skip
    if settings.loss == "infonce" and mixing_weight is None:
        return EmbeddingsLoss(infonce_loss(anchors, candidates, **options), {}, anchors, candidates)
    if not statistics:
        value = weince_loss(anchors, candidates, weince=settings.weince, mixing_weight=mixing_weight, **options)
        return EmbeddingsLoss(value, {}, anchors, candidates)
    value, stats = weince_loss(anchors, candidates, weince=settings.weince, return_stats=True,
                               mixing_weight=mixing_weight, **options)  # fmt: skip
    return EmbeddingsLoss(value, summarize_statistics(stats), anchors, candidates)


@renamed_keywords(config="weince")
def loss_from_embeddings(
    columns: Sequence[Tensor],
    *,
    loss: str = "weince",
    temperature: float = 0.05,
    weince: WeinceConfig | None = None,
    geometry: str = "simcse",
    gather: bool = False,
    hardness_strength: float = 0.0,
    statistics: bool = False,
    directions: Sequence[str] = DEFAULT_DIRECTIONS,
    partition_mode: str = "joint",
    hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
    similarity_fct: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> EmbeddingsLoss:
    """The loss of per-column embeddings: column 0 the anchors, column 1 their positives, further columns hard
    negatives (row i of each is anchor i's own; every anchor sees all of them as extra candidates).

    Args:
        columns: one ``(N, D)`` tensor per column (at least two).
        loss: ``"weince"`` or ``"infonce"``.
        temperature: τ.
        weince: WEINCE's mixing-weight settings, a :class:`~simcse_weince.WeinceConfig` (the paper's for None;
            ``config=`` is its old, deprecated name).
        geometry: ``"simcse"`` (candidate i is anchor i's positive) or ``"simclr"`` (the 2N x 2N NT-Xent set of
            two views; no hard negatives).
        gather: gather every column from all processes (with gradient) first.
        hardness_strength: sentence-transformers' ``α · stop_grad(s_ij)`` on the negatives ``hardness_mode`` selects
            (0: off).
        statistics: also return WEINCE's λ statistics; for ``"infonce"`` they are those λ would have been computed
            from (the loss is then WEINCE's at λ = 0, which is InfoNCE).
        directions: sentence-transformers' MNRL ``directions`` (``query_to_doc``, ``query_to_query``,
            ``doc_to_query``, ``doc_to_doc``); what WEINCE does on each: :mod:`simcse_weince.weince.directions`.
        partition_mode: MNRL's ``"joint"`` or ``"per_direction"``.
        hardness_mode: MNRL's ``hardness_mode`` (``"in_batch_negatives"``, ``"hard_negatives"``,
            ``"all_negatives"``, or None, the default, as MNRL's: off, whatever ``hardness_strength`` says).
        similarity_fct: MNRL's ``similarity_fct`` for ``"infonce"`` (e.g. ``sentence_transformers.util.dot_score``);
            None is cosine, the only similarity WEINCE takes (its shortfall logit needs similarities bounded by 1).

    The options are checked on every call (by :class:`ContrastiveSettings`); a loss called every step builds its
    settings once and calls :func:`contrastive_loss`.
    """
    settings = ContrastiveSettings(
        loss=loss, temperature=temperature, weince=weince, geometry=geometry, gather=gather,
        hardness_strength=hardness_strength, directions=directions, partition_mode=partition_mode,
        hardness_mode=hardness_mode, similarity_fct=similarity_fct,
    )  # fmt: skip
    return contrastive_loss(columns, settings, statistics=statistics)


class ContrastiveObjective:
    """The contrastive objective both trainers optimise, WEINCE or InfoNCE by name, on two views' embeddings:
    ``objective(first_view, second_view, *hard_negatives) -> (loss, statistics)``.

    ``geometry="simcse"`` (text): anchors are the first views, candidate *i* is anchor *i*'s positive and the other
    second views are its negatives. ``geometry="simclr"`` (vision): the 2N x 2N NT-Xent set of both views. With
    several processes both views are gathered with their gradient first, so the negatives and WEINCE's tail
    statistics span the global batch and every process computes the same loss. The loss is computed in float32
    with autocast off, whatever the training precision (tail statistics need it). Embeddings to loss is
    :func:`contrastive_loss`, the sentence-transformers losses' path too.
    ``extra_terms`` is an optional module added to the loss (the authors' top-M terms for vision,
    docs/method.md#vision-the-top-m-extra-terms).
    ``hardness_strength`` adds sentence-transformers' hard-negative weighting to either loss
    (:func:`~simcse_weince.weince.infonce_loss`; for WEINCE it is ours, not the paper's). ``directions``,
    ``partition_mode`` and ``hardness_mode`` are sentence-transformers' ``MultipleNegativesRankingLoss`` options
    (simcse geometry only; the defaults are the loss above).

    ``statistics`` holds WEINCE's λ statistics (:data:`simcse_weince.weince.STATISTIC_KEYS`) as detached 0-d
    tensors, so that a step costs one device synchronisation for everything it logs; ``{}`` for InfoNCE or when
    called with ``statistics=False`` (computing them costs a little). The extra terms add theirs.

    Every option is checked once, here (:class:`ContrastiveSettings`, then :meth:`check_extremes`); a call only
    computes. It lives beside :func:`contrastive_loss`, so that a training step reaches the core from here.
    """

    def __init__(
        self,
        loss: str = "weince",
        temperature: float = 0.05,
        *,
        weince: WeinceConfig | None = None,
        geometry: str = "simcse",
        gather: bool = True,
        extra_terms=None,
        hardness_strength: float = 0.0,
        directions: tuple[str, ...] = DEFAULT_DIRECTIONS,
        partition_mode: str = "joint",
        hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
    ):
        self.settings = ContrastiveSettings(
            loss=loss, temperature=float(temperature), weince=weince or WeinceConfig(), geometry=geometry,
            gather=gather, hardness_strength=hardness_strength,  # LLaVE's weighting of hard negatives; 0: plain
            directions=directions, partition_mode=partition_mode, hardness_mode=hardness_mode,
        )  # fmt: skip
        self.extra_terms = extra_terms
        self.check_extremes()

    @property
    def loss(self) -> str:
        return self.settings.loss

    @property
    def temperature(self) -> float:
        return self.settings.temperature

    def check_extremes(self) -> None:
        """Refuse settings the loss cannot train with (``ValueError``, before any file is written): the loss and
        its gradient at the extreme cosines, +1 (duplicates: positives and negatives alike) and -1, for λ = 0 and
        λ = 1, must be finite in float32. ``--temperature 1e-300`` or ``--hardness-strength 1e300`` pass every
        range check and would otherwise fail at step 1. The loss is the one training computes
        (:func:`contrastive_loss`), on this process's rows only."""
        basis = torch.eye(3)
        anchors = torch.stack([basis[0], basis[0], -basis[0], basis[1]]).requires_grad_(True)
        candidates = torch.stack([basis[0], basis[0], basis[0], -basis[1]])
        settings = dataclasses.replace(self.settings, gather=False)
        with torch.autocast(device_type="cpu", enabled=False):
            for mixing_weight in (0.0, 1.0) if settings.loss == "weince" else (None,):
                try:
                    loss = contrastive_loss([anchors, candidates], settings, mixing_weight=mixing_weight).loss
                    (grad,) = torch.autograd.grad(loss, anchors)
                    finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
                except (RuntimeError, FloatingPointError, ValueError) as error:
                    if isinstance(error, ValueError) and "not finite" not in str(error):
                        raise  # a bad value the core names itself (a temperature <= 0, ...)
                    finite = False
                if not finite:
                    raise ValueError(
                        f"the {settings.loss} loss with temperature {settings.temperature:g} and hardness strength "
                        f"{settings.hardness_strength:g} is not finite at cosine similarities of ±1 (its logits "
                        f"overflow float32), so training would stop at its first step; use a larger temperature "
                        f"(0.05 is SimCSE's) or a smaller hardness strength (9 is sentence-transformers')"
                    )

    def __call__(
        self, first_view: torch.Tensor, second_view: torch.Tensor, *hard_negatives: torch.Tensor,
        statistics: bool = True,
    ):  # fmt: skip
        """``hard_negatives`` (simcse geometry): one tensor per hard-negative column, row i being anchor i's own
        hard negative; every anchor sees all of them as extra candidates (SimCSE's supervised loss). Half-precision
        views are cast to float32 once, by :func:`anchors_and_candidates`."""
        result = contrastive_loss(
            [first_view, second_view, *hard_negatives], self.settings,
            statistics=statistics and self.settings.loss == "weince",
        )  # fmt: skip
        loss, batch_statistics = result.loss, dict(result.statistics)
        if self.extra_terms is not None:  # on the gathered views (simclr geometry: no hard negatives)
            with torch.autocast(device_type=loss.device.type, enabled=False):
                loss = loss + self.extra_terms(result.anchors, result.candidates, temperature=self.temperature)
            if statistics:
                batch_statistics.update(self.extra_terms.last_statistics)
        return loss, batch_statistics


def read_statistics(last: EmbeddingsLoss | None) -> dict[str, float]:
    """The statistics of a loss's last batch as floats; a non-finite last loss is reported here with the culprit
    rows. The check is deferred to this read (one device synchronisation) so that training steps do not wait."""
    if last is None:
        return {}
    if not torch.isfinite(last.loss).item():
        raise_non_finite(last.anchors, last.candidates)
    return {key: float(last.statistics[key]) for key in STATISTIC_KEYS} if last.statistics else {}
