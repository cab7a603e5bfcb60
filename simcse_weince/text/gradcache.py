"""The text trainer's GradCache step: :func:`gradcache_forward_backward`.

GradCache (Gao et al., 2021) lets the loss see the whole batch while only ``mini_batch_size`` rows' activations
are alive at a time:

1. every chunk of ``mini_batch_size`` rows is encoded (all its columns or views, one forward) without a graph,
   and the RNG state before each forward is kept (sentence-transformers' ``RandContext``, shared with
   :mod:`simcse_weince.losses._cached`);
2. the loss of the whole batch is computed from those embeddings (gathered across processes as usual) and
   back-propagated up to them through ``accelerator.backward``, which applies the fp16 loss scale and the
   gradient-accumulation divisor to the cached embedding gradients;
3. every chunk is encoded again with its RNG state replayed (the same dropout masks) and the cached gradients are
   back-propagated through it. DDP reduces once, after the last chunk.

The global RNG ends where the first pass left it (the replays run in a forked RNG), so resuming from a checkpoint
continues exactly.

Why this is not sentence-transformers' ``CachedLossMixin`` (which :class:`~simcse_weince.CachedWeinceLoss` wraps):
the mixin embeds a SentenceTransformer's columns one feature dict at a time (``embed_minibatch`` on each column,
a single column in two passes), while the trainer's batch is its columns stacked into one padded tensor that one
forward of :class:`~simcse_weince.text.model.SimCSEModel` encodes (both dropout views of unsupervised SimCSE in one
pass over 2N rows, as SimCSE does, with the fast path's length chunks over all rows). Cutting that tensor
row-wise in every column at once, each chunk trimmed to its longest sentence, and back-propagating through
``accelerator.backward`` and ``accelerator.no_sync`` are this module's own; the RNG replay is the mixin's
``RandContext``.

Reference: L. Gao, Y. Zhang, J. Han, J. Callan, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
Setup", RepL4NLP 2021 (arXiv 2101.06983).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from simcse_weince.text.model import encode_columns, trim_trailing_padding


def row_chunks(batch: dict, num_columns: int, mini_batch_size: int) -> list[dict]:
    """The batch cut into chunks of ``mini_batch_size`` rows of every column (the columns are stacked in the
    batch, column-major); each chunk drops the padding columns it does not need."""
    rows = batch["input_ids"].shape[0] // num_columns

    def row_slice(value: torch.Tensor, begin: int) -> torch.Tensor:
        columns = value.view(num_columns, rows, *value.shape[1:])
        return columns[:, begin : begin + mini_batch_size].reshape(-1, *value.shape[1:])

    return [
        trim_trailing_padding({name: row_slice(value, begin) for name, value in batch.items()})
        for begin in range(0, rows, mini_batch_size)
    ]


def gradcache_forward_backward(model, batch: dict, objective, accelerator, mini_batch_size: int, num_columns: int = 1):
    """The loss of one contrastive batch and its gradients (accumulated into the model's ``.grad``), computed a
    chunk of ``mini_batch_size`` rows at a time: the same loss and gradients as one forward and backward over the
    batch. ``(detached loss, statistics)``."""
    # on first use: importing sentence-transformers costs the trainer's start-up seconds (`python -X importtime`),
    # and a run without mini_batch_size never needs it
    from sentence_transformers.base.losses.gradcache import RandContext

    chunks = row_chunks(batch, num_columns, mini_batch_size)
    random_states, chunk_views = [], []
    with torch.no_grad():
        for chunk in chunks:
            random_states.append(RandContext(*chunk.values()))
            chunk_views.append(encode_columns(model, chunk, num_columns))
    views = [torch.cat(column).requires_grad_() for column in zip(*chunk_views)]
    loss, statistics = objective(*views)
    accelerator.backward(loss)

    sizes = [len(chunk_view[0]) for chunk_view in chunk_views]
    cached_gradients = list(zip(*(view.grad.split(sizes) for view in views)))  # per chunk, one per column
    for index, (chunk, random_state, gradients) in enumerate(zip(chunks, random_states, cached_gradients)):
        synchronize = nullcontext() if index == len(chunks) - 1 else accelerator.no_sync(model)
        with synchronize, random_state:
            embeddings = encode_columns(model, chunk, num_columns)
            # the surrogate's gradient w.r.t. the embeddings is the cached gradient; float32 keeps fp16/bf16
            # embeddings from rounding the products
            surrogate = sum(
                torch.dot(embedding.flatten().float(), gradient.flatten().float())
                for embedding, gradient in zip(embeddings, gradients)
            )
            surrogate.backward()
    return loss.detach(), statistics
