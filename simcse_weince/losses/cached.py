"""GradCache versions of the sentence-transformers losses: `CachedWeinceLoss` and `CachedInfoNCELoss`.

They embed the batch a mini-batch at a time through sentence-transformers' ``CachedLossMixin`` (which holds
the three GradCache steps and the RNG replay) and compute the loss of the whole batch with the wrapped
:class:`~simcse_weince.WeinceLoss` / :class:`~simcse_weince.InfoNCELoss`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from sentence_transformers.base.losses.gradcache import CachedLossMixin, has_static_embedding_input
from torch import Tensor, nn

from simcse_weince.losses._columns import ColumnsLoss
from simcse_weince.losses.infonce import SIMCSE_CITATION, InfoNCELoss
from simcse_weince.losses.weince import WEINCE_CITATION, WeinceLoss
from simcse_weince.weince import WeinceConfig

GRADCACHE_CITATION = """
@misc{gao2021scaling,
    title={Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup},
    author={Luyu Gao and Yunyi Zhang and Jiawei Han and Jamie Callan},
    year={2021},
    eprint={2101.06983},
    archivePrefix={arXiv},
    primaryClass={cs.LG}
}
"""


def _check_mini_batch_size(mini_batch_size) -> int:
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int) or mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be a positive integer, got {mini_batch_size!r}")
    return mini_batch_size


def _check_mini_batch_num_tokens(mini_batch_num_tokens) -> int | None:
    if mini_batch_num_tokens is not None and mini_batch_num_tokens <= 0:
        raise ValueError(f"mini_batch_num_tokens must be a positive integer or None, got {mini_batch_num_tokens!r}")
    return mini_batch_num_tokens


class _CachedLoss(CachedLossMixin, nn.Module):
    """GradCache around a loss of this package (what :class:`CachedWeinceLoss` and :class:`CachedInfoNCELoss`
    share, as siblings): the batch is embedded a mini-batch at a time by sentence-transformers'
    ``CachedLossMixin``, and the wrapped loss computes the loss of the whole batch."""

    def __init__(
        self, model: nn.Module, wrapped: Callable[[], ColumnsLoss], *, mini_batch_size: int,
        mini_batch_num_tokens: int | None, show_progress_bar: bool,
    ) -> None:  # fmt: skip
        super().__init__()
        if has_static_embedding_input(model):
            raise ValueError(
                f"{type(self).__name__} cannot split the inputs of a StaticEmbedding model into mini-batches; "
                f"use {type(self).__name__.removeprefix('Cached')} instead"
            )
        self.mini_batch_num_tokens = _check_mini_batch_num_tokens(mini_batch_num_tokens)
        self.model = model
        # The wrapped loss owns and validates the loss's hyper-parameters and computes its diagnostics.
        self.loss = wrapped()
        self.mini_batch_size = _check_mini_batch_size(mini_batch_size)
        self.show_progress_bar = show_progress_bar

    @property
    def temperature(self) -> float:
        return self.loss.temperature

    @property
    def config(self) -> WeinceConfig:
        return self.loss.config

    @property
    def gather_across_devices(self) -> bool:
        return self.loss.gather_across_devices

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError(f"{type(self).__name__} needs at least one text column, got none")
        if len(sentence_features) == 1:
            # Unsupervised SimCSE: the column is embedded twice; each pass draws its own dropout masks, and the
            # mixin keeps and replays the RNG state of every mini-batch of both passes. A shallow copy, because
            # modules may edit a feature dict in place while embedding it.
            sentence_features = [sentence_features[0], dict(sentence_features[0])]
        return self.forward_cached(sentence_features, labels)

    def calculate_loss(
        self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False
    ) -> Tensor:
        """The wrapped loss of the whole batch from the per-mini-batch embeddings (step 2 of GradCache)."""
        embeddings = [reps_mbs[0] if len(reps_mbs) == 1 else torch.cat(reps_mbs) for reps_mbs in reps]
        loss = self.loss.compute_loss_from_embeddings(embeddings, labels)
        if with_backward:
            loss.backward()
            loss = loss.detach()
        return loss

    @property
    def last_diagnostics(self) -> dict[str, float]:
        """The wrapped loss's diagnostics of the last batch: mean λ, share λ > 0.5, ρ_0, mean ΔAIC, mean β̂."""
        return self.loss.last_diagnostics

    def get_config_dict(self) -> dict[str, Any]:
        return {
            **self.loss.get_config_dict(),
            "mini_batch_size": self.mini_batch_size,
            "mini_batch_num_tokens": self.mini_batch_num_tokens,
        }


