"""A run's checkpoints: saved atomically, verified by their manifest, loaded without unpickling, each carrying its
run's identity and settings of record (layout and checks: docs/training.md).

``checkpoints/step-0000062/`` (Accelerate's state, ``trainer_state.json``, ``manifest.json`` with the size and sha256
of every file) is written to ``step-….tmp`` and renamed: a kill mid-save leaves no half checkpoint. Nothing in a run
folder is unpickled: every ``.bin``/``.pkl``/``.pt`` is read with ``weights_only=True`` first. A failed save (full
disk) ends in a :class:`WriteError` naming the folder and the cause, and leaves no ``.tmp``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

from simcse_weince.provenance import file_sha256
from simcse_weince.records import loads_json
from simcse_weince.safe_load import RefusedPickle, is_refused, load_tensors, refusal, refused_global
from simcse_weince.settings import RESUMABLE_SECTIONS, RESUMABLE_SETTINGS
from simcse_weince.training.folder_io import remove, write_text

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"  # sizes and sha256 of a checkpoint's files, checked on --resume
PICKLE_SUFFIXES = (".bin", ".pkl", ".pt")  # torch.save files: read only with weights_only=True


class WriteError(RuntimeError):
    """A checkpoint or the export could not be written; the message names the folder and the cause."""


def _unreadable(path: Path, error: Exception) -> str:
    """The problem of a file that failed to load, naming it; a refused pickle says so."""
    if is_refused(error):
        return error.args[0] if isinstance(error, RefusedPickle) else refusal(path, refused_global(error))
    text = str(error)
    return f"{path} cannot be read ({type(error).__name__}: {text.splitlines()[0][:200] if text else ''})"


def new_run_id() -> str:
    """A run's identity, drawn once at its fresh start (a restart from step 0 keeps its folder's)."""
    return uuid.uuid4().hex


def new_trainer_state(run_id: str, settings: dict, **extra) -> dict:
    """The trainer state of a run at step 0 (the schema every trainer saves in ``trainer_state.json``): ``run_id``
    ties every checkpoint to its run, ``settings`` (the resolved config) is what the checkpoint was trained with."""
    # model_flops: the steps' model FLOPs so far (training/flops.py); a checkpoint of an earlier release lacks it
    return {"step": 0, "history": [], "train_seconds": 0.0, "wall_seconds": 0.0, "model_flops": 0,
            "run_id": run_id, "settings": settings, **extra}  # fmt: skip


def settings_of_record(config) -> dict:
    """The config as a checkpoint records it (plain JSON values)."""
    return json.loads(json.dumps(config.to_dict(), default=str))


def _flat(settings: dict) -> dict:
    flat = {}
    for name, value in settings.items():
        if isinstance(value, dict):
            flat.update({f"{name}.{field}": inner for field, inner in value.items()})
        else:
            flat[name] = value
    return flat


def check_settings_of_record(state: dict, config, checkpoint: Path) -> None:
    """``--resume`` continues what the checkpoint trained: a setting that alters training (not in
    RESUMABLE_SETTINGS) that differs from the checkpoint's record is refused, each named with both values."""
    record = state.get("settings")
    if not isinstance(record, dict):
        return  # a checkpoint of an earlier release records no settings
    saved, now = _flat(record), _flat(settings_of_record(config))
    fixed = [
        f"{name}: {saved[name]} != {now[name]}"
        for name in saved
        if name in now and saved[name] != now[name]
        and name not in RESUMABLE_SETTINGS and name.split(".")[0] not in RESUMABLE_SECTIONS
    ]  # fmt: skip
    if fixed:
        raise ValueError(
            f"--resume: checkpoint {checkpoint} was trained with other settings than this command gives "
            f"({'; '.join(fixed)}: the checkpoint's, then this command's); resume with the checkpoint's settings "
            f"(put them back in the flags, --config or {checkpoint.parent.parent / 'training_config.yaml'}), or "
            f"start a new run with the new ones (another --output-dir, or --overwrite)"
        )


def list_checkpoints(output_dir: Path) -> list[Path]:
    """The step checkpoints of a run, newest first (finished ones only: a save in progress ends in .tmp)."""
    return sorted((output_dir / CHECKPOINTS).glob("step-*[0-9]"), reverse=True)


def newest_intact_checkpoint(output_dir: Path) -> Path | None:
    """The newest checkpoint whose files pass :func:`verify_checkpoint`; damaged newer ones are named in a
    warning. Raises ValueError when there are checkpoints and none is intact."""
    damaged = []
    for checkpoint in list_checkpoints(output_dir):
        problems = verify_checkpoint(checkpoint)
        if not problems:
            for path, problem in damaged:
                logger.warning(
                    "checkpoint %s is damaged (%s); resuming from %s, the newest intact one (the steps after it "
                    "are trained again, on the same data with the same dropout masks)",
                    path,
                    problem,
                    checkpoint,
                )
            return checkpoint
        damaged.append((checkpoint, problems[0]))
    if damaged:
        path, problem = damaged[0]
        raise ValueError(
            f"--resume: checkpoint {path} is damaged: {problem}; no intact checkpoint is left in "
            f"{output_dir / CHECKPOINTS}: start again with --overwrite (or restore the file)"
        )
    return None


