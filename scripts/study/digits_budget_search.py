"""The digits epoch-budget search of docs/experiments.md: InfoNCE runs only, on seed 0 (not a study seed).

For each augmentation (SimCLR's crop area 0.08-1, then the milder 0.5-1) and each budget (15, 30, 60 epochs), one
InfoNCE run and the untrained backbone of the same seed are compared; the search stops at the first budget at which
InfoNCE beats the untrained backbone on kNN@20 or on the linear probe. Every run is an ordinary ``vision compare``
cell, so a killed search continues where it stopped when run again. Writes ``budget.json`` (the whole curve and the
choice) in the output folder and prints the curve as a table.

    python scripts/study/digits_budget_search.py --output-dir runs/study/digits-budget
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from simcse_weince.compare import compare
from simcse_weince.vision import VISION_CELLS
from simcse_weince.vision.config import VisionTrainConfig

BUDGETS = (15, 30, 60)
CROP_SCALES = (0.08, 0.5)  # the default augmentation first, then the milder crop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/digits-budget")
    parser.add_argument("--mixed-precision", default="bf16", help="see docs/experiments.md, amendment 2")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    output_dir = Path(args.output_dir)
    curve, choice = [], None
    for crop in CROP_SCALES:
        for epochs in args.budgets:
            base = VisionTrainConfig(dataset="digits", image_size=16, batch_size=64, num_epochs=epochs,
                                     crop_scale_min=crop, mixed_precision=args.mixed_precision,
                                     report_to=("csv",))  # fmt: skip
            variants = {"infonce": {"loss": "infonce"}, "untrained": {"num_epochs": 0}}
            folder = output_dir / f"crop-{crop}" / f"epochs-{epochs}"
            summary = compare(base, variants, [args.seed], folder, kind=VISION_CELLS)
            metrics = {run["variant"]: run for run in summary["runs"]}
            point = {"crop_scale_min": crop, "num_epochs": epochs,
                     **{f"{name}_{metric}": metrics[name][metric] for name in variants
                        for metric in ("knn@20", "linear_probe")}}  # fmt: skip
            point["infonce_beats_untrained"] = (
                point["infonce_knn@20"] > point["untrained_knn@20"]
                or point["infonce_linear_probe"] > point["untrained_linear_probe"]
            )
            curve.append(point)
            print(json.dumps(point), flush=True)
            if point["infonce_beats_untrained"]:
                choice = {"crop_scale_min": crop, "num_epochs": epochs}
                break
        if choice:
            break
    if choice is None:  # the protocol: report the curve and compare at the largest budget, labelled as such
        choice = {"crop_scale_min": CROP_SCALES[0], "num_epochs": max(args.budgets), "qualified": False}
    else:
        choice["qualified"] = True
    (output_dir / "budget.json").write_text(json.dumps({"curve": curve, "choice": choice}, indent=2))
    print("\n| crop area | epochs | InfoNCE kNN@20 | untrained kNN@20 | InfoNCE probe | untrained probe |")
    print("|---|---:|---:|---:|---:|---:|")
    columns = [f"{name}_{metric}" for metric in ("knn@20", "linear_probe") for name in ("infonce", "untrained")]
    for point in curve:
        values = " | ".join(f"{point[column]:.2f}" for column in columns)
        print(f"| {point['crop_scale_min']}-1 | {point['num_epochs']} | {values} |")
    print(f"\nchoice: {choice}")


if __name__ == "__main__":
    main()
