"""The markdown of a study's results, from its comparison.json files: what README and docs/studies/ show.

For each sweep folder: the paired table (`comparison.md`), the cells' commit, the λ statistics of each WEINCE
variant averaged over seeds and steps, the decision of docs/experiments.md (the 95% interval of the paired
difference above 0, below 0, or containing 0) and the wall time of the cells
(:func:`simcse_weince.compare.report.study_report`).

    python scripts/study/study_report.py results/study/cpu-cls results/study/cpu-demo --against infonce-hardness
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simcse_weince.compare.report import study_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="sweep folders (or archives) holding comparison.json")
    parser.add_argument("--against", default="", metavar="NAMES",
                        help="comma-separated variants to pair every other variant against as well")  # fmt: skip
    args = parser.parse_args()
    others = tuple(name for name in args.against.split(",") if name)
    print("\n".join(study_report(folder, others) for folder in args.folders), end="")


if __name__ == "__main__":
    main()
