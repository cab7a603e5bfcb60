"""Per-step training losses of 5 ``cpu-demo`` steps (plain, GradCache, and supervised triplets) and 5
``vision --dataset digits`` steps, fixed seeds.

Used to show that a refactor of the trainers changes no computation: record before, record after, compare
(``tests/test_step_losses.py`` compares a fresh run with ``tests/data/step_losses.json``).

    python scripts/tools/record_step_losses.py --output step_losses.json
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TEXT_ARGS = ["--preset", "cpu-demo", "--max-steps", "5", "--eval-steps", "0", "--eval-before-training", "false",
             "--final-evaluation", "false", "--save-steps", "0", "--report-to", "csv", "--mixed-precision", "no",
             "--seed", "42"]  # fmt: skip
VISION_ARGS = ["--dataset", "digits", "--backbone", "resnet18", "--loss", "weince", "--batch-size", "64",
               "--max-steps", "5", "--seed", "0", "--mixed-precision", "no"]  # fmt: skip
VISION_LOG_EVERY = ["--logging-steps", "1"]  # the shared trainer's name; older versions used --log-every


def _read_losses(output_dir: Path) -> list[float]:
    """The per-step losses, from the run's metrics.csv (long format) or an older log.jsonl."""
    metrics = output_dir / "logs" / "metrics.csv"
    if metrics.is_file():
        with metrics.open(newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if row["name"] == "loss"]
        return [float(row["value"]) for row in sorted(rows, key=lambda row: int(row["step"]))]
    lines = (output_dir / "log.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def _run(args: list[str]) -> None:
    subprocess.run([sys.executable, "-m", "simcse_weince.cli", *args], check=True, stdout=subprocess.DEVNULL)


def _triplets_file(workdir: Path, data_dir: Path) -> Path:
    """SimCSE triplets made from the wiki sample's first 3 x 320 lines (anchor, the next line, the one after it):
    not a meaningful task, a fixed supervised input that goes through the columns path and the hard negatives."""
    lines = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[: 3 * 320]
    rows = [dict(zip(("sent0", "sent1", "hard_neg"), lines[i : i + 3])) for i in range(0, len(lines), 3)]
    path = workdir / "triplets.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def record(workdir: Path, vision_log_flag: list[str] = VISION_LOG_EVERY, extra: bool = True) -> dict:
    from simcse_weince.paths import resolve_data_dir

    runs = {"cpu-demo": ["train", *TEXT_ARGS]}
    if extra:  # added with issue 38: the trainer's GradCache step and the supervised columns
        runs["cpu-demo-gradcache"] = ["train", *TEXT_ARGS, "--mini-batch-size", "16"]
        triplets = _triplets_file(workdir, resolve_data_dir(None))
        runs["triplets-hardness"] = [
            "train",
            *TEXT_ARGS,
            "--train-file",
            str(triplets),
            "--hardness-strength",
            "9",
            "--hardness-mode",
            "in_batch_negatives",
        ]
    runs["digits"] = ["vision", "train", *VISION_ARGS, *vision_log_flag]
    losses = {}
    for name, args in runs.items():
        _run([*args, "--output-dir", str(workdir / name)])
        losses[name] = _read_losses(workdir / name)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=None, help="write the losses here as JSON (default: print only)")
    parser.add_argument("--old-vision-flags", action="store_true", help="use --log-every (before the refactor)")
    parser.add_argument("--only-original", action="store_true", help="only the runs of tests/data/step_losses.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        losses = record(
            Path(workdir),
            ["--log-every", "1"] if args.old_vision_flags else VISION_LOG_EVERY,
            extra=not args.only_original,
        )
    text = json.dumps(losses, indent=1)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
