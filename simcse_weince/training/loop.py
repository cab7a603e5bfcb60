"""The training loop every trainer runs, top to bottom: set-up, the steps, logging, evaluation, checkpoints,
Ctrl-C and the stop on a non-finite loss, export.

What differs between the text and the vision trainer is a small recipe object (:class:`TrainingRecipe`): how to
build the model and the data, one step's loss and logs, evaluation and export, and :class:`LoopOptions` (names,
schedules, whether the last checkpoint is the run's result). The loop itself is one function, as in nanoGPT's
``train.py`` and Accelerate's ``complete_nlp_example.py``, read top to bottom; what would interrupt that reading
is a named helper below it, in the order the loop calls them (opening the run: trackers, accelerator, run folder;
the set-up and the state a run starts or resumes from; the first log line and progress bar; one step and its
bookkeeping; a checkpoint; the stop on Ctrl-C; the export). Run state the recipes need (the trainer state, the
steps, the precision used) is a :class:`TrainingRun`, not a list of parameters.

Why one shared loop and not each trainer's own short loop (torchtune's rule: an interface is not a vehicle for
code reuse): what it holds is the machinery every trainer needs and must get right the same way (claiming the run
folder only once every input has loaded, atomic checkpoints, exact resume, Ctrl-C and SIGTERM, the stop on a
non-finite loss, trackers, timings); a fix to it must reach both trainers. It has no branch on the kind of trainer:
every trainer logs the same way (each entry's numbers, every ``logging_steps`` and at the last step; the
cumulative training time kept in the history), and a trainer's own steps live in its recipe. If a third trainer
needs a switch here, it gets its own loop instead.

Example (what :func:`simcse_weince.text.train` does)::

    results = run_training(config, TextRecipe(config), resume=resume, overwrite=overwrite)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from simcse_weince.precision import precision_label
from simcse_weince.training.accelerator import make_accelerator
from simcse_weince.training.checkpoints import (
    check_settings_of_record,
    load_checkpoint,
    new_run_id,
    new_trainer_state,
    settings_of_record,
)
from simcse_weince.training.flops import PEAK_DTYPES, matmul_peak_flops
from simcse_weince.training.folder_io import run_folder_path
from simcse_weince.training.kernel_caches import bound_kernel_caches
from simcse_weince.training.run_folder import RunFolder
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

#: the config fields naming files a run reads: --overwrite refuses to replace them
RUN_INPUTS = ("train_file", "data_dir", "model")


@dataclass(frozen=True)
class LoopOptions:
    """What one trainer's loop is called and how often it logs, evaluates and saves."""

    project: str  # the trackers' project name
    progress_desc: str  # the progress bar's label
    unit: str  # what the throughput counts: "sent", "img"
    items_per_step: int  # examples per optimizer step (throughput)
    logging_steps: int  # log every N steps (and the last one)
    save_steps: int  # periodic checkpoints every N steps (0: none; Ctrl-C and the last step still save)
    save_total_limit: int
    keep_last_checkpoint: bool  # is the last checkpoint the run's result (vision eval reads it), or dropped once
    # the export is written (the text trainer exports a SentenceTransformer)?
    eval_steps: int = 0  # evaluate every N steps and at the last one (0: never)
    # does train_step's entry carry "model_flops" (training/flops.py)? Then the loop measures the device's matmul
    # peak at start-up and shows the FLOP utilisation (mfu) on the progress bar and in the trainer state
    model_flops: bool = False


@dataclass
class TrainingRun:
    """One call's run state, filled in as the loop goes: what the recipe's hooks read."""

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
    peak_flops: float | None = None  # the device's measured matmul FLOP/s at the run's precision (model_flops)
    step_seconds: float = 0.0  # this call's steps' own time, without evaluation and checkpoints (the throughput)
    step_flops: int = 0  # this call's steps' model FLOPs (0 where the recipe does not count them)


