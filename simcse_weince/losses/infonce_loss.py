"""The InfoNCE baseline as a sentence-transformers loss: :class:`InfoNCELoss`."""

from __future__ import annotations

from typing import Any

from simcse_weince.losses._columns import ColumnsLoss

SIMCSE_CITATION = """
@inproceedings{gao2021simcse,
    title={{SimCSE}: Simple Contrastive Learning of Sentence Embeddings},
    author={Gao, Tianyu and Yao, Xingcheng and Chen, Danqi},
    booktitle={Empirical Methods in Natural Language Processing (EMNLP)},
    year={2021},
}
"""


class InfoNCELoss(ColumnsLoss):
    """InfoNCE (SimCSE's loss): for every anchor, a cross-entropy over its positive and all other candidates of
    the batch, with cosine similarities divided by the temperature τ. It is WEINCE's λ = 0 baseline, on the same
    inputs and with the same unsupervised-SimCSE handling as :class:`~simcse_weince.WeinceLoss`.

    With a **single text column** the positive of every sentence is the same sentence encoded a second time
    with a different dropout mask: unsupervised SimCSE.

    On two or more columns it is sentence-transformers' ``MultipleNegativesRankingLoss`` (MNRL) with the same
    options: ``InfoNCELoss(model, **options)`` equals ``MultipleNegativesRankingLoss(model, **options)``.

    Args:
        model: the SentenceTransformer to train.
        scale: 1 / τ, MNRL's (default 20: τ = 0.05, SimCSE's).
        similarity_fct: the similarity of two embedding matrices, anything MNRL takes (default
            ``sentence_transformers.util.cos_sim``; e.g. ``dot_score`` with ``scale=1``, an ``nn.Module``).
            ``track_statistics`` needs cosine.
        gather_across_devices: gather embeddings from all processes (with gradient) before the loss (every
            process computes the global batch's loss; the same gradients as MNRL's after DDP's averaging).
        directions: MNRL's similarity blocks: ``"query_to_doc"`` (required), ``"query_to_query"``,
            ``"doc_to_query"``, ``"doc_to_doc"``; default ``("query_to_doc",)``.
        partition_mode: ``"joint"`` (one softmax over all blocks; default) or ``"per_direction"`` (one per
            direction, averaged; not with ``query_to_query`` or ``doc_to_doc``), as MNRL.
        hardness_mode: MNRL's hard-negative weighting ``α · stop_grad(s_ij)`` on the ``query_to_doc`` logits of
            ``"in_batch_negatives"``, ``"hard_negatives"`` or ``"all_negatives"``; None (the default, as MNRL's):
            off whatever α is.
        hardness_strength: α ≥ 0 of that weighting (default 0: off; LLaVE: 9, EmbeddingGemma's
            ``hard_negatives``: 5).
        temperature: τ, keyword-only: another spelling of ``1 / scale`` (give one or the other).
        track_statistics: keyword-only: also compute WEINCE's tail statistics (without using them) so that
            :attr:`last_statistics` shows what WEINCE would have done; off by default (pure InfoNCE cost).
        weince: keyword-only: the :class:`~simcse_weince.WeinceConfig` used for those statistics (``config=`` is
            its old, deprecated name).

    The positional arguments are MNRL's, in MNRL's order; the options only this package has are keyword-only.
    Every option is also an attribute that can be assigned after construction, checked as at construction and
    used from the next call on. A batch of one anchor gives MNRL's value (0 for a pair).

    References:
        - Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings*, EMNLP 2021.
        - van den Oord et al., *Representation Learning with Contrastive Predictive Coding*, 2018
          (arXiv:1807.03748).

    {inputs}

    Relations:
        - Equal to ``MultipleNegativesRankingLoss(model, **options)`` on two or more columns, for every option
          (``tests/test_mnrl_equivalence.py``).
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
            print(loss.last_statistics)  # what WEINCE's mixing weight would have been
    """

    loss_name = "infonce"
    statistics_by_default = False  # pure InfoNCE cost unless asked

    def get_config_dict(self) -> dict[str, Any]:
        """MNRL's keys and values."""
        return self.contrastive_options()

    @property
    def citation(self) -> str:
        """The paper of the MNRL recipe these options are (as MNRL cites it), then SimCSE's."""
        return self.recipe_citation + SIMCSE_CITATION
