"""Copy the small, reviewable part of a `compare` sweep into the repository (and back).

A sweep folder holds models and checkpoints (hundreds of MB per cell); what a result needs is far smaller: the
comparison files and, per cell, ``results.json`` and ``training_config.yaml``. Those two are also what ``compare``
needs to count a cell as finished, so copying an archive back into a sweep folder lets a later session (or another
machine) finish an interrupted study with the same command, training only the missing cells.

    python scripts/study/archive_study.py runs/study/cpu-cls results/study/cpu-cls   # sweep -> archive
    python scripts/study/archive_study.py results/study/cpu-cls runs/study/cpu-cls   # archive -> sweep, to finish it
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

SWEEP_FILES = (
    "comparison.json",
    "comparison.md",
    "comparison.png",
    "comparison_lambda.png",
    "budget.json",
    "negatives.json",
    "negatives.md",
    "negatives.png",
)  # Study 2's analyses too
CELL_FILES = ("results.json", "training_config.yaml")


def copy_study(source: Path, destination: Path) -> list[Path]:
    """Copy the sweep-level files and every finished cell's files (a cell without results.json is skipped)."""
    copied = []
    for results in sorted(source.rglob("results.json")):
        if not (results.parent / "training_config.yaml").is_file():
            continue  # not a cell (e.g. a checkpoint's evaluation)
        cell = results.parent.relative_to(source)
        for name in CELL_FILES:
            target = destination / cell / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(results.parent / name, target)
            copied.append(target)
    for path in sorted(source.rglob("*")):
        if path.name in SWEEP_FILES and path.is_file():
            target = destination / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied.append(target)
    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("destination", type=Path)
    args = parser.parse_args()
    if not args.source.is_dir():
        raise SystemExit(f"{args.source} is not a folder")
    copied = copy_study(args.source, args.destination)
    cells = sum(path.name == "results.json" for path in copied)
    print(f"copied {len(copied)} files ({cells} finished cells) from {args.source} to {args.destination}")


if __name__ == "__main__":
    main()
