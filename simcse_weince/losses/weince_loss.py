"""WEINCE as a sentence-transformers loss: :class:`WeinceLoss`."""

from __future__ import annotations

from typing import Any

from torch import nn

from simcse_weince.losses._columns import ColumnsLoss
from simcse_weince.weince.loss import WeinceConfig, check_hardness_strength

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


class WeinceLoss(ColumnsLoss):
    loss_name = "weince"

    def __init__(
        self,
        model: nn.Module,
        temperature: float = 0.05,
        *,
        config: WeinceConfig | None = None,
        gather_across_devices: bool = False,
        hardness_strength: float = 0.0,
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
            hardness_strength: α > 0 adds sentence-transformers' hard-negative weighting
                (``MultipleNegativesRankingLoss(hardness_mode="in_batch_negatives", hardness_strength=α)``),
                ``α · stop_grad(s_ij)``, to the WEINCE logit of every in-batch negative. **Ours, not the paper's**,
                and off (0) by default: in Studies 2 and 3 (``docs/experiments.md``) it beat the hardness
                weighting alone on unsupervised SimCSE and lost to it, and to InfoNCE, on supervised pairs (SICK),
                so it is not recommended. λ and the tail statistics do not see the term.

        The options after ``temperature`` are keyword-only: the losses of this package take different options, and
        a positional call could bind a value to another loss's option.

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
            - :class:`~simcse_weince.InfoNCELoss` is the λ = 0 baseline on the same inputs (equal to
              ``MultipleNegativesRankingLoss(model, scale=1/temperature)``).
            - :class:`~simcse_weince.CachedWeinceLoss` is its GradCache version (large batches, bounded memory).

        Example:
            ::

                from datasets import Dataset
                from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
                from simcse_weince import WeinceLoss

                model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
                train_dataset = Dataset.from_dict({"text": [
                    "A man is playing a guitar.", "The cat sleeps on the sofa.",
                    "Stocks fell sharply on Monday.", "She is reading a book in the park.",
                ]})
                loss = WeinceLoss(model)  # one column: unsupervised SimCSE with dropout positives
                trainer = SentenceTransformerTrainer(model=model, train_dataset=train_dataset, loss=loss)
                trainer.train()
                print(loss.last_diagnostics)
        """
        super().__init__(model, temperature, config=config, gather_across_devices=gather_across_devices)
        check_hardness_strength(hardness_strength)
        self.hardness_strength = float(hardness_strength)

    def get_config_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "gather_across_devices": self.gather_across_devices,
            "hardness_strength": self.hardness_strength,
            **self.config.to_dict(),
        }

    @property
    def citation(self) -> str:
        return WEINCE_CITATION