class CachedWeinceLoss(_CachedLoss):
    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        *,
        config: WeinceConfig | None = None,
        mini_batch_size: int = 32,
        mini_batch_num_tokens: int | None = None,
        gather_across_devices: bool = False,
        show_progress_bar: bool = False,
        hardness_strength: float = 0.0,
    ) -> None:
        """:class:`~simcse_weince.WeinceLoss` with GradCache (https://huggingface.co/papers/2101.06983): a batch
        far larger than memory would allow, with the same loss and gradients.

        In-batch negatives tie the examples of a batch together, so gradient accumulation cannot split it
        without losing negatives, and WEINCE's tail statistics fit each anchor's hardest ~10% of negatives,
        which a small batch leaves with few points. GradCache splits only the *encoder* work:

            (1) every mini-batch is embedded without a computation graph, and the RNG state of each forward
                pass is kept;
            (2) the WEINCE loss of the whole batch is computed from those embeddings and back-propagated up to
                them; their gradients are cached;
            (3) every mini-batch is embedded again, with a graph and the RNG state of (1) replayed (the same
                dropout masks), and the cached gradients are back-propagated through it.

        Only one mini-batch of encoder activations is alive at a time; the loss stage holds the batch's
        embeddings and its similarity matrix. The encoder runs twice, about 1.2-2x the time of
        :class:`~simcse_weince.WeinceLoss`. Steps (1)-(3) are sentence-transformers' ``CachedLossMixin``.

        With a **single text column** (unsupervised SimCSE) the column is embedded in two passes, each with its
        own dropout masks; the positive of a sentence is its embedding from the other pass. Step (3) replays
        both passes exactly.

        Args:
            model: the SentenceTransformer to train.
            temperature: τ of the InfoNCE part (SimCSE: 0.05).
            config: :class:`~simcse_weince.WeinceConfig` (mixing-weight hyper-parameters; default: the paper's).
            mini_batch_size: sentences per encoder pass; bounds the activation memory. The batch size
                (the negatives) is set by the data loader as usual.
            mini_batch_num_tokens: if set, mini-batches are packed by their number of non-padding tokens instead
                of by ``mini_batch_size`` sentences.
            gather_across_devices: gather embeddings from all processes (with gradient) before the loss, so that
                negatives and the tail statistics span the global batch.
            show_progress_bar: show a progress bar over the mini-batches.
            hardness_strength: α > 0 adds sentence-transformers' hard-negative weighting to WEINCE's logits, as
                :class:`~simcse_weince.WeinceLoss`'s option of that name (**ours**, off by default).

        After each step, :attr:`last_diagnostics` holds mean λ, the share of anchors with λ > 0.5, ρ_0, mean ΔAIC
        and mean β̂ of the batch, as for :class:`~simcse_weince.WeinceLoss`.

        References:
            - Erol et al., *When Softmax Fails at the Top: Extreme-Value Corrections for InfoNCE*, ICML 2026
              (arXiv:2606.00262).
            - Gao et al., *Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup*, RepL4NLP 2021
              (arXiv:2101.06983).

        Requirements:
            1. Batches of at least 2 examples.
            2. A model whose inputs can be sliced along the batch (not a ``StaticEmbedding`` model).

        Inputs:
            +-------------------------------------------------+--------+
            | Inputs                                          | Labels |
            +=================================================+========+
            | (anchor,) single sentences: unsupervised SimCSE | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive) pairs                        | none   |
            +-------------------------------------------------+--------+
            | (anchor, positive, negative_1, ..., negative_n) | none   |
            +-------------------------------------------------+--------+

        Relations:
            - Equivalent to :class:`~simcse_weince.WeinceLoss` (same loss and gradients with dropout off; with
              dropout on, the same distribution of masks), but with memory bounded by ``mini_batch_size``.
            - :class:`CachedInfoNCELoss` is its λ = 0 baseline, the counterpart of
              ``CachedMultipleNegativesRankingLoss(model, scale=1/temperature)``.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import (
                    SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments,
                )
                from simcse_weince import CachedWeinceLoss

                model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
                sentences = [line.strip() for line in open("wiki1m_head.txt") if line.strip()][:4096]
                train_dataset = Dataset.from_dict({"text": sentences})
                loss = CachedWeinceLoss(model, mini_batch_size=64)  # 1024 negatives, memory of 64
                args = SentenceTransformerTrainingArguments("out", per_device_train_batch_size=1024)
                trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_dataset, loss=loss)
                trainer.train()
                print(loss.last_diagnostics)
        """
        super().__init__(
            model,
            lambda: WeinceLoss(
                model,
                temperature,
                config=config,
                gather_across_devices=gather_across_devices,
                hardness_strength=hardness_strength,
            ),
            mini_batch_size=mini_batch_size,
            mini_batch_num_tokens=mini_batch_num_tokens,
            show_progress_bar=show_progress_bar,
        )

    @property
    def citation(self) -> str:
        return WEINCE_CITATION + GRADCACHE_CITATION


class CachedInfoNCELoss(_CachedLoss):
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
