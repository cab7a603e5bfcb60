"""What the matmul peak is for the shapes a training step runs: the FLOP/s of a BERT layer's linear layers at a
step's real token count, forward and backward, against a large square GEMM, per precision.

MFU (``bench_train.py``) divides a step's model FLOP/s by the square GEMM's peak. A MiniLM step of 64 sentences
multiplies about 2,800 real tokens by 384 x 384 and 384 x 1536 weights: small matrices, which no matmul kernel
runs at the square GEMM's rate. This script measures those shapes alone (``torch.mm``, the same thread count, best
of repeated calls), so that the ceiling a step could reach even with nothing but its matmuls is known::

    python scripts/benchmarks/bench_matmul_shapes.py                       # MiniLM, 2,778 tokens (cpu-demo)
    python scripts/benchmarks/bench_matmul_shapes.py --hidden 768 --feed-forward 3072 --tokens 2778   # BERT-base
"""

from __future__ import annotations

import argparse

import torch

from simcse_weince.training.flops import gemm_flops, matmul_peak_flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--feed-forward", type=int, default=1536)
    parser.add_argument("--tokens", type=int, default=2778, help="real tokens of a step (two views of 64 sentences)")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing per shape")
    args = parser.parse_args()
    hidden, feed_forward, tokens = args.hidden, args.feed_forward, args.tokens
    # (label, rows, inner, columns, multiplicity per layer): forward x W, input gradient dY W^T, weight gradient
    # X^T dY, for the four hidden x hidden projections and the two feed-forward layers
    shapes = [
        ("forward, h x h", tokens, hidden, hidden, 4),
        ("forward, h x ff", tokens, hidden, feed_forward, 1),
        ("forward, ff x h", tokens, feed_forward, hidden, 1),
        ("weight gradient, h x h", hidden, tokens, hidden, 4),
        ("weight gradient, h x ff", hidden, tokens, feed_forward, 2),
    ]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; hidden {hidden}, feed-forward "
          f"{feed_forward}, {tokens} tokens")  # fmt: skip
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        peak = matmul_peak_flops(dtype, seconds=1.0)
        rates, weights = [], []
        print(f"\n{name}: square 2048 GEMM {peak / 1e9:.0f} GFLOP/s")
        for label, rows, inner, columns, count in shapes:
            rate = gemm_flops(rows, inner, columns, dtype, seconds=args.seconds)
            rates.append(rate)
            weights.append(count * rows * inner * columns)
            print(f"  {label:<24} {rows:>5} x {inner:>5} x {columns:>5}  {rate / 1e9:7.0f} GFLOP/s "
                  f"({100 * rate / peak:.0f}% of the square GEMM)")  # fmt: skip
        # a layer's matmuls at these rates: the forwards, the input gradients (the forwards' shapes) and the weight
        # gradients, all FLOPs over all their times
        flops = [2 * weight for weight in weights] + [2 * weight for weight in weights[:3]]
        times = [flop / rate for flop, rate in zip(flops, rates + rates[:3])]
        together = sum(flops) / sum(times)
        print(f"  a layer's linear matmuls together: {together / 1e9:.0f} GFLOP/s ({100 * together / peak:.0f}% of "
              "the square GEMM): the MFU a step of these shapes could reach if nothing but its linear layers took "
              "time")  # fmt: skip


if __name__ == "__main__":
    main()
