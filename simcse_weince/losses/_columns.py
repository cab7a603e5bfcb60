"""What :class:`~simcse_weince.WeinceLoss` and :class:`~simcse_weince.InfoNCELoss` share: their state and
``forward`` (:class:`ColumnsLoss`: text columns -> embeddings -> anchors and candidates -> the loss), the
temperature check, and the lazy finiteness check of a loss."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from sentence_transformers.base.losses.merged_forward import embed_columns as _embed_columns
from torch import Tensor, nn

from simcse_weince.distributed import gather_with_grad
from simcse_weince.weince import DIAGNOSTIC_KEYS, WeinceConfig, raise_non_finite


def check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return float(temperature)


def check_config(config) -> WeinceConfig:
    """The loss's WeinceConfig (the paper's defaults for None); anything else is refused by name."""
    if config is not None and not isinstance(config, WeinceConfig):
        raise TypeError(f"config must be a WeinceConfig, got {type(config).__name__}")
    return config or WeinceConfig()


def embed_columns(model: nn.Module, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
    """Embed every column; one column means unsupervised SimCSE: the same text twice, two dropout masks."""
    if len(sentence_features) == 1:
        # The duplicated column goes through the encoder in one forward pass of 2N rows, as SimCSE does;
        # dropout draws independent masks for the two copies.
        sentence_features = [sentence_features[0], sentence_features[0]]
        return _embed_columns(model, sentence_features, separate_first=False)
    return _embed_columns(model, sentence_features)


def anchors_and_candidates(embeddings: list[Tensor], gather_across_devices: bool) -> tuple[Tensor, Tensor]:
    """Column 0 are the anchors; columns 1.. (positives, then hard negatives) stacked are every anchor's candidates.

    With ``gather_across_devices`` every column is gathered (with gradient) from all processes first, so that the
    negatives span the global batch.
    """
    if len(embeddings) < 2:
        raise ValueError(f"expected anchor and positive embeddings, got {len(embeddings)} column(s)")
    anchors, candidate_columns = embeddings[0], list(embeddings[1:])
    if gather_across_devices:
        anchors = gather_with_grad(anchors)
        candidate_columns = [gather_with_grad(column) for column in candidate_columns]
    candidates = torch.cat(candidate_columns, dim=0)
    return anchors, candidates


def read_diagnostics(
    last_check: tuple[Tensor, Tensor, Tensor] | None, last_summary: dict[str, Tensor] | None
) -> dict[str, float]:
    """The last step's diagnostics as floats; a non-finite last loss is reported here with the culprit rows.

    The check is deferred to this read (one device synchronisation) so that training steps do not wait for it.
    """
    if last_check is not None:
        loss, anchors, candidates = last_check
        if not torch.isfinite(loss).item():
            raise_non_finite(anchors, candidates)
    if last_summary is None:
        return {}
    return {key: float(last_summary[key]) for key in DIAGNOSTIC_KEYS}


class ColumnsLoss(nn.Module):
    """A contrastive loss over text columns (column 0 anchors, column 1 positives, further columns hard negatives;
    one column: unsupervised SimCSE). A subclass computes the loss from the anchors and the stacked candidates
    (:meth:`loss_from_candidates`) and may keep WEINCE's statistics of the batch in ``_last_summary``."""

    def __init__(
        self, model: nn.Module, temperature: float, *, config: WeinceConfig | None, gather_across_devices: bool
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.model = model
        self.config = check_config(config)
        self.gather_across_devices = gather_across_devices
        self._last_summary: dict[str, Tensor] | None = None
        self._last_check: tuple[Tensor, Tensor, Tensor] | None = None

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError(f"{type(self).__name__} needs at least one text column, got none")
        return self.compute_loss_from_embeddings(embed_columns(self.model, sentence_features), labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """Loss from per-column embeddings: column 0 are anchors, column 1 positives, further columns negatives."""
        anchors, candidates = anchors_and_candidates(embeddings, self.gather_across_devices)
        loss = self.loss_from_candidates(anchors, candidates)
        # Kept for a lazy finiteness check when the diagnostics are read (no per-step device synchronisation).
        self._last_check = (loss.detach(), anchors.detach(), candidates.detach())
        return loss

    def loss_from_candidates(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        raise NotImplementedError

    @property
    def last_diagnostics(self) -> dict[str, float]:
        """The last batch's mean λ, share λ > 0.5, ρ_0, mean ΔAIC and mean β̂ (empty before the first step, and for
        InfoNCE without ``track_statistics``). Reading them synchronises the device, once; a non-finite last loss
        is reported here with the culprit rows."""
        return read_diagnostics(self._last_check, self._last_summary)
