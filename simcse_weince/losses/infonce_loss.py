"""The InfoNCE baseline as a sentence-transformers loss: :class:`InfoNCELoss`."""

from __future__ import annotations

from typing import Any

from torch import nn

from simcse_weince.losses._columns import ColumnsLoss
from simcse_weince.weince.loss import WeinceConfig

SIMCSE_CITATION = """
@inproceedings{gao2021simcse,
    title={{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
    author={Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
    booktitle={Empirical Methods in Natural Language Processing (EMNLP)},
    year={2021},
}
"""


class InfoNCELoss(ColumnsLoss):
    loss_name = "infonce"

    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        *,
        gather_across_devices: bool = False,
        track_statistics: bool = False,
        config: WeinceConfig | None = None,
    ) -> None:
        """InfoNCE (SimCSE's loss): for every anchor, a cross-entropy over its positive and all other candidates of
        the batch, with cosine similarities divided by the temperature τ. It is WEINCE's λ = 0 baseline, on the same
        inputs and with the same unsupervised-SimCSE handling as :class:`~simcse_weince.WeinceLoss`.

        With a **single text column** the positive of every sentence is the same sentence encoded a second time
        with a different dropout mask: unsupervised SimCSE.

        Args:
            model: the SentenceTransformer to train.
            temperature: τ (SimCSE: 0.05).
            gather_across_devices: gather embeddings from all processes (with gradient) before the loss.
            track_statistics: also compute WEINCE's tail statistics (without using them) so that
                :attr:`last_diagnostics` shows what WEINCE would have done; off by default (pure InfoNCE cost).
            config: the :class:`~simcse_weince.WeinceConfig` used for those statistics.

        The options after ``temperature`` are keyword-only: the losses of this package take different options, and
        a positional call could bind a value to another loss's option.

        References:
            - Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings*, EMNLP 2021.
            - van den Oord et al., *Representation Learning with Contrastive Predictive Coding*, 2018
              (arXiv:1807.03748).

        Requirements:
            Batches of at least 2 examples.

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
            - Equal to ``MultipleNegativesRankingLoss(model, scale=1/temperature)`` on two or more columns.
            - :class:`~simcse_weince.WeinceLoss` is the loss it is the baseline of;
              :class:`~simcse_weince.CachedInfoNCELoss` is its GradCache version.

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
                from simcse_weince import InfoNCELoss

                model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
                train_dataset = Dataset.from_dict({"text": [
                    "A man is playing a guitar.", "The cat sleeps on the sofa.",
                    "Stocks fell sharply on Monday.", "She is reading a book in the park.",
                ]})
                loss = InfoNCELoss(model, track_statistics=True)  # one column: unsupervised SimCSE
                trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss)
                trainer.train()
                print(loss.last_diagnostics)  # what WEINCE's mixing weight would have been
        """
        super().__init__(model, temperature, config=config, gather_across_devices=gather_across_devices)
        self.track_statistics = track_statistics

    def get_config_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "gather_across_devices": self.gather_across_devices}

    @property
    def citation(self) -> str:
        return SIMCSE_CITATION
