"""What a new row count costs a linear layer: oneDNN builds (and caches) a kernel per shape.

One MiniLM feed-forward layer (384 -> 1536), forward and backward under bf16 autocast (``--dtype bf16``) or in fp32,
is timed over ``--shapes`` row counts the process has not seen, then the same row counts again (served from the
kernel caches), then new row counts rounded up to a multiple of ``--multiple`` (the unpadded forward's
``ROW_MULTIPLE``: a few shapes, cached after their first step). It prints milliseconds a step for each, side by side.

Usage::

    python scripts/benchmarks/bench_row_counts.py                   # bf16, 80 shapes, 1 thread
    python scripts/benchmarks/bench_row_counts.py --dtype fp32 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--shapes", type=int, default=80)
    parser.add_argument("--multiple", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    layer = torch.nn.Linear(384, 1536)

    def step(rows: int) -> None:
        inputs = torch.randn(rows, 384, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            outputs = layer(inputs)
        outputs.float().sum().backward()

    def milliseconds(row_counts: list[int]) -> float:
        started = time.perf_counter()
        for rows in row_counts:
            step(rows)
        return (time.perf_counter() - started) / len(row_counts) * 1e3

    for rows in range(300, 320):  # warm-up: the first kernels and the allocator
        step(rows)
    new = list(range(600, 600 + args.shapes))
    rounded = [-(-rows // args.multiple) * args.multiple for rows in range(1000, 1000 + args.shapes)]
    first, again, few = milliseconds(new), milliseconds(new), milliseconds(rounded)
    print(
        f"{args.dtype}, {args.threads} thread(s), 384 -> 1536 forward + backward, ms a step: {args.shapes} new row "
        f"counts {first:.1f}; the same again (cached) {again:.1f}; rounded up to {args.multiple} "
        f"({len(set(rounded))} shapes) {few:.1f}; new / cached {first / again:.2f}x"
    )


if __name__ == "__main__":
    main()
