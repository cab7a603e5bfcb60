"""Study 2's budget pilot (docs/experiments.md, "Study 2"): InfoNCE only, on seed 0 (not a study seed).

One epoch of the 11,914 ``cpu-cls`` sentences is 186 steps at batch 64 but 11 at batch 1,024. The pilot walks the
budget rules of the protocol in their fixed order (epochs, and how the learning rate scales with the batch) and
stops at the first rule under which InfoNCE gains at least 3 STS-B dev points (best dev during training minus the
untrained encoder's dev) at *every* batch size. The dev score is read every ``round(62 * 64 / B)`` steps, i.e. at
the same numbers of sentences seen as Study 1's every 62 steps at 64. Within a rule the largest batch runs first,
and the first batch size that falls short moves the pilot to the next rule. Test scores are computed by the trainer but
never read here.

Every run is an ordinary ``compare`` cell in ``<output-dir>/epochs-<E>-lr-<lr>/batch-<B>``, so identical runs are
shared between rules (batch 64 has the same learning rate under every scaling) and a killed pilot continues where it
stopped when run again. Writes ``budget.json`` (every point, the compute per cell, the choice) and prints the table.

    OMP_NUM_THREADS=1 python scripts/study/negatives_budget_search.py --output-dir runs/study/negatives-budget
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

from simcse_weince.compare import compare
from simcse_weince.text import TEXT_CELLS
from simcse_weince.text.config import preset

BATCH_SIZES = (64, 256, 1024)
BASE_BATCH, BASE_LR, BASE_EVAL_STEPS = 64, 3e-5, 62  # Study 1's cpu-cls settings
MINI_BATCH_SIZE = 64  # GradCache above 64: the memory of a batch of 64, all the negatives of the batch
#: the rules, in the order they are tried: (epochs, learning-rate scaling with the batch size)
RULES = ((1, "sqrt"), (1, "linear"), (2, "sqrt"), (2, "linear"), (4, "sqrt"))
MIN_GAIN = 3.0  # STS-B dev points over the untrained encoder, at every batch size


def scaled_learning_rate(batch_size: int, scaling: str) -> float:
    """Study 1's 3e-5 at batch 64, scaled with the batch: ``sqrt`` (Krizhevsky 2014) or ``linear`` (Goyal et al.)."""
    ratio = batch_size / BASE_BATCH
    return BASE_LR * (math.sqrt(ratio) if scaling == "sqrt" else ratio)


def eval_steps(batch_size: int) -> int:
    """Dev every ~3,968 sentences, as Study 1's every 62 steps of 64 (64: 62, 256: 16, 1024: 4)."""
    return max(1, round(BASE_EVAL_STEPS * BASE_BATCH / batch_size))


def cell_config(batch_size: int, num_epochs: int, learning_rate: float, mixed_precision: str):
    """The ``cpu-cls`` config of one batch size under one budget (the study's cells use the same function)."""
    return preset(
        "cpu-cls",
        batch_size=batch_size,
        mini_batch_size=MINI_BATCH_SIZE if batch_size > MINI_BATCH_SIZE else None,
        num_epochs=num_epochs,
        learning_rate=learning_rate,
        eval_steps=eval_steps(batch_size),
        save_steps=eval_steps(batch_size),
        mixed_precision=mixed_precision,
        # fp32 evaluation, as every study cell recorded it (they predate eval_bf16's "auto"): a finished cell is
        # then read, not refused as trained with other settings
        eval_bf16=False,
        final_tasks=(),  # STS-B test only (the 7-task table costs 90 s a cell and is not a metric of Study 2)
        report_to=("csv",),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/negatives-budget")
    parser.add_argument("--mixed-precision", default="no", help="fp32 (see the protocol)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    output_dir = Path(args.output_dir)
    curve, choice = [], None
    for num_epochs, scaling in RULES:
        points = []
        for batch_size in sorted(args.batch_sizes, reverse=True):  # the largest batch is the likeliest to fall short
            learning_rate = scaled_learning_rate(batch_size, scaling)
            folder = output_dir / f"epochs-{num_epochs}-lr-{learning_rate:g}" / f"batch-{batch_size}"
            base = cell_config(batch_size, num_epochs, learning_rate, args.mixed_precision)
            compare(base, {"infonce": {"loss": "infonce"}}, [args.seed], folder, kind=TEXT_CELLS)
            results = json.loads((folder / "infonce" / f"seed-{args.seed}" / "results.json").read_text())
            best, untrained = results["best_stsb_dev_spearman_during_training"], results["base_stsb_dev_spearman"]
            point = {"num_epochs": num_epochs, "lr_scaling": scaling, "batch_size": batch_size,
                     "learning_rate": learning_rate, "steps": results["total_steps"], "best_step": results["best_step"],
                     "stsb_dev_untrained": untrained, "stsb_dev_best": best, "gain": best - untrained,
                     "wall_time_seconds": results["wall_time_seconds"],
                     "train_time_seconds": results["train_time_seconds"]}  # fmt: skip
            points.append(point)
            print(json.dumps(point), flush=True)
            if point["gain"] < MIN_GAIN:  # this rule cannot qualify any more: on to the next
                break
        curve.extend(points)
        if len(points) == len(args.batch_sizes) and all(point["gain"] >= MIN_GAIN for point in points):
            choice = {"num_epochs": num_epochs, "lr_scaling": scaling}
            break
    if choice is None:  # the protocol: report the curve, compare under the last rule, labelled as such
        choice = {"num_epochs": RULES[-1][0], "lr_scaling": RULES[-1][1], "qualified": False}
    else:
        choice["qualified"] = True
    (output_dir / "budget.json").write_text(json.dumps({"curve": curve, "choice": choice}, indent=2))
    print("\n| epochs | lr scaling | batch | lr | steps | dev untrained | dev best (step) | gain | train s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in curve:
        print(
            f"| {p['num_epochs']} | {p['lr_scaling']} | {p['batch_size']} | {p['learning_rate']:.2g} | {p['steps']} "
            f"| {p['stsb_dev_untrained']:.2f} | {p['stsb_dev_best']:.2f} ({p['best_step']}) | {p['gain']:+.2f} "
            f"| {p['train_time_seconds']:.0f} |"
        )
    print(f"\nchoice: {choice}")


if __name__ == "__main__":
    main()
