"""Bounds on the CPU kernel caches that gain an entry for every new tensor shape.

On the CPU, torch runs bf16 matmuls (and the fp32 linear layers of :mod:`simcse_weince.text.fast_path.onednn_linear`)
through oneDNN, which builds (JIT-compiles) one kernel object per problem shape and keeps it in two caches: oneDNN's
primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's LRU cache in torch (``LRU_CACHE_CAPACITY``),
1,024 entries each by default. The text trainer's batches have a new shape almost every step (the linear layers
run on each length chunk's real tokens, whose number differs from batch to batch), so both caches fill with
kernels that are rarely used again: on a Zen 4, a bf16 linear layer's forward and backward over 50 new row counts
kept 140 MiB (about 0.5 MiB a kernel in each cache), the same shapes again nothing. The text trainer grew by
20-30 MB a step, up to about 1 GB once both caches are full (``scripts/benchmarks/bench_train_memory.py
--kernel-caches default``; docs/performance.md).

:func:`bound_kernel_caches` lowers both defaults to :data:`KERNEL_CACHE_CAPACITY` entries: more than one step
builds (its layers reuse the kernels of its chunks' shapes; about 40 at bf16), so within a step nothing is built
twice, and the caches stay within about 2 x 128 x 0.5 MiB. Both variables are read once, when the first such
kernel is built: a process that ran a bf16 matmul before training keeps the defaults. A value already in the
environment is left as it is (``LRU_CACHE_CAPACITY=1024`` restores torch's default).
"""

from __future__ import annotations

import os

#: entries each cache keeps: a step of the text trainer builds about 40 kernels (4 length chunks x forward, input
#: and weight gradient of 3 linear shapes, and the attention's), a ResNet-18 step of the vision trainer about 35
KERNEL_CACHE_CAPACITY = 128
#: the environment variables oneDNN (primitive cache) and ideep (torch's LRU cache of oneDNN objects) read
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches(capacity: int = KERNEL_CACHE_CAPACITY) -> dict[str, str]:
    """Set both caches' capacity to ``capacity`` entries where the environment does not already set it (effective
    if no oneDNN kernel was built yet in this process); returns the values in force."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in KERNEL_CACHE_VARIABLES}
