"""The cost of the fast path's start-up check (``text/fast_path``), and which path it picks, on the installed releases.

Loads the encoder as the trainer does (MiniLM by default), then builds the training forward the way
``TextRecipe.build`` does for fp32 and for bf16 (each ``--repeats`` times: the first includes one-time warm-up such
as oneDNN's kernel selection) and prints the path, the reason if any, and the check's seconds. Prints the versions
first, so that a run under another transformers release is one command::

    python scripts/benchmarks/bench_fast_path_check.py
    PYTHONPATH=/tmp/transformers-5.24 python scripts/benchmarks/bench_fast_path_check.py   # another release
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=32, help="the run's --max-length (the check's longest row)")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModel

    from simcse_weince.paths import resolve_model_path
    from simcse_weince.text.config import SpeedConfig
    from simcse_weince.text.fast_path import build_training_forward

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    started = time.perf_counter()
    encoder = AutoModel.from_pretrained(resolve_model_path(args.model))
    print(f"model loaded in {time.perf_counter() - started:.2f} s ({args.model})")
    for precision in ("no", "bf16"):
        seconds, forward = [], None
        for _ in range(args.repeats):
            forward = build_training_forward(
                encoder, SpeedConfig(), length_chunks=4, mixed_precision=precision, max_length=args.max_length
            )
            seconds.append(forward.report["check_seconds"])
        report = forward.report
        print(
            f"mixed_precision={precision}: path {report['path']} ({forward.describe()}), reason {report['reason']}; "
            f"check {seconds[0]:.3f} s first, median {statistics.median(seconds[1:] or seconds):.3f} s after, "
            f"fastest {min(seconds):.3f} s"
        )


if __name__ == "__main__":
    main()