def checkpoint_run_id(checkpoint: Path) -> str | None:
    try:
        return loads_json((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"), checkpoint).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None  # damaged: verify_checkpoint names the file


def checkpoint_to_resume(output_dir: Path, resume, folder_run: str | None, is_main: bool) -> Path | None:
    """The verified checkpoint ``--resume`` continues (``resume``: True / "latest" or a path; None when the run has
    none yet); one of another folder, or whose run id is not ``folder_run`` (the folder's), is refused."""
    named = resume is not True and resume != "latest"
    if named and not Path(resume).expanduser().is_dir():
        raise FileNotFoundError(f"--resume: checkpoint folder {resume} not found")
    checkpoint = Path(resume).expanduser() if named else newest_intact_checkpoint(output_dir)
    if checkpoint is None:
        if is_main:
            logger.warning("--resume: no checkpoint in %s yet; starting from step 0", output_dir / CHECKPOINTS)
        return None
    _check_belongs(checkpoint, output_dir, folder_run)
    problems = verify_checkpoint(checkpoint) if named else []
    if problems:
        intact = next((path for path in list_checkpoints(output_dir) if not verify_checkpoint(path)), None)
        hint = (
            f"the newest intact checkpoint is {intact}: resume from it with --resume {intact}"
            if intact is not None
            else f"no intact checkpoint is left in {output_dir / CHECKPOINTS}: start again with --overwrite"
        )
        raise ValueError(f"--resume: checkpoint {checkpoint} is damaged: {problems[0]}; {hint}")
    return checkpoint


def _check_belongs(checkpoint: Path, output_dir: Path, folder_run: str | None) -> None:
    checkpoint_run = checkpoint_run_id(checkpoint)
    home = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else checkpoint.parent
    own = f"resume {output_dir} from its own checkpoints (--resume, or --resume {output_dir / CHECKPOINTS}/step-N)"
    if checkpoint.resolve().parent != (output_dir / CHECKPOINTS).resolve():
        raise ValueError(
            f"--resume: checkpoint {checkpoint} belongs to the run in {home} (run {checkpoint_run or 'unrecorded'}), "
            f"not to the run in {output_dir} (run {folder_run or 'unrecorded'}): {own}, or continue the other run "
            f"with --output-dir {home} --resume"
        )
    if checkpoint_run and folder_run and checkpoint_run != folder_run:
        raise ValueError(
            f"--resume: checkpoint {checkpoint} was saved by run {checkpoint_run}, but {output_dir} holds run "
            f"{folder_run} (recorded in run_files.json and training_config.yaml): it was copied in from another "
            f"run; remove it (rm -r {checkpoint}) and {own}"
        )


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and sha256 of every file of a checkpoint, so a damaged file is found on resume."""
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1), encoding="utf-8")


def verify_checkpoint(checkpoint: Path) -> list[str]:
    """What is wrong with a checkpoint's files (empty when intact), each problem naming the file: every file its
    manifest lists must be there with its size and sha256. (The RNG state is checked where it is set, on load.)"""
    manifest_path = checkpoint / MANIFEST
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return [f"{manifest_path} is missing (a save that did not finish, or a release before manifests)"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return [f"its manifest {manifest_path} is unreadable ({error})"]
    problems = [] if TRAINER_STATE in files else [f"{manifest_path} lists no trainer_state.json"]
    for name, entry in files.items():
        path = checkpoint / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(
                f"{path} has {path.stat().st_size} bytes where {entry['size']} were saved (truncated or replaced)"
            )
        elif file_sha256(path) != entry["sha256"]:
            problems.append(f"{path} does not match the sha256 saved in {MANIFEST} (corrupted)")
    return problems


def _rng_problem(path: Path, error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"{path} holds no {error.args[0]} (a part of the RNG state)"
    if isinstance(error, FileNotFoundError):
        return f"{path} is missing (the RNG state)"
    problem = _unreadable(path, error)
    if "refused unread" in problem:
        return problem
    return f"{path} does not restore the RNG state ({type(error).__name__}: {str(error).splitlines()[0][:200]})"


def _restore_rng(states: dict, device_type: str) -> None:
    """Set Python's, numpy's and torch's generators (and ``device_type``'s, such as "cuda") from an Accelerate RNG
    state: Accelerate only logs a failed restore at INFO, and the resumed run would draw other random numbers."""
    import random

    import numpy as np

    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if device_type not in ("cpu", "mps"):  # Accelerate keeps the accelerator's under torch_<type>_manual_seed
        getattr(torch, device_type).set_rng_state_all(states[f"torch_{device_type}_manual_seed"])


def read_trainer_state(checkpoint: Path) -> dict:
    path = checkpoint / TRAINER_STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--resume: {path} is damaged ({error}); resume from an older checkpoint") from None
    return state


# torch's zip writer reports a failed write (a full disk) as "[enforce fail at inline_container.cc:672] . unexpected
# pos ...", without the errno; safetensors as "... I/O error: ... (os error 28)"
_TORCH_WRITER_FAILURES = ("inline_container", "PytorchStreamWriter", "unexpected pos", "file write failed")
_OS_ERROR_NUMBER = re.compile(r"\(os error (\d+)\)")


def write_failure_cause(error: BaseException, folder: Path) -> str | None:
    """Why a write into ``folder`` failed ("No space left on device", "Read-only file system", ...), or None
    when ``error`` is not a failed write."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    text = str(error)
    found = _OS_ERROR_NUMBER.search(text)
    if found:
        return os.strerror(int(found.group(1)))
    if isinstance(error, RuntimeError) and any(marker in text for marker in _TORCH_WRITER_FAILURES):
        first_line = text.splitlines()[0][:200] if text else type(error).__name__
        return _full_disk(folder) or f"a write failed ({first_line})"
    return None


def _full_disk(folder: Path) -> str | None:
    """ENOSPC's message where the file system has under 1 MiB free (torch's writer drops the errno)."""
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return os.strerror(errno.ENOSPC) if shutil.disk_usage(folder).free < 1 << 20 else None


@contextlib.contextmanager
def reporting_write_failures(target: Path, partial: Path, after: str):
    """Inside: a failed write into ``target`` (being written to ``partial``) removes ``partial`` and raises one
    :class:`WriteError` line: ``cannot write <target>: <cause>; <after>``. Other errors pass (``partial`` removed)."""
    try:
        yield
    except Exception as error:
        cause = write_failure_cause(error, partial)  # before the removal: the disk is still as the write found it
        shutil.rmtree(partial, ignore_errors=True)
        if cause is None:
            raise
        raise WriteError(f"cannot write {target}: {cause}; {after}") from error


def save_checkpoint(accelerator, output_dir: Path, state: dict, limit: int) -> Path:
    """Accelerate's state, the trainer state and the manifest, written to ``.tmp`` and renamed (a failed write
    raises :class:`WriteError`; the earlier checkpoints stay). ``limit``: keep that many (0: delete none)."""
    final = output_dir / CHECKPOINTS / f"step-{state['step']:07d}"
    staging = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:  # a save killed midway leaves its .tmp: it may be what fills the disk
        for stale in (output_dir / CHECKPOINTS).glob("step-*.tmp"):
            remove(output_dir, stale)  # a link planted at that name is removed, never written through
    accelerator.wait_for_everyone()
    earlier = next(iter(list_checkpoints(output_dir)), None)
    after = (
        f"the partial copy is removed and the newest checkpoint, {earlier}, is untouched: free space, then "
        f"continue with --resume"
        if earlier is not None
        else "the partial copy is removed; this run has no checkpoint on disk yet"
    )
    with reporting_write_failures(final, staging, after):
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_text(output_dir, staging / TRAINER_STATE, json.dumps(state))
            write_manifest(staging)
            remove(output_dir, final)
            os.replace(staging, final)
    if accelerator.is_main_process:
        older = sorted((output_dir / CHECKPOINTS).glob("step-*[0-9]"))[:-limit] if limit else []
        for path in older:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, checkpoint: Path) -> dict:
    """Restore a verified checkpoint into the prepared objects; returns its trainer state.

    Every pickle-format file is first read with ``weights_only=True`` (memory-mapped, so the tensors are not
    read): Accelerate unpickles some of them fully (``custom_checkpoint_*.pkl``, and every file in older
    Accelerate releases), which would run any code a crafted file holds. The RNG state is then set again here,
    so a part that Accelerate could not restore (it only logs that at INFO) stops the resume."""
    state = read_trainer_state(checkpoint)
    for path in sorted(checkpoint.iterdir()):
        if path.suffix in PICKLE_SUFFIXES:
            try:
                _check_tensors_only(path)
            except Exception as error:  # noqa: BLE001 - damaged or refused: either way it must not be loaded
                raise _unusable(checkpoint, _unreadable(path, error)) from None
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as error:
        raise RuntimeError(
            f"--resume: cannot load checkpoint {checkpoint} ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}); resume with the settings it was saved with"
        ) from error
    rng_path = checkpoint / f"random_states_{accelerator.process_index}.pkl"
    try:
        _restore_rng(load_tensors(rng_path), accelerator.device.type)
    except Exception as error:  # noqa: BLE001 - a part of the RNG state that does not restore ends the resume
        raise _unusable(checkpoint, _rng_problem(rng_path, error)) from None
    return state


def _unusable(checkpoint: Path, problem: str) -> ValueError:
    earlier = next((path for path in list_checkpoints(checkpoint.parent.parent) if path < checkpoint), None)
    then = f"resume from an earlier one (--resume {earlier})" if earlier else "start again with --overwrite"
    return ValueError(f"--resume: checkpoint {checkpoint} cannot be used: {problem}; {then}")


def _check_tensors_only(path: Path) -> None:
    try:
        load_tensors(path, mmap=True)
    except RuntimeError as error:  # mmap needs the zip format; a file of torch's legacy format is read whole
        if "mmap" not in str(error):
            raise
        load_tensors(path)