class TrainingRecipe:
    """What a trainer supplies to :func:`run_training` (text: :class:`simcse_weince.text.trainer.TextRecipe`, vision:
    :class:`simcse_weince.vision.trainer.VisionRecipe`). The hooks are called in this order; those with a body here do
    nothing unless a trainer needs them."""

    def accelerator_options(self) -> dict:
        """Keyword arguments for :func:`~simcse_weince.training.accelerator.make_accelerator`."""
        return {}

    def check(self, run: TrainingRun) -> None:
        """Refuse settings the accelerator makes impossible, before the run folder is touched."""

    def build(self, run: TrainingRun) -> tuple[object, int]:
        """Load data and model, prepare them with the accelerator; ``(model, total_steps)``. Seeded already."""
        raise NotImplementedError

    def initial_state(self) -> dict:
        """The trainer's own fields of a fresh trainer state (a ``data_fingerprint`` is checked on resume)."""
        return {}

    def options(self) -> LoopOptions:
        """Read once the recipe is built."""
        raise NotImplementedError

    def loader(self, run: TrainingRun):
        """The data of the remaining steps (``run.start_step`` is set)."""
        raise NotImplementedError

    def before_training(self, run: TrainingRun) -> None:
        """After the set-up, before the first step (text: the base model's dev score, timed as evaluation)."""

    def describe(self, run: TrainingRun) -> str:
        """What is trained, for the log line that starts the loop (which adds processes, device, precision)."""
        raise NotImplementedError

    def train_step(self, step: int, batches: Iterator, log_now: bool) -> dict:
        """One optimizer step: forward, backward, update; the entry to log (``"step"``, ``"loss"``, numbers)."""
        raise NotImplementedError

    def evaluate(self, step: int, write) -> None:
        """Evaluate the current weights (every ``eval_steps`` and at the last step)."""

    def export(self, run: TrainingRun) -> dict:
        """Write the run's result (``run.last_checkpoint`` holds the last step; ``run.timer`` times its parts and
        reports the whole run); returns what ``train()`` does."""
        raise NotImplementedError


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


