"""How many length-sorted chunks pay: our trainer's sentences/s at several ``--length-chunks``, side by side.

    python scripts/benchmarks/bench_chunks.py --chunks 1,4,8,16 --steps 8 --rounds 2

Runs our trainer (as ``bench_train.py`` does: MiniLM, batch 64, length 32, ``--steps`` timed steps after
``--warmup``) at every chunk count, in fp32 and (where this CPU computes it natively, or with ``--bf16 always``)
under bf16, in alternating order over ``--rounds`` interleaved rounds, and prints each configuration's median
rate and its ratio to the first chunk count's (median of the per-round ratios). This is the measurement behind
``length_chunks: auto`` (``simcse_weince/text/config.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import run_ours, training_sentences  # noqa: E402  (a sibling script: the same training run as bench_train's)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="1,4,8,16", help="comma-separated chunk counts; the first is the base")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--loss", choices=["weince", "infonce"], default="weince")
    parser.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--bf16", choices=("native", "always", "never"), default="native")
    parser.add_argument(
        "--padded-layers", action="store_true", help="run the linear layers on the padding too (unpadded_layers off)"
    )
    args = parser.parse_args()
    try:
        counts = [int(value) for value in args.chunks.split(",")]
    except ValueError:
        parser.error(f"--chunks takes comma-separated whole numbers, got {args.chunks!r}")
    if not counts or min(counts) < 1 or args.steps < 1 or args.warmup < 1:
        parser.error("--chunks, --steps and --warmup must be >= 1")

    from simcse_weince.precision import native_bf16

    sentences = training_sentences(args, parser)
    precisions = ["no"]
    if args.bf16 == "always" or (args.bf16 == "native" and native_bf16("cpu")):
        precisions.append("bf16")
    configurations = [(precision, count) for precision in precisions for count in counts]
    rates: dict[tuple[str, int], list[float]] = {configuration: [] for configuration in configurations}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sentences_file = workdir / "sentences.txt"
        sentences_file.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        for round_index in range(args.rounds):
            order = configurations if round_index % 2 == 0 else configurations[::-1]
            for precision, count in order:
                rates[precision, count].append(run_ours(
                    args.model, sentences_file, args, workdir, precision, count,
                    unpadded_layers=not args.padded_layers,
                ))  # fmt: skip
            print(f"round {round_index + 1}: " + ", ".join(
                f"{'fp32' if p == 'no' else p} x{c} {rates[p, c][-1]:.1f}" for p, c in configurations
            ) + " sentences/s", flush=True)  # fmt: skip
    print(f"\nmedians over {args.rounds} interleaved rounds (sentences/s), ratio to {counts[0]} chunk(s):")
    for precision, count in configurations:
        base = rates[precision, counts[0]]
        ratio = statistics.median(r / b for r, b in zip(rates[precision, count], base))
        label = "fp32" if precision == "no" else precision
        print(f"  {label} {count:>3} chunk(s) {statistics.median(rates[precision, count]):7.1f}  {ratio:.2f}x")


if __name__ == "__main__":
    main()
