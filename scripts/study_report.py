"""The markdown of a study's results, from its comparison.json files: what README and docs/experiments.md show.

For each sweep folder: the paired table (`comparison.md`), the cells' commit, the λ statistics of each WEINCE
variant averaged over seeds and steps, the decision of docs/experiments.md (the 95% interval of the paired
difference above 0, below 0, or containing 0) and the wall time of the cells.

    python scripts/study_report.py results/study/cpu-cls results/study/cpu-demo --against infonce-hardness
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LAMBDA_KEYS = {"lambda_mean": "mean λ", "lambda_above_half": "share λ > ½", "rho0": "ρ₀",
               "delta_aic_mean": "mean ΔAIC", "beta_hat_mean": "mean β̂"}  # fmt: skip


def decision(interval) -> str:
    if interval is None:
        return "no interval (fewer than 2 pairs)"
    low, high = interval
    if low > 0:
        return "beats the baseline"
    if high < 0:
        return "worse than the baseline"
    return "no difference at this size"


def difference_lines(differences: dict, baseline: str, summary: dict, *, record: bool) -> list[str]:
    """One line per variant and Δ metric: the paired mean, its interval and the decision (``record``: also W/T/L)."""
    lines = []
    for name, metrics in differences.items():
        for metric in summary.get("deltas", ["stsb_test"]):
            difference = metrics[metric]
            if difference["mean"] is None:  # no pairs for this metric
                continue
            interval = difference["ci95"]
            shown = "" if interval is None else f" [{interval[0]:+.2f}, {interval[1]:+.2f}]"
            tally = f" ({difference['wins']}/{difference['ties']}/{difference['losses']})" if record else ""
            lines.append(f"- `{name}` − `{baseline}`, {summary['metrics'][metric]}: {difference['mean']:+.2f}{shown}"
                         f"{tally}; {decision(interval)}.")  # fmt: skip
    return lines


def against(summary: dict, other: str) -> list[str]:
    """Each other variant's paired differences against ``other`` (a second baseline, e.g. the peer loss)."""
    from simcse_weince.compare import summarize

    if other not in {run["variant"] for run in summary["runs"]}:
        return []
    differences = summarize(summary["runs"], other, tuple(summary["metrics"]))["differences"]
    return difference_lines(differences, other, summary, record=True)


def report(folder: Path, others: tuple[str, ...] = ()) -> str:
    summary = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
    lines = [f"### `{folder.name}`", "", (folder / "comparison.md").read_text(encoding="utf-8").rstrip(), ""]
    lines += difference_lines(summary["differences"], summary["baseline"], summary, record=False)
    for other in others:
        lines += against(summary, other)
    curves = summary.get("lambda_curves") or {}
    if curves:
        lines += ["", "| WEINCE variant | " + " | ".join(LAMBDA_KEYS.values()) + " |",
                  "|---|" + "---:|" * len(LAMBDA_KEYS)]  # fmt: skip
        for name, rows in curves.items():
            cells = []
            for key in LAMBDA_KEYS:
                values = [row[key] for row in rows if key in row]
                cells.append(f"{sum(values) / len(values):.3f}" if values else "n/a")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("(per-step values averaged over the seeds, then over the steps)")
    seconds = summary.get("cell_wall_time_seconds")
    commit = (summary.get("git_commit") or "unknown")[:7]
    lines += ["", f"{len(summary['runs'])} runs at commit `{commit}`"
              + (f"; their training wall times add up to {seconds / 3600:.2f} h." if seconds else ".")]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="sweep folders (or archives) holding comparison.json")
    parser.add_argument("--against", default="", metavar="NAMES",
                        help="comma-separated variants to pair every other variant against as well")  # fmt: skip
    args = parser.parse_args()
    others = tuple(name for name in args.against.split(",") if name)
    print("\n".join(report(folder, others) for folder in args.folders), end="")


if __name__ == "__main__":
    main()
