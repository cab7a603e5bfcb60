"""InfoNCE with GradCache as a sentence-transformers loss: :class:`CachedInfoNCELoss`."""

from __future__ import annotations

from torch import nn

from simcse_weince.losses._cached import GRADCACHE_CITATION, CachedColumnsLoss
from simcse_weince.losses.infonce_loss import SIMCSE_CITATION, InfoNCELoss


class CachedInfoNCELoss(CachedColumnsLoss):
    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        *,
        mini_batch_size: int = 32,
        mini_batch_num_tokens: int | None = None,
        gather_across_devices: bool = False,
        show_progress_bar: bool = False,
    ) -> None:
        """The InfoNCE baseline (λ = 0) of :class:`CachedWeinceLoss`: :class:`~simcse_weince.InfoNCELoss` with
        GradCache, on the same inputs (a single text column is unsupervised SimCSE).

        Args:
            model: the SentenceTransformer to train.
            temperature: τ (SimCSE: 0.05).
            mini_batch_size: sentences per encoder pass.
            mini_batch_num_tokens: if set, pack mini-batches by non-padding tokens instead.
            gather_across_devices: gather embeddings from all processes (with gradient) before the loss.
            show_progress_bar: show a progress bar over the mini-batches.

        Relations:
            - Equivalent to :class:`~simcse_weince.InfoNCELoss` with memory bounded by ``mini_batch_size``, and to
              ``CachedMultipleNegativesRankingLoss(model, scale=1/temperature)`` on two or more columns.

        Example:
            ::

                from simcse_weince import CachedInfoNCELoss
                loss = CachedInfoNCELoss(model, mini_batch_size=64)
        """
        super().__init__(
            model,
            lambda: InfoNCELoss(model, temperature, gather_across_devices=gather_across_devices),
            mini_batch_size=mini_batch_size,
            mini_batch_num_tokens=mini_batch_num_tokens,
            show_progress_bar=show_progress_bar,
        )

    @property
    def citation(self) -> str:
        return SIMCSE_CITATION + GRADCACHE_CITATION
