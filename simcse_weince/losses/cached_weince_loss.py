"""WEINCE with GradCache as a sentence-transformers loss: :class:`CachedWeinceLoss`."""

from __future__ import annotations

from simcse_weince.losses._cached import GRADCACHE_CITATION, CachedColumnsLoss
from simcse_weince.losses.weince_loss import WeinceLoss


class CachedWeinceLoss(CachedColumnsLoss):
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
        scale: 1 / τ of the InfoNCE part, CMNRL's (default 20: τ = 0.05, SimCSE's).
        similarity_fct: cosine only, as :class:`~simcse_weince.WeinceLoss` (WEINCE needs similarities bounded by 1).
        directions: MNRL's similarity blocks (``"query_to_doc"``, required; ``"query_to_query"``,
            ``"doc_to_query"``, ``"doc_to_doc"``), as :class:`~simcse_weince.WeinceLoss`.
        partition_mode: ``"joint"`` (default) or ``"per_direction"``, as :class:`~simcse_weince.WeinceLoss`.
        hardness_mode: ``"in_batch_negatives"``, ``"hard_negatives"``, ``"all_negatives"`` or None (the default,
            as CMNRL's: off), as :class:`~simcse_weince.WeinceLoss`.
        mini_batch_size: sentences per encoder pass; bounds the activation memory. The batch size
            (the negatives) is set by the data loader as usual.
        mini_batch_num_tokens: if set, mini-batches are packed by their number of non-padding tokens instead
            of by ``mini_batch_size`` sentences.
        gather_across_devices: gather embeddings from all processes (with gradient) before the loss, so that
            negatives and the tail statistics span the global batch.
        show_progress_bar: show a progress bar over the mini-batches.
        hardness_strength: α > 0 adds sentence-transformers' hard-negative weighting (``hardness_mode``) to
            WEINCE's logits, as :class:`~simcse_weince.WeinceLoss`'s option of that name (**ours**, off by
            default).
        temperature: τ, keyword-only: another spelling of ``1 / scale`` (give one or the other).
        weince: :class:`~simcse_weince.WeinceConfig`, keyword-only (mixing-weight hyper-parameters; default: the
            paper's; ``config=`` is its old, deprecated name).
        track_statistics: keyword-only, as :class:`~simcse_weince.WeinceLoss`'s.

    The positional arguments are CMNRL's, in CMNRL's order; the options only this package has are keyword-only.
    Every option is an assignable attribute (checked when assigned, used from the next call on), forwarded to the
    wrapped :class:`~simcse_weince.WeinceLoss` (``loss.loss``), which computes the loss of the whole batch and,
    as CMNRL's wrapped MNRL does, cites the recipe's paper and WEINCE's on the model card; this class cites
    GradCache. A batch of one anchor trains at λ = 0, as :class:`~simcse_weince.WeinceLoss`.

    After each step, :attr:`last_statistics` holds mean λ, the share of anchors with λ > 0.5, ρ_0, mean ΔAIC
    and mean β̂ of the batch, as for :class:`~simcse_weince.WeinceLoss`.

    References:
        - Erol et al., *When Softmax Fails at the Top: Extreme-Value Corrections for InfoNCE*, ICML 2026
          (arXiv:2606.00262).
        - Gao et al., *Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup*, RepL4NLP 2021
          (arXiv:2101.06983).

    Requirements:
        A model whose inputs can be sliced along the batch (not a ``StaticEmbedding`` model).

    {inputs}

    Relations:
        - Equivalent to :class:`~simcse_weince.WeinceLoss` (same loss and gradients with dropout off; with
          dropout on, the same distribution of masks), but with memory bounded by ``mini_batch_size``.
        - A drop-in for ``CachedMultipleNegativesRankingLoss(model, **options)``: the same options, and at λ = 0
          the same loss and gradients (``tests/test_mnrl_equivalence.py``).
        - :class:`CachedInfoNCELoss` is its λ = 0 baseline, equal to
          ``CachedMultipleNegativesRankingLoss(model, **options)``.

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
            print(loss.last_statistics)
    """

    wrapped_class = WeinceLoss

    @property
    def citation(self) -> str:
        """GradCache's paper; the wrapped loss (``loss.loss``, on the model card too) cites the recipe's and
        WEINCE's, so that each is cited once."""
        return GRADCACHE_CITATION
