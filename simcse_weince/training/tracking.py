"""What a run reports while it trains, shared by the text and vision trainers.

* the per-step log: Accelerate trackers, always including ``logs/metrics.csv`` (long format ``step,name,value``,
  the one format :func:`simcse_weince.diagnostics.plots.load_training_log` reads), plus TensorBoard when
  installed;
* the progress-bar postfix (loss, WEINCE's λ statistics, throughput, precision);
* Ctrl-C and SIGTERM, which ask for a checkpoint at the next step boundary (:mod:`simcse_weince.training.signals`),
  and the stop on a non-finite loss.
"""

from __future__ import annotations

import csv
import importlib.util
import logging
import math
import signal
from pathlib import Path

import torch

from simcse_weince.precision import precision_label
from simcse_weince.training.signals import InterruptFlag
from simcse_weince.weince.loss import STATISTIC_KEYS

logger = logging.getLogger(__name__)


def _logged_step(row: dict) -> float:
    """A metrics.csv row's step; a row that names none (a damaged or edited log) sorts past every step (dropped)."""
    try:
        step = int(row["step"])
    except (KeyError, TypeError, ValueError):
        return math.inf
    return step if step >= 0 else math.inf


def make_csv_tracker(logging_dir: Path):
    """An Accelerate tracker appending ``step,name,value`` rows to ``<logging_dir>/metrics.csv`` (long format:
    any metric at any step; ``pandas.read_csv(...).pivot(index="step", columns="name")`` makes it wide).

    Set ``tracker.start_step`` before ``init_trackers``: rows past it (written by a run killed after its last
    checkpoint) are dropped on resume. Only the main process writes.
    """
    from accelerate import PartialState
    from accelerate.tracking import GeneralTracker

    class CSVTracker(GeneralTracker):
        name = "csv"
        requires_logging_directory = True
        main_process_only = True

        def __init__(self):
            super().__init__()
            self.path = Path(logging_dir) / "metrics.csv"
            self.start_step = 0
            self.file = self.writer = None

        def start(self):
            if not PartialState().is_main_process:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rows = []
            if self.path.is_file():
                with self.path.open(newline="") as handle:
                    rows = [row for row in csv.DictReader(handle) if _logged_step(row) <= self.start_step]
            self.file = self.path.open("w", newline="")
            self.writer = csv.writer(self.file)
            self.writer.writerow(["step", "name", "value"])
            self.writer.writerows([row["step"], row["name"], row["value"]] for row in rows)
            self.file.flush()

        @property
        def tracker(self):
            return self.writer

        def store_init_configuration(self, values: dict):
            pass  # the resolved config is written to training_config.yaml

        def log(self, values: dict, step: int | None = None, **kwargs):
            if self.file is not None:
                self.writer.writerows([step, name, value] for name, value in values.items())
                self.file.flush()

        def finish(self):
            if self.file is not None:
                self.file.close()
                self.file = None

    return CSVTracker()


def make_trackers(report_to, logging_dir: Path) -> tuple[list, object | None, str | None]:
    """``(log_with for the Accelerator, the CSV tracker or None, why TensorBoard was dropped or None)``."""
    log_with, dropped = [], None
    if "tensorboard" in report_to:
        if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
            log_with.append("tensorboard")
        else:
            dropped = "tensorboard: not installed (pip install tensorboard); logged to CSV only"
            logger.warning("tensorboard is not installed: logging to CSV only (pip install tensorboard)")
    csv_tracker = make_csv_tracker(logging_dir) if "csv" in report_to else None
    if csv_tracker is not None:
        log_with.append(csv_tracker)
    return log_with, csv_tracker, dropped


def start_trackers(accelerator, csv_tracker, start_step: int, config: dict, project: str) -> None:
    """Open the trackers; the CSV log keeps only the rows up to ``start_step`` (a resumed run rewrites the rest)."""
    if csv_tracker is not None:
        csv_tracker.start_step = start_step
    if not accelerator.log_with:
        return
    flat = {}  # TensorBoard's hparams accept only scalars and strings
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(
                {f"{key}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in value.items()}
            )
        else:
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    accelerator.init_trackers(project, config=flat)
    if csv_tracker is not None and csv_tracker.file is None:
        csv_tracker.start()  # Accelerate < 1.4 builds trackers without calling start(); later ones call it


def stop_requested(accelerator, interrupt: InterruptFlag) -> bool:
    """Ctrl-C or SIGTERM on any process stops every process at the same step (and with that signal's exit code)."""
    if accelerator.num_processes == 1:
        return interrupt.raised
    signums = [int(signal.SIGINT), int(signal.SIGTERM)]
    counts = accelerator.reduce(
        torch.tensor([float(interrupt.signum == signum) for signum in signums], device=accelerator.device), "sum"
    ).tolist()
    if interrupt.signum is None and any(counts):  # another process got the signal
        interrupt.signum = signums[1] if counts[1] else signums[0]
    return interrupt.raised


def check_finite(loss: float, step: int, checkpoints: Path) -> None:
    """Stop at the first non-finite loss, before it reaches a checkpoint."""
    if not math.isfinite(loss):
        raise RuntimeError(
            f"the loss is {loss} at step {step}; lower the learning rate or use bf16 / no mixed precision "
            f"(the last checkpoint is in {checkpoints})"
        )


def _mean(values):
    values = [value for value in values if value is not None and math.isfinite(value)]
    return sum(values) / len(values) if values else None


def summarize_lambda(history: list[dict]) -> dict:
    """Mean over training and the last value of each λ statistic (empty for InfoNCE)."""
    summary = {}
    for name in STATISTIC_KEYS:
        values = [entry[name] for entry in history if name in entry]
        if values:
            summary[name] = {"mean": _mean(values), "last": values[-1]}
    return summary


#: how each λ statistic is shown in the progress bar: label, format
_POSTFIX = dict(zip(STATISTIC_KEYS, (("λ", ".3f"), ("λ>.5", ".2f"), ("ρ0", ".3f"), ("ΔAIC", ".1f"), ("β̂", ".2f"))))


def progress_postfix(
    entry: dict, items_per_second: float, mixed_precision: str = "no", unit: str = "sent", mfu: float | None = None
) -> dict:
    """The progress bar's postfix: the loss, WEINCE's λ statistics when there are any, throughput, the FLOP
    utilisation when known (model FLOP/s over the measured matmul peak, training/flops.py), precision."""
    postfix = {"loss": f"{entry['loss']:.4f}"}
    postfix.update({label: format(entry[key], spec) for key, (label, spec) in _POSTFIX.items() if key in entry})
    postfix[f"{unit}/s"] = f"{items_per_second:.1f}"
    if mfu is not None:
        postfix["mfu"] = f"{100 * mfu:.1f}%"
    postfix["precision"] = precision_label(mixed_precision)
    return postfix
