"""What :class:`~simcse_weince.WeinceLoss` and :class:`~simcse_weince.InfoNCELoss` share: their state and
``forward`` (:class:`ColumnsLoss`: text columns -> embeddings -> :func:`~simcse_weince.losses.from_embeddings.
loss_from_embeddings`, the path the trainers' objective takes too), the temperature check, and the lazy
finiteness check of a loss."""

from __future__ import annotations

from collections.abc import Iterable

from sentence_transformers.base.losses.merged_forward import embed_columns as _embed_columns
from torch import Tensor, nn

from simcse_weince.losses.from_embeddings import EmbeddingsLoss, loss_from_embeddings, read_diagnostics
from simcse_weince.weince.loss import WeinceConfig


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


class ColumnsLoss(nn.Module):
    """A contrastive loss over text columns (column 0 anchors, column 1 positives, further columns hard negatives;
    one column: unsupervised SimCSE). A subclass names its loss (``loss_name``: ``"weince"``, ``"infonce"``) and
    sets ``hardness_strength`` and ``track_statistics`` (whether WEINCE's statistics of each batch are kept)."""

    loss_name: str
    hardness_strength: float = 0.0
    track_statistics: bool = True

    def __init__(
        self, model: nn.Module, temperature: float, *, config: WeinceConfig | None, gather_across_devices: bool
    ) -> None:
        super().__init__()
        self.temperature = check_temperature(temperature)
        self.model = model
        self.config = check_config(config)
        self.gather_across_devices = gather_across_devices
        # the last batch's loss, columns and statistics, for a lazy finiteness check when the diagnostics are read
        # (no per-step device synchronisation)
        self._last: EmbeddingsLoss | None = None

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError(f"{type(self).__name__} needs at least one text column, got none")
        return self.compute_loss_from_embeddings(embed_columns(self.model, sentence_features), labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """Loss from per-column embeddings: column 0 are anchors, column 1 positives, further columns negatives."""
        result = loss_from_embeddings(
            embeddings, loss=self.loss_name, temperature=self.temperature, config=self.config,
            gather=self.gather_across_devices, hardness_strength=self.hardness_strength,
            statistics=self.track_statistics,
        )  # fmt: skip
        self._last = EmbeddingsLoss(result.loss.detach(), result.statistics, result.anchors.detach(),
                                    result.candidates.detach())  # fmt: skip
        return result.loss

    @property
    def last_diagnostics(self) -> dict[str, float]:
        """The last batch's mean λ, share λ > 0.5, ρ_0, mean ΔAIC and mean β̂ (empty before the first step, and for
        InfoNCE without ``track_statistics``). Reading them synchronises the device, once; a non-finite last loss
        is reported here with the culprit rows."""
        return read_diagnostics(self._last)
