"""What :class:`~simcse_weince.WeinceLoss` and :class:`~simcse_weince.InfoNCELoss` share: text columns ->
embeddings -> anchors and candidates, the temperature check, and the lazy finiteness check of a loss."""

from __future__ import annotations

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
