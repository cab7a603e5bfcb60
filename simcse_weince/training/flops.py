"""Model FLOPs of a training step and the machine's measured matmul peak: FLOP utilisation (MFU), as nanoGPT
prints it, with the peak measured here instead of taken from a data sheet.

**Model FLOPs** count the multiply-adds a transformer encoder *needs* for the real tokens of a batch
(padding and recomputation are not counted, so MFU compares trainers that pad differently). Forward, per layer,
for a sequence of ``n`` real tokens with hidden size ``h`` and feed-forward size ``f``::

    linear layers   2 n (4 h^2 + 2 h f)      (query, key, value, output; feed-forward up and down)
    attention       4 n^2 h                  (scores Q K^T and their weighted sum P V, over all heads)

plus ``2 h^2`` per sequence for a dense head on the pooled vector (SimCSE's ``cls`` MLP). A training step is 3x
the forward (the backward computes the gradients of each matmul's two inputs). Embeddings, layer norms, GELU,
softmax, dropout and the loss are left out: they are not matmuls and cost well under 1% of these FLOPs at
BERT's sizes. :func:`encoder_training_flops` equals what ``torch.utils.flop_counter.FlopCounterMode`` counts for
a forward and backward of a Hugging Face BERT on an unpadded batch (``tests/test_flops.py``; docs/performance.md
section 13 checks it on all-MiniLM-L6-v2).

**The peak** (:func:`matmul_peak_flops`) is what a large square GEMM reaches on this device at the given dtype and
the current thread count: the best of repeated ``torch.mm`` calls, timed for a fraction of a second.

Example::

    from simcse_weince.training.flops import encoder_training_flops, matmul_peak_flops

    flops = encoder_training_flops(encoder.config, lengths=[21, 17, 30])  # one step over three sequences
    mfu = flops / step_seconds / matmul_peak_flops(torch.bfloat16)
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch

#: the dtype of the peak that a run's FLOPs are compared with, by its resolved mixed precision
PEAK_DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def encoder_dimensions(config) -> tuple[int, int, int] | None:
    """``(hidden size, layers, feed-forward size)`` of a BERT-like ``transformers`` config, or None when the
    config does not name them (then no FLOPs are counted)."""
    names = (("hidden_size", "num_hidden_layers", "intermediate_size"), ("dim", "n_layers", "hidden_dim"))
    for hidden, layers, feed_forward in names:
        values = [getattr(config, name, None) for name in (hidden, layers, feed_forward)]
        if all(isinstance(value, int) and value > 0 for value in values):
            return values[0], values[1], values[2]
    return None


def encoder_training_flops(config, lengths: Iterable[int], *, head: bool = False) -> int | None:
    """Model FLOPs of a forward and backward of the encoder over sequences of ``lengths`` real tokens (3x the
    forward of the module docstring); ``head`` adds a dense ``h x h`` layer on each pooled vector. None when the
    config is not BERT-like (:func:`encoder_dimensions`)."""
    dimensions = encoder_dimensions(config)
    if dimensions is None:
        return None
    hidden, layers, feed_forward = dimensions
    lengths = [int(length) for length in lengths]
    tokens, squares = sum(lengths), sum(length * length for length in lengths)
    forward = layers * (2 * tokens * (4 * hidden * hidden + 2 * hidden * feed_forward) + 4 * squares * hidden)
    if head:
        forward += 2 * len(lengths) * hidden * hidden
    return 3 * forward


def matmul_peak_flops(
    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", size: int | None = None,
    seconds: float = 0.25,
) -> float:  # fmt: skip
    """FLOP/s of the best ``size x size`` GEMM (``torch.mm``, ``2 size^3`` FLOPs) timed for about ``seconds``,
    after one untimed call, at the current thread count. ``size`` defaults to 2048 on the CPU, 8192 elsewhere."""
    size = size or (2048 if torch.device(device).type == "cpu" else 8192)
    return gemm_flops(size, size, size, dtype, device, seconds)


def gemm_flops(
    rows: int, inner: int, columns: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    seconds: float = 0.25,
) -> float:  # fmt: skip
    """FLOP/s of the best ``(rows x inner) @ (inner x columns)`` product (``torch.mm``) timed for about
    ``seconds`` (at least once), after one untimed call, at the current thread count."""
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(0)  # the run's random stream is left alone
    left = torch.randn(rows, inner, generator=generator).to(device=device, dtype=dtype)
    right = torch.randn(inner, columns, generator=generator).to(device=device, dtype=dtype)
    output = torch.empty(rows, columns, device=device, dtype=dtype)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(left, right, out=output)
    synchronize()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(left, right, out=output)
        synchronize()
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return 2 * rows * inner * columns / best
