"""InfoNCE with GradCache as a sentence-transformers loss: :class:`CachedInfoNCELoss`."""

from __future__ import annotations

from simcse_weince.losses._cached import GRADCACHE_CITATION, CachedColumnsLoss
from simcse_weince.losses.infonce_loss import SIMCSE_CITATION, InfoNCELoss


class CachedInfoNCELoss(CachedColumnsLoss):
    """The InfoNCE baseline (λ = 0) of :class:`CachedWeinceLoss`: :class:`~simcse_weince.InfoNCELoss` with
    GradCache, on the same inputs (a single text column is unsupervised SimCSE).

    Args:
        model: the SentenceTransformer to train.
        temperature: τ (default 0.05, SimCSE's; MNRL's ``scale=20``).
        scale: sentence-transformers' spelling of 1 / τ; give ``temperature`` or ``scale``, not both.
        similarity_fct: as MNRL's (default cosine), as :class:`~simcse_weince.InfoNCELoss`.
        directions: MNRL's similarity blocks (``"query_to_doc"``, required; ``"query_to_query"``,
            ``"doc_to_query"``, ``"doc_to_doc"``), as :class:`~simcse_weince.InfoNCELoss`.
        partition_mode: ``"joint"`` (default) or ``"per_direction"``, as :class:`~simcse_weince.InfoNCELoss`.
        hardness_mode: ``"in_batch_negatives"`` (the default here), ``"hard_negatives"``, ``"all_negatives"`` or
            None (off), as :class:`~simcse_weince.InfoNCELoss`.
        hardness_strength: α ≥ 0 of the hardness weighting (default 0: off).
        mini_batch_size: sentences per encoder pass.
        mini_batch_num_tokens: if set, pack mini-batches by non-padding tokens instead.
        gather_across_devices: gather embeddings from all processes (with gradient) before the loss.
        show_progress_bar: show a progress bar over the mini-batches.

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
        return SIMCSE_CITATION + GRADCACHE_CITATION
