"""The training loop every trainer runs, top to bottom: set-up, the steps, logging, evaluation, checkpoints,
Ctrl-C and the stop on a non-finite loss, export.

What differs between the text and the vision trainer is a small task object (:class:`TrainingTask`): how to
build the model and the data, one step's loss and logs, evaluation and export, and the explicit
:class:`LoopOptions` that say how its bookkeeping differs. The loop itself is one function, as in nanoGPT's
``train.py`` and Accelerate's ``complete_nlp_example.py``; run state the tasks need (the trainer state, the
steps, the precision used) is a :class:`TrainingRun`, not a list of parameters.

Example (what :func:`simcse_weince.text.train` does)::

    results = run_training(config, TextTask(config), resume=resume, overwrite=overwrite)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from simcse_weince.precision import precision_label
from simcse_weince.training.accelerator import make_accelerator
from simcse_weince.training.runs import RunFolder, load_checkpoint, new_trainer_state
from simcse_weince.training.timing import RunTimer
from simcse_weince.training.tracking import (
    InterruptFlag,
    check_finite,
    make_trackers,
    progress_postfix,
    start_trackers,
    stop_requested,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoopOptions:
    """Where one trainer's loop differs from another's, said once."""

    project: str  # the trackers' project name
    progress_desc: str  # the progress bar's label
    unit: str  # what the throughput counts: "sent", "img"
    items_per_step: int  # examples per optimizer step (throughput)
    logging_steps: int
    log_last_step: bool  # the last step is logged even off the logging grid (vision)
    unlogged: tuple[str, ...]  # entry keys kept in the history but not sent to the trackers
    save_steps: int  # periodic checkpoints every N steps (0: none; Ctrl-C and the last step still save)
    save_total_limit: int
    keep_last_checkpoint: bool  # vision: ``vision eval`` reads it; text: dropped once the export is written
    eval_steps: int = 0  # evaluate every N steps and at the last one (0: never)
    entry_train_seconds: bool = False  # each history entry carries the cumulative training time (text)
    state_keys: tuple[str, ...] = ()  # entry keys also kept in the trainer state (vision: "epoch")


@dataclass
class TrainingRun:
    """One call's run state, filled in as the loop goes: what the task's hooks read."""

    config: object
    accelerator: object
    mixed_precision: str  # the precision used (``config.mixed_precision`` may say auto)
    output_dir: Path
    tensorboard_dropped: str | None  # why TensorBoard logging was dropped, or None
    timer: RunTimer  # the whole run's wall time and its parts (set-up, training, evaluation, checkpoints, ...)
    state: dict = field(default_factory=dict)  # the trainer state (checkpointed)
    total_steps: int = 0
    start_step: int = 0  # the step this call started (resumed) from
    history: list = field(default_factory=list)  # the entries of the steps trained by this call
    last_checkpoint: Path | None = None


class TrainingTask(Protocol):
    """What a trainer supplies to :func:`run_training` (text: :class:`simcse_weince.text.train.TextTask`, vision:
    :class:`simcse_weince.vision.train.VisionTask`). The hooks are called in this order."""

    def accelerator_options(self) -> dict:
        """Keyword arguments for :func:`~simcse_weince.training.accelerator.make_accelerator`."""

    def check(self, run: TrainingRun) -> None:
        """Refuse settings the accelerator makes impossible, before the run folder is touched."""

    def build(self, run: TrainingRun) -> tuple[object, int]:
        """Load data and model, prepare them with the accelerator; ``(model, total_steps)``. Seeded already."""

    def initial_state(self) -> dict:
        """The trainer's own fields of a fresh trainer state."""

    def options(self) -> LoopOptions:
        """Read once the task is built."""

    def loader(self, run: TrainingRun):
        """The data of the remaining steps (``run.start_step`` is set)."""

    def before_training(self, run: TrainingRun) -> None:
        """After the set-up, before the first step (text: the base model's dev score, timed as evaluation)."""

    def describe(self, run: TrainingRun) -> str:
        """What is trained, for the log line that starts the loop (which adds processes, device, precision)."""

    def train_step(self, step: int, batches: Iterator, log_now: bool) -> dict:
        """One optimizer step: forward, backward, update; the entry to log (``"step"``, ``"loss"``, …)."""

    def evaluate(self, step: int, write) -> None:
        """Evaluate the current weights (every ``eval_steps`` and at the last step)."""

    def export(self, run: TrainingRun) -> dict:
        """Write the run's result (``run.last_checkpoint`` holds the last step; ``run.timer`` times its parts and
        reports the whole run); returns what ``train()`` does."""


def check_same_data(saved: dict, fresh: dict, checkpoint) -> None:
    """``--resume`` trains on the data the run started on: the ``data_fingerprint`` (size and sha256 of the
    training file) a trainer records in its state at step 0 must be the file's now, or the resume is refused."""
    old, new = saved.get("data_fingerprint"), fresh.get("data_fingerprint")
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return  # a trainer without a data file (vision: a named data set), or a checkpoint of an earlier release
    if (old.get("size"), old.get("sha256")) != (new.get("size"), new.get("sha256")):
        raise ValueError(
            f"--resume: the training data changed since the run started ({checkpoint} was trained on "
            f"{old.get('path')}: {old.get('size')} bytes, sha256 {str(old.get('sha256'))[:12]}; "
            f"{new.get('path')} now holds {new.get('size')} bytes, sha256 {str(new.get('sha256'))[:12]}); "
            f"put the original file back to resume, or start a new run (another --output-dir, or --overwrite)"
        )


