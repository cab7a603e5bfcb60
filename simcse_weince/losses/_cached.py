"""What the GradCache losses :class:`~simcse_weince.CachedWeinceLoss` and :class:`~simcse_weince.CachedInfoNCELoss`
share: :class:`CachedColumnsLoss`, which embeds the batch a mini-batch at a time through sentence-transformers'
``CachedLossMixin`` (the three GradCache steps and the RNG replay) and computes the loss of the whole batch with
the wrapped :class:`~simcse_weince.WeinceLoss` / :class:`~simcse_weince.InfoNCELoss`; the option checks; the
citation."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from sentence_transformers.base.losses.gradcache import CachedLossMixin, has_static_embedding_input
from sentence_transformers.util import cos_sim
from torch import Tensor, nn

from simcse_weince.deprecation import renamed_attribute
from simcse_weince.losses._columns import ColumnsLoss, fill_shared_sections
from simcse_weince.losses.from_embeddings import DEFAULT_DIRECTIONS, DEFAULT_HARDNESS_MODE

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


def forwarded(name: str, settable: bool = False) -> property:
    """An attribute of the wrapped loss, read (and, if ``settable``, assigned) through the cached loss."""

    def assign(self, value) -> None:
        setattr(self.loss, name, value)

    return property(lambda self: getattr(self.loss, name), assign if settable else None,
                    doc=f"The wrapped loss's ``{name}``.")  # fmt: skip


class CachedColumnsLoss(CachedLossMixin, nn.Module):
    """GradCache around a loss of this package (what :class:`CachedWeinceLoss` and :class:`CachedInfoNCELoss`
    share, as siblings): the batch is embedded a mini-batch at a time by sentence-transformers'
    ``CachedLossMixin``, and the wrapped loss computes the loss of the whole batch."""

    wrapped_class: type[ColumnsLoss]  # the loss of the whole batch

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.__doc__ = fill_shared_sections(cls.__doc__)

    def __init__(
        self,
        model: nn.Module,
        scale: float | None = None,
        similarity_fct: Callable[[Tensor, Tensor], Tensor] = cos_sim,
        mini_batch_size: int = 32,
        mini_batch_num_tokens: int | None = None,
        gather_across_devices: bool = False,
        directions: Sequence[str] = DEFAULT_DIRECTIONS,
        partition_mode: str = "joint",
        show_progress_bar: bool = False,
        hardness_mode: str | None = DEFAULT_HARDNESS_MODE,
        hardness_strength: float = 0.0,
        **options: Any,
    ) -> None:
        """CachedMultipleNegativesRankingLoss's signature; ``options``: the wrapped loss's own, keyword-only
        (``temperature``, ``weince``, ``track_statistics``). The wrapped loss (``wrapped_class``) checks them."""
        super().__init__()
        if has_static_embedding_input(model):
            raise ValueError(
                f"{type(self).__name__} cannot split the inputs of a StaticEmbedding model into mini-batches; "
                f"use {type(self).__name__.removeprefix('Cached')} instead"
            )
        self.mini_batch_num_tokens = _check_mini_batch_num_tokens(mini_batch_num_tokens)
        self.model = model
        # The wrapped loss owns and validates the loss's hyper-parameters and computes its statistics.
        self.loss = self.wrapped_class(
            model, scale, similarity_fct, gather_across_devices, directions, partition_mode, hardness_mode,
            hardness_strength, **options,
        )  # fmt: skip
        self.mini_batch_size = _check_mini_batch_size(mini_batch_size)
        self.show_progress_bar = show_progress_bar

    def __setattr__(self, name: str, value: Any) -> None:
        # an option is the wrapped loss's (checked there): nn.Module.__setattr__ would file an nn.Module value
        # (a similarity_fct) under this module's _modules instead
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    temperature = forwarded("temperature", settable=True)
    scale = forwarded("scale", settable=True)
    settings = forwarded("settings")
    similarity_fct = forwarded("similarity_fct", settable=True)
    directions = forwarded("directions", settable=True)
    partition_mode = forwarded("partition_mode", settable=True)
    hardness_mode = forwarded("hardness_mode", settable=True)
    hardness_strength = forwarded("hardness_strength", settable=True)
    weince = forwarded("weince", settable=True)
    config = renamed_attribute("config", "weince")
    gather_across_devices = forwarded("gather_across_devices", settable=True)
    track_statistics = forwarded("track_statistics", settable=True)
    recipe_citation = forwarded("recipe_citation")
    last_batch = forwarded("last_batch")
    last_batch_training = forwarded("last_batch_training")
    last_statistics = forwarded("last_statistics")
    last_diagnostics = renamed_attribute("last_diagnostics", "last_statistics")

    @property
    def mini_batch_size(self) -> int:
        """Sentences per encoder pass (assignable: checked again)."""
        return self._mini_batch_size

    @mini_batch_size.setter
    def mini_batch_size(self, value: int) -> None:
        self._mini_batch_size = _check_mini_batch_size(value)

    @property
    def mini_batch_num_tokens(self) -> int | None:
        """If set, mini-batches are packed by non-padding tokens (assignable: checked again)."""
        return self._mini_batch_num_tokens

    @mini_batch_num_tokens.setter
    def mini_batch_num_tokens(self, value: int | None) -> None:
        self._mini_batch_num_tokens = _check_mini_batch_num_tokens(value)

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

    def get_config_dict(self) -> dict[str, Any]:
        """CachedMultipleNegativesRankingLoss's keys, in its order, then the wrapped loss's own."""
        options = self.loss.get_config_dict()
        mnrl = {key: options.pop(key) for key in ("scale", "similarity_fct")}
        return {**mnrl, "mini_batch_size": self.mini_batch_size, "mini_batch_num_tokens": self.mini_batch_num_tokens,
                **options}  # fmt: skip
