"""InfoNCE with GradCache as a sentence-transformers loss: :class:`CachedInfoNCELoss`."""

from __future__ import annotations

from simcse_weince.losses._cached import GRADCACHE_CITATION, CachedColumnsLoss
from simcse_weince.losses.infonce_loss import InfoNCELoss


class CachedInfoNCELoss(CachedColumnsLoss):
    """The InfoNCE baseline (λ = 0) of :class:`CachedWeinceLoss`: :class:`~simcse_weince.InfoNCELoss` with
    GradCache, on the same inputs (a single text column is unsupervised SimCSE).

    Args:
        model: the SentenceTransformer to train.
        scale: 1 / τ, CMNRL's (default 20: τ = 0.05, SimCSE's).
        similarity_fct: as MNRL's (default cosine), as :class:`~simcse_weince.InfoNCELoss`.
        directions: MNRL's similarity blocks (``"query_to_doc"``, required; ``"query_to_query"``,
            ``"doc_to_query"``, ``"doc_to_doc"``), as :class:`~simcse_weince.InfoNCELoss`.
        partition_mode: ``"joint"`` (default) or ``"per_direction"``, as :class:`~simcse_weince.InfoNCELoss`.
        hardness_mode: ``"in_batch_negatives"``, ``"hard_negatives"``, ``"all_negatives"`` or None (the default,
            as CMNRL's: off), as :class:`~simcse_weince.InfoNCELoss`.
        hardness_strength: α ≥ 0 of the hardness weighting (default 0: off).
        mini_batch_size: sentences per encoder pass.
        mini_batch_num_tokens: if set, pack mini-batches by non-padding tokens instead.
        gather_across_devices: gather embeddings from all processes (with gradient) before the loss.
        show_progress_bar: show a progress bar over the mini-batches.
        temperature, weince, track_statistics: keyword-only, as :class:`~simcse_weince.InfoNCELoss`'s.

    The positional arguments are CMNRL's, in CMNRL's order. Every option is an assignable attribute (checked
    when assigned, used from the next call on), forwarded to the wrapped :class:`~simcse_weince.InfoNCELoss`
    (``loss.loss``), which cites the recipe's paper on the model card; this class cites GradCache.

    Relations:
        - Equivalent to :class:`~simcse_weince.InfoNCELoss` with memory bounded by ``mini_batch_size``, and to
          ``CachedMultipleNegativesRankingLoss(model, **options)`` on two or more columns, for every option
          (``tests/test_mnrl_equivalence.py``).

    Example:
        ::

            from simcse_weince import CachedInfoNCELoss
            loss = CachedInfoNCELoss(model, mini_batch_size=64)
    """

    wrapped_class = InfoNCELoss

    @property
    def citation(self) -> str:
        """GradCache's paper; the wrapped loss (``loss.loss``) cites the recipe's and SimCSE's."""
        return GRADCACHE_CITATION