def run_training(config, task: TrainingTask, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Train ``task`` with ``config`` (``output_dir``, ``seed``, ``cpu``, ``mixed_precision``, ``report_to``); the
    result of ``task.export``. ``resume`` and ``overwrite`` as in :class:`~simcse_weince.training.runs.RunFolder`."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    timer = RunTimer()  # wall_time_seconds: the whole run, set-up to the written result (training/timing.py)
    config.validate()
    output_dir = Path(config.output_dir).expanduser()
    log_with, csv_tracker, tensorboard_dropped = make_trackers(config.report_to, output_dir / "logs")
    accelerator, mixed_precision = make_accelerator(
        cpu=config.cpu, mixed_precision=config.mixed_precision, log_with=log_with, project_dir=output_dir,
        **task.accelerator_options(),
    )  # fmt: skip
    run = TrainingRun(config, accelerator, mixed_precision, output_dir, tensorboard_dropped, timer)
    task.check(run)
    folder = RunFolder(output_dir, resume, overwrite, accelerator)
    with folder.restore_on_failure():
        # --- set-up: data, model, optimizer, checkpoint; the folder is claimed only once all have loaded ---------
        set_seed(config.seed)  # before the model: initialisations depend on it
        model, run.total_steps = task.build(run)
        options = task.options()
        state = new_trainer_state(**task.initial_state())
        if folder.checkpoint is not None:
            fresh = state
            state = load_checkpoint(accelerator, folder.checkpoint)
            check_same_data(state, fresh, folder.checkpoint)
            logger.info("resumed from %s at step %d of %d", folder.checkpoint, state["step"], run.total_steps)
            timer.restore(state)
        folder.claim(config)
        run.state, run.start_step = state, state["step"]
        start_step, total_steps = run.start_step, run.total_steps
        loader = task.loader(run)
        start_trackers(accelerator, csv_tracker, start_step, config.to_dict(), options.project)
        timer.add("setup", timer.since_start())
        task.before_training(run)

        # --- the loop -------------------------------------------------------------------------------------------
        logger.info(
            "%s on %d process(es), %s, %s%s", task.describe(run), accelerator.num_processes, accelerator.device,
            precision_label(mixed_precision), " (mixed precision auto)" if config.mixed_precision == "auto" else "",
        )  # fmt: skip
        progress = tqdm(
            total=total_steps, initial=start_step, desc=options.progress_desc,
            disable=not accelerator.is_local_main_process, dynamic_ncols=True,
        )  # fmt: skip
        batches = iter(loader)
        model.train()
        session_seconds, checkpoint, saved_step = 0.0, folder.checkpoint, start_step

        def save(limit: int) -> Path:
            timer.save_into(state)
            with timer.part("checkpoint"):
                return folder.save_checkpoint(state, limit)

        with InterruptFlag() as interrupt:
            for step in range(start_step + 1, total_steps + 1):  # step = optimizer updates done after this one
                step_start = time.perf_counter()
                log_now = step % options.logging_steps == 0 or (options.log_last_step and step == total_steps)
                entry = task.train_step(step, batches, log_now)
                session_seconds += time.perf_counter() - step_start
                state["train_seconds"] += time.perf_counter() - step_start
                state["step"] = step
                state.update({key: entry[key] for key in options.state_keys})
                if options.entry_train_seconds:
                    entry["train_seconds"] = state["train_seconds"]
                check_finite(entry["loss"], step, folder.checkpoints)
                state["history"].append(entry)
                run.history.append(entry)
                speed = (step - start_step) * options.items_per_step / session_seconds
                progress.update(1)
                progress.set_postfix(progress_postfix(entry, speed, mixed_precision, unit=options.unit), refresh=False)
                if log_now:
                    accelerator.log({k: v for k, v in entry.items() if k not in ("step", *options.unlogged)}, step=step)
                if options.eval_steps and (step % options.eval_steps == 0 or step == total_steps):
                    with timer.part("evaluation"):
                        task.evaluate(step, progress.write)

                stop = stop_requested(accelerator, interrupt)
                # the last step is saved below, once the loop is done
                if stop or (options.save_steps and step % options.save_steps == 0 and step < total_steps):
                    checkpoint, saved_step = save(options.save_total_limit), step
                    if stop:
                        progress.close()
                        logger.warning(
                            "%s: checkpoint saved to %s; continue with --resume", interrupt.describe(), checkpoint
                        )
                        accelerator.end_training()
                        raise interrupt.interruption()  # the CLI exits 130 (Ctrl-C) or 143 (SIGTERM)
        progress.close()

        # --- export -------------------------------------------------------------------------------------------------
        # the last step reaches a checkpoint before the export (a full disk during the export must not lose it;
        # --resume then only exports); a trainer that does not keep it drops it once the export is written
        if saved_step != state["step"] or checkpoint is None:
            checkpoint = save(options.save_total_limit if options.keep_last_checkpoint else 0)
        run.last_checkpoint = checkpoint
        results = task.export(run)
        folder.finish(drop=None if options.keep_last_checkpoint else checkpoint)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results
