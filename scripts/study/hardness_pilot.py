"""Study 3's pilot (docs/experiments.md, "Study 3"): the hardness strength α of both hardness variants, tuned alike.

On the primary setting (``cpu-cls``, batch 64, one epoch, fp32) and the pilot seed 20 (not a study seed), it trains
``infonce-hardness`` and ``weince-hardness`` (ours) at every α of :data:`ALPHAS` and chooses, **for each variant by
the same rule**, the α with the highest best STS-B dev during training (ties, to 0.01: the one nearer the peer's
default 9, then the smaller). Test scores are computed by the trainer but never read here. Every run is an ordinary
``compare`` cell in ``<output-dir>/<variant>-a<α>/seed-20``, so a stopped pilot continues where it stopped. Writes
``pilot.json`` (every point, the training times, the choice) and prints the table::

    OMP_NUM_THREADS=1 python scripts/study/hardness_pilot.py --variants infonce-hardness   # process 1
    OMP_NUM_THREADS=1 python scripts/study/hardness_pilot.py --variants weince-hardness    # process 2
    python scripts/study/hardness_pilot.py                                                   # reads both, chooses
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from negatives_budget_search import cell_config  # noqa: E402  (Study 2's cpu-cls cell: the same base)

from simcse_weince.compare import compare  # noqa: E402
from simcse_weince.text import TEXT_CELLS  # noqa: E402

ALPHAS = (4.5, 9.0, 18.0, 36.0)
FAMILIES = {"infonce-hardness": "infonce", "weince-hardness": "weince"}  # variant -> its loss
PILOT_SEED = 20
PEER_DEFAULT = 9.0  # sentence-transformers' hardness_strength for in-batch negatives
TIE = 0.01  # STS-B dev points


def variant_name(family: str, alpha: float) -> str:
    return f"{family}-a{alpha:g}"


def choose(points: dict[float, float]) -> float:
    """The α with the highest dev; within ``TIE`` of it, the one nearest the peer's default, then the smaller."""
    best = max(points.values())
    tied = [alpha for alpha, dev in points.items() if dev >= best - TIE]
    return min(tied, key=lambda alpha: (abs(alpha - PEER_DEFAULT), alpha))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/hardness-pilot")
    parser.add_argument("--variants", default=",".join(FAMILIES), help="the families this process trains")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    output_dir = Path(args.output_dir)
    base = cell_config(64, 1, 3e-5, "no")
    families = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose among {list(FAMILIES)}")
    for family in families:  # trains what is missing (compare reuses finished cells and resumes stopped ones)
        variants = {
            variant_name(family, a): {
                "loss": FAMILIES[family],
                "hardness_mode": "in_batch_negatives",
                "hardness_strength": a,
            }
            for a in ALPHAS
        }
        baseline = variant_name(family, PEER_DEFAULT)
        compare(base, variants, [PILOT_SEED], output_dir / family, kind=TEXT_CELLS, baseline=baseline)

    report = {"seed": PILOT_SEED, "alphas": list(ALPHAS), "points": {}, "choice": {}}
    for family in FAMILIES:
        points, seconds = {}, {}
        for alpha in ALPHAS:
            results_file = output_dir / family / variant_name(family, alpha) / f"seed-{PILOT_SEED}" / "results.json"
            if results_file.is_file():
                results = json.loads(results_file.read_text(encoding="utf-8"))
                points[alpha] = results["best_stsb_dev_spearman_during_training"]
                versions = results.get("versions") or {}
                seconds[alpha] = {"train_seconds": results["train_time_seconds"],
                                  "wall_seconds": results["wall_time_seconds"], "best_step": results["best_step"],
                                  "commit": versions.get("git_commit"), "versions": versions}  # fmt: skip
        report["points"][family] = {f"{a:g}": {"best_stsb_dev": points[a], **seconds[a]} for a in points}
        if len(points) == len(ALPHAS):
            report["choice"][family] = choose(points)
    (output_dir / "pilot.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print("| variant | " + " | ".join(f"α = {a:g}" for a in ALPHAS) + " | chosen α |")
    print("|---|" + "---:|" * len(ALPHAS) + "---:|")
    for family in FAMILIES:
        row = [report["points"][family].get(f"{a:g}", {}).get("best_stsb_dev") for a in ALPHAS]
        shown = ["—" if value is None else f"{value:.2f}" for value in row]
        chosen = report["choice"].get(family)
        print(f"| `{family}` | " + " | ".join(shown) + f" | {'—' if chosen is None else f'{chosen:g}'} |")


if __name__ == "__main__":
    main()