def run_training(config, recipe: TrainingRecipe, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Train ``recipe`` with ``config`` (``output_dir``, ``seed``, ``cpu``, ``mixed_precision``, ``report_to``); the
    result of ``recipe.export``. ``resume`` and ``overwrite`` as in
    :class:`~simcse_weince.training.run_folder.RunFolder`."""
    timer = RunTimer()  # wall_time_seconds: the whole run, set-up to the written result (training/timing.py)
    run, folder, csv_tracker = open_run(config, recipe, timer, resume, overwrite)
    with folder.restore_on_failure():
        # --- set-up: data, model, optimizer, checkpoint; the folder is claimed only once all have loaded ---------
        model, options, loader = set_up(recipe, run, folder, csv_tracker)
        recipe.before_training(run)

        # --- the loop -------------------------------------------------------------------------------------------
        checkpoint, saved_step, batches, progress = folder.checkpoint, run.start_step, None, None
        try:
            # a signal once the bar is up, or while the loader's workers start, waits for the step boundary
            with InterruptFlag() as interrupt:
                progress = start_progress(recipe, run, options)
                batches = iter(loader)
                model.train()
                for step in range(run.start_step + 1, run.total_steps + 1):  # step = optimizer updates done after it
                    entry = train_one_step(recipe, run, options, step, batches, folder.checkpoints)
                    show_progress(progress, run, options, entry, step)
                    if options.eval_steps and (step % options.eval_steps == 0 or step == run.total_steps):
                        with timer.part("evaluation"):
                            recipe.evaluate(step, progress.write)

                    stop = stop_requested(run.accelerator, interrupt)
                    # the last step is saved below, once the loop is done
                    if stop or (options.save_steps and step % options.save_steps == 0 and step < run.total_steps):
                        checkpoint, saved_step = save_checkpoint(run, folder, options.save_total_limit), step
                        if stop:
                            raise interruption(run, progress, interrupt, checkpoint)
        finally:
            if progress is not None:
                progress.close()  # now: a bar closed later would be drawn after the CLI's last line
            batches = None  # the loader's workers end here, not at exit, where one still starting finds its parent gone
        if options.model_flops:  # measured again once the steps are done: the best of two is less noisy
            peak = matmul_peak_flops(PEAK_DTYPES[run.mixed_precision], run.accelerator.device)
            run.peak_flops = max(run.peak_flops, peak)

        # --- export -------------------------------------------------------------------------------------------------
        results = export_run(recipe, run, folder, options, checkpoint, saved_step)
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()
    return results


def open_run(
    config, recipe: TrainingRecipe, timer: RunTimer, resume, overwrite
) -> tuple[TrainingRun, RunFolder, object]:
    """Check the config, make the trackers and the accelerator, let the recipe refuse what the accelerator makes
    impossible, and open the run folder (not yet claimed); ``(run, folder, csv_tracker)``."""
    config.validate()
    bound_kernel_caches()  # before any kernel is built: new batch shapes must not grow the process every step
    output_dir = run_folder_path(config.output_dir)  # one spelling of the folder: ".", "R/" and "../R" are one
    log_with, csv_tracker, tensorboard_dropped = make_trackers(config.report_to, output_dir / "logs")
    accelerator, mixed_precision = make_accelerator(
        cpu=config.cpu, mixed_precision=config.mixed_precision, log_with=log_with, project_dir=output_dir,
        **recipe.accelerator_options(),
    )  # fmt: skip
    run = TrainingRun(config, accelerator, mixed_precision, output_dir, tensorboard_dropped, timer)
    recipe.check(run)
    inputs = [value for name in RUN_INPUTS if (value := getattr(config, name, None))]
    inputs = [value for value in inputs if Path(value).expanduser().exists()]  # a hub model id is not a path
    return run, RunFolder(output_dir, resume, overwrite, accelerator, inputs), csv_tracker


def set_up(
    recipe: TrainingRecipe, run: TrainingRun, folder: RunFolder, csv_tracker
) -> tuple[object, LoopOptions, object]:
    """Seed; build the model and data; start or resume the trainer state and claim the folder (only now that all
    have loaded); start the trackers; ``(model, options, loader)``. Its time is the run's set-up."""
    from accelerate.utils import set_seed

    set_seed(run.config.seed)  # before the model: initialisations depend on it
    model, run.total_steps = recipe.build(run)
    options = recipe.options()
    state = start_or_resume_state(recipe, run, folder)
    folder.claim(run.config, state["run_id"])
    run.state, run.start_step = state, state["step"]
    loader = recipe.loader(run)
    start_trackers(run.accelerator, csv_tracker, run.start_step, run.config.to_dict(), options.project)
    if options.model_flops:  # a fraction of a second: a GEMM at the run's precision
        run.peak_flops = matmul_peak_flops(PEAK_DTYPES[run.mixed_precision], run.accelerator.device)
    run.timer.add("setup", run.timer.since_start())
    return model, options, loader


def start_or_resume_state(recipe: TrainingRecipe, run: TrainingRun, folder: RunFolder) -> dict:
    """The trainer state the run starts from: a fresh one, or the checkpoint's when resuming (on the same data; the
    run timer continues from it)."""
    # the run id is drawn once, at a fresh start: a --resume that restarts from step 0 keeps its folder's
    state = new_trainer_state(folder.run_id or new_run_id(), settings_of_record(run.config), **recipe.initial_state())
    if folder.checkpoint is not None:
        fresh = state
        state = load_checkpoint(run.accelerator, folder.checkpoint)
        check_same_data(state, fresh, folder.checkpoint)
        check_settings_of_record(state, run.config, folder.checkpoint)
        state.setdefault("run_id", fresh["run_id"])  # a checkpoint of an earlier release has none
        state["settings"] = fresh["settings"]  # the same in all that alters training; its new length, logs, ...
        logger.info("resumed from %s at step %d of %d", folder.checkpoint, state["step"], run.total_steps)
        run.timer.restore(state)
    return state


def start_progress(recipe: TrainingRecipe, run: TrainingRun, options: LoopOptions):
    """The log line that starts the loop (what is trained, where, at which precision) and its progress bar."""
    from tqdm.auto import tqdm

    accelerator, mixed_precision = run.accelerator, run.mixed_precision
    logger.info(
        "%s on %d process(es), %s, %s%s", recipe.describe(run), accelerator.num_processes, accelerator.device,
        precision_label(mixed_precision), " (mixed precision auto)" if run.config.mixed_precision == "auto" else "",
    )  # fmt: skip
    return tqdm(
        total=run.total_steps, initial=run.start_step, desc=options.progress_desc,
        disable=not accelerator.is_local_main_process, dynamic_ncols=True,
    )  # fmt: skip


def train_one_step(
    recipe: TrainingRecipe, run: TrainingRun, options: LoopOptions, step: int, batches: Iterator, checkpoints
) -> dict:
    """One optimizer step (``recipe.train_step``) and its bookkeeping (:func:`record_step`); the entry. The step's
    own time and model FLOPs are added to this call's (the throughput and MFU on the progress bar)."""
    step_start = time.perf_counter()
    log_now = step % options.logging_steps == 0 or step == run.total_steps
    entry = recipe.train_step(step, batches, log_now)
    run.step_seconds += time.perf_counter() - step_start
    run.step_flops += record_step(run, entry, step, step_start, log_now, checkpoints)
    return entry


def show_progress(progress, run: TrainingRun, options: LoopOptions, entry: dict, step: int) -> None:
    """Advance the progress bar by one step; its postfix: the entry's numbers, this call's throughput and MFU."""
    seconds, flops = run.step_seconds, run.step_flops
    speed = (step - run.start_step) * options.items_per_step / seconds
    mfu = flops / seconds / run.peak_flops if run.peak_flops and flops else None
    progress.update(1)
    progress.set_postfix(progress_postfix(entry, speed, run.mixed_precision, unit=options.unit, mfu=mfu), refresh=False)


def save_checkpoint(run: TrainingRun, folder: RunFolder, limit: int) -> Path:
    """A checkpoint of the trainer state (with the run timer's parts so far), timed as checkpointing; keeps the
    last ``limit`` (0: all)."""
    run.timer.save_into(run.state)
    with run.timer.part("checkpoint"):
        return folder.save_checkpoint(run.state, limit)


def interruption(run: TrainingRun, progress, interrupt: InterruptFlag, checkpoint: Path) -> BaseException:
    """After Ctrl-C or SIGTERM, once ``checkpoint`` is saved: close the bar, say how to continue, end the trackers;
    the exception to raise (the CLI exits 130 for Ctrl-C, 143 for SIGTERM)."""
    progress.close()
    logger.warning("%s: checkpoint saved to %s; continue with --resume", interrupt.describe(), checkpoint)
    run.accelerator.end_training()
    return interrupt.interruption()


def export_run(
    recipe: TrainingRecipe, run: TrainingRun, folder: RunFolder, options: LoopOptions, checkpoint, saved_step: int
) -> dict:
    """Save the last step if no checkpoint holds it yet, export the run's result, and release the folder;
    what ``recipe.export`` returns."""
    # the last step reaches a checkpoint before the export (a full disk during the export must not lose it;
    # --resume then only exports); a trainer that does not keep it drops it once the export is written
    if saved_step != run.state["step"] or checkpoint is None:
        checkpoint = save_checkpoint(run, folder, options.save_total_limit if options.keep_last_checkpoint else 0)
    run.last_checkpoint = checkpoint
    results = recipe.export(run)
    folder.finish(drop=None if options.keep_last_checkpoint else checkpoint)
    return results


def record_step(run: TrainingRun, entry: dict, step: int, step_start: float, log_now: bool, checkpoints) -> int:
    """One trained step's bookkeeping: its time in the trainer state, the stop on a non-finite loss, the trackers
    (every ``logging_steps``), the cumulative training time and model FLOPs in the entry, the history. Returns the
    step's model FLOPs (0 where the recipe does not count them)."""
    state = run.state
    state["train_seconds"] += time.perf_counter() - step_start
    state["step"] = step
    check_finite(entry["loss"], step, checkpoints)
    step_flops = entry.pop("model_flops", None)
    if log_now:
        run.accelerator.log({key: value for key, value in entry.items() if key != "step"}, step=step)
    # in the history, not tracked metrics: both cumulative, so any span of steps gives its FLOP/s
    entry["train_seconds"] = state["train_seconds"]
    # absent: resumed from an earlier release's checkpoint, whose steps' FLOPs are unknown
    if step_flops is not None and state.get("model_flops") is not None:
        state["model_flops"] = entry["model_flops"] = state["model_flops"] + step_flops
    state["history"].append(entry)
    run.history.append(entry)
    return step_flops or 0
