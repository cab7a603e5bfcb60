"""WEINCE as a sentence-transformers loss: :class:`WeinceLoss`."""

from __future__ import annotations

from typing import Any

from simcse_weince.losses._columns import ColumnsLoss

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
        scale: 1 / τ of the InfoNCE part, MNRL's (default 20: τ = 0.05, SimCSE's).
        similarity_fct: cosine only (``sentence_transformers.util.cos_sim``, the default): the shortfall logit
            ``-log(1 - s)`` and the tail statistics need similarities bounded by 1, their endpoint; anything else
            is refused (:class:`~simcse_weince.InfoNCELoss` takes any, as MNRL does).
        gather_across_devices: gather embeddings from all processes (with gradient) before the loss, so that
            negatives *and the tail statistics* span the global batch. Every process computes the loss of the
            global batch (MNRL computes its local anchors' share; the gradients are the same after DDP's
            averaging).
        directions: MNRL's similarity blocks, a tuple of ``"query_to_doc"`` (required: it holds the positive),
            ``"query_to_query"``, ``"doc_to_query"``, ``"doc_to_doc"``; default ``("query_to_doc",)``. What
            each row's positive, tail negatives and shortfall logit are: ``docs/directions.md``.
        partition_mode: ``"joint"`` (one softmax per anchor over all its blocks; the default) or
            ``"per_direction"`` (one softmax per direction, each row with its own λ and each direction with its
            own ρ_0, losses averaged; not with ``query_to_query`` or ``doc_to_doc``), as in MNRL.
        hardness_mode: MNRL's hard-negative weighting, ``α · stop_grad(s_ij)`` added to the ``query_to_doc``
            logits of ``"in_batch_negatives"`` (LLaVE's, α = 9), ``"hard_negatives"`` (the anchor's own extra
            columns: EmbeddingGemma's, α = 5) or ``"all_negatives"``; None (the default, as MNRL's) turns it off
            whatever α is. With α = 0 every mode is off.
        hardness_strength: α ≥ 0 of that weighting (default 0: off). **Ours, not the paper's** on top of WEINCE:
            in Studies 2 and 3 (``docs/experiments.md``) it beat the hardness weighting alone on unsupervised
            SimCSE and lost to it, and to InfoNCE, on supervised pairs (SICK), so it is not recommended. λ and
            the tail statistics do not see the term.
        temperature: τ, keyword-only: another spelling of ``1 / scale`` (give one or the other).
        weince: :class:`~simcse_weince.WeinceConfig`, keyword-only (mixing-weight hyper-parameters; default: the
            paper's; ``config=`` is its old, deprecated name).
        track_statistics: keyword-only: keep each batch's λ statistics (:attr:`last_statistics`, the
            :class:`~simcse_weince.WeinceStatisticsCallback`; default True); off, the loss skips summarising them.

    The positional arguments are MNRL's, in MNRL's order (``WeinceLoss(model, 20.0)`` is ``scale=20``); the
    options only this package has are keyword-only. Every option is also an attribute that can be assigned after
    construction (``loss.directions = (...)``): it is checked as at construction and used from the next call on.

    A batch of one anchor (the last, incomplete batch of an epoch with ``dataloader_drop_last=False``) holds too
    few negatives for the tail statistics (none for a pair): it trains at λ = 0, MNRL's loss (0 for a pair), and
    reports no statistics.

    Each anchor row the loss builds (one per anchor in ``joint``, one per anchor and direction in
    ``per_direction``) has its own λ and β: its positives are the anchor's pair (the ``query_to_doc`` entry
    and, where the row holds a ``doc_to_query`` block, that block's entry of the anchor's query); its negatives
    for the tail statistics are its other finite entries; the shortfall logit is blended into every finite
    entry; masked entries (a query against itself, a document against its own query's documents) take no part.
    λ = 0 is MNRL exactly, whatever the options (``docs/directions.md``).

    After each step, :attr:`last_statistics` holds mean λ, the share of anchors with λ > 0.5, ρ_0, mean ΔAIC
    and mean β̂ of the batch, for logging.

    References:
        - Erol et al., *When Softmax Fails at the Top: Extreme-Value Corrections for InfoNCE*, ICML 2026
          (arXiv:2606.00262).
        - Gao et al., *SimCSE: Simple Contrastive Learning of Sentence Embeddings*, EMNLP 2021.

    Requirements:
        Duplicate-free batches are not required (exact duplicates are safe).

    {inputs}

    Relations:
        - A drop-in for ``MultipleNegativesRankingLoss(model, **options)``: the same options, and at λ = 0 the
          same loss and gradients (``tests/test_mnrl_equivalence.py``).
        - :class:`~simcse_weince.InfoNCELoss` is the λ = 0 baseline on the same inputs (equal to
          ``MultipleNegativesRankingLoss(model, **options)``).
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
            print(loss.last_statistics)

        The symmetric loss of a retrieval recipe, as with MNRL::

            loss = WeinceLoss(model, directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction")
    """

    loss_name = "weince"

    def get_config_dict(self) -> dict[str, Any]:
        """MNRL's keys and values, then WEINCE's settings."""
        return {**self.contrastive_options(), **self.weince.to_dict()}

    @property
    def citation(self) -> str:
        """The paper of the MNRL recipe these options are (as MNRL cites it), then WEINCE's."""
        return self.recipe_citation + WEINCE_CITATION
