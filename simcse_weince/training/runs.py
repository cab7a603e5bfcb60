"""A run's folder, shared by the text and vision trainers: the output directory, atomic checkpoints, resume.

Layout of ``<output_dir>``::

    training_config.yaml            the resolved config; marks the folder as one of our runs
    run_files.json                  the run's manifest: its id and every top-level entry it wrote (its own files,
                                    ``run``, and the exported model, ``export``), recorded before each is written
    .simcse-weince.lock             held (flock) by the one process writing the folder
    checkpoints/step-0000062/       Accelerate state (model, optimizer, scheduler, RNG) + trainer_state.json
                                    + manifest.json (size and sha256 of every file), written to step-….tmp and
                                    renamed, so a kill mid-save leaves no half checkpoint
    logs/metrics.csv                the per-step log (see :mod:`simcse_weince.training.tracking`)

``trainer_state.json`` has one schema for every trainer: ``step`` (optimizer updates done), ``history`` (one
dict per step), ``train_seconds``, ``wall_seconds``, plus what a trainer adds (the text trainer's best dev
step, the vision trainer's epoch) and ``run_id``, drawn at step 0: a checkpoint knows its run. ``--overwrite``
moves the entries the earlier run's manifest lists aside until the new run has saved its first checkpoint, and
nothing else: a file the user put in the folder, or an input of the new run, stays where it is. ``--resume``
verifies the checkpoint and that it belongs to the run of its output folder before loading it.

Trust: a run folder may come from someone else, so nothing in it is unpickled. Every pickle-format file
(``.bin``/``.pkl``/``.pt``) is read with ``torch.load(weights_only=True)`` (tensors, numbers, numpy arrays) before
Accelerate loads it, and a file holding any other Python object is refused (:mod:`simcse_weince.safe_load`). A save that
fails (full disk, read-only, quota) ends in a :class:`WriteError` naming the folder and the cause, and leaves no
partial ``.tmp`` behind.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

import torch

from simcse_weince.safe_load import RefusedPickle, is_refused, load_tensors, refusal, refused_global
from simcse_weince.settings import CONFIG_FILE, save_config

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"  # sizes and sha256 of a checkpoint's files, checked on --resume
PREVIOUS_RUN_SUFFIX = ".previous-run"  # .<output_dir>.previous-run: the run --overwrite replaces, until replaced
PICKLE_SUFFIXES = (".bin", ".pkl", ".pt")  # torch.save files: read only with weights_only=True
RNG_STATE_GLOB = "random_states_*.pkl"  # Accelerate's per-process RNG states
RUN_MANIFEST = "run_files.json"  # the run's id and the top-level entries it wrote
LOCK_FILE = ".simcse-weince.lock"  # one writer per output folder
#: what every run writes at the top of its folder (recorded in its manifest at the claim)
RUN_ENTRIES = (CONFIG_FILE, CHECKPOINTS, "logs", "results.json")
#: the names a text run's export writes (a SentenceTransformer folder and its card): a folder without a manifest
#: (an earlier release's run) is taken to own these and RUN_ENTRIES; a user's file of such a name is in the way
EXPORT_PATTERNS = (
    "README.md", "modules.json", "config*.json", "sentence_bert_config.json", "model.safetensors", "*.bin",
    "tokenizer*", "vocab.txt", "merges.txt", "sentencepiece*.model", "spiece.model", "special_tokens_map.json",
    "added_tokens.json", "[0-9]_*", ".export.tmp", ".export-staging",
)  # fmt: skip


class WriteError(RuntimeError):
    """A checkpoint or the export could not be written (no space, read-only, quota); the message names the
    folder and the cause, and the partial copy is already removed."""


def _unreadable(path: Path, error: Exception) -> str:
    """The problem of a file that failed to load, naming it; a refused pickle says so."""
    if is_refused(error):
        return error.args[0] if isinstance(error, RefusedPickle) else refusal(path, refused_global(error))
    text = str(error)
    return f"{path} cannot be read ({type(error).__name__}: {text.splitlines()[0][:200] if text else ''})"


def new_trainer_state(**extra) -> dict:
    """The trainer state of a run at step 0 (the schema every trainer saves in ``trainer_state.json``); its
    ``run_id`` ties every checkpoint to the run (and output folder) that saved it."""
    # model_flops: the steps' model FLOPs so far (training/flops.py); a checkpoint of an earlier release lacks it
    return {"step": 0, "history": [], "train_seconds": 0.0, "wall_seconds": 0.0, "model_flops": 0,
            "run_id": uuid.uuid4().hex, **extra}  # fmt: skip


def previous_run_dir(output_dir: Path) -> Path:
    """Where ``--overwrite`` keeps the earlier run's entries until the new one has saved its first checkpoint (a
    sibling, so each move is a rename on the same file system)."""
    return output_dir.with_name(f".{output_dir.name}{PREVIOUS_RUN_SUFFIX}")


# ------------------------------------------------------------------------------------- the run's manifest


def _entries(output_dir: Path) -> list[str]:
    """The names at the top of a folder, but for the lock (which belongs to whoever writes it now)."""
    if not output_dir.is_dir():
        return []
    return sorted(entry.name for entry in output_dir.iterdir() if entry.name != LOCK_FILE)


def read_run_manifest(output_dir: Path) -> dict | None:
    """The folder's ``run_files.json`` (``run_id``, ``files``: name -> "run" | "export"), or None without one."""
    path = Path(output_dir) / RUN_MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(manifest.get("files"), dict):
            raise ValueError("no files")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"the run manifest {path} is unreadable ({error}); restore it or start a new run") from None
    return manifest


def _write_run_manifest(output_dir: Path, manifest: dict) -> None:
    staging = output_dir / f".{RUN_MANIFEST}.tmp"
    staging.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(staging, output_dir / RUN_MANIFEST)


def record_run_files(output_dir: Path, names, *, kind: str = "run") -> None:
    """Add top-level entries to the run's manifest before they are written (main process): ``kind`` "run" (the
    run's own files) or "export" (the model ``push`` uploads). ``--overwrite`` moves only these aside."""
    manifest = read_run_manifest(output_dir) or {"format": 1, "run_id": None, "files": {}}
    added = {name: kind for name in names if manifest["files"].get(name) != kind}
    if added:
        manifest["files"].update(added)
        _write_run_manifest(output_dir, manifest)


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def run_files(output_dir: Path) -> dict[str, str]:
    """The top-level entries the folder's run wrote (name -> "run" | "export"). A run of an earlier release (no
    manifest) is taken to own the names every run writes (RUN_ENTRIES, EXPORT_PATTERNS)."""
    manifest = read_run_manifest(output_dir)
    if manifest is not None:
        return {**manifest["files"], RUN_MANIFEST: "run"}
    if not (output_dir / CONFIG_FILE).is_file():
        return {}
    return {
        name: "run" if name in RUN_ENTRIES else "export"
        for name in _entries(output_dir)
        if name in RUN_ENTRIES or _matches(name, EXPORT_PATTERNS)
    }


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _input_entries(output_dir: Path, inputs) -> dict[str, Path]:
    """Top-level entries of ``output_dir`` that hold an input of the new run (name -> the input)."""
    root = output_dir.resolve()
    held = {}
    for given in inputs:
        path = Path(given).expanduser().resolve()
        if _inside(path, root) and path != root:
            held[path.relative_to(root).parts[0]] = Path(given)
    return held


# ------------------------------------------------------------------------------------------- one writer


class OutputLock:
    """One writer per output folder: ``.simcse-weince.lock`` inside it, held with ``flock`` by the process that
    writes the folder, and naming it (pid, host, start time, command). The kernel releases a ``flock`` when its
    process ends however it ends, so a lock file left by a dead process is not a lock: the next run takes it over
    and says whose it was. Where the file system has no ``flock``, the file itself is the lock and a file naming a
    process of this host that no longer runs is taken over the same way."""

    def __init__(self, output_dir: Path):
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self._handle = None
        self._created: list[Path] = []  # the folders acquire() made (removed again when the run leaves nothing)

    def acquire(self) -> OutputLock:
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise FileExistsError(f"output directory {self.output_dir} is a file; choose another --output-dir")
        missing = self.output_dir
        while not missing.exists() and missing != missing.parent:
            self._created.append(missing)
            missing = missing.parent
        self.output_dir.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # no flock on this platform: the file itself is the lock
            fcntl = None
        while True:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while the run writes
            try:
                if fcntl is not None:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                elif self._held_by_a_live_process(handle):
                    raise BlockingIOError
            except BlockingIOError:
                holder = self._holder(handle)
                handle.close()
                self._remove_created()
                raise FileExistsError(
                    f"output directory {self.output_dir} is in use by another run ({holder}; lock {self.path}): "
                    f"wait for it to end or choose another --output-dir"
                ) from None
            except OSError as error:  # the file system has no flock (some network mounts): the file is the lock
                handle.close()
                logger.warning("cannot flock %s (%s): the lock file alone guards the folder", self.path, error)
                fcntl = None
                continue
            if not self.path.exists() or os.stat(self.path).st_ino != os.fstat(handle.fileno()).st_ino:
                handle.close()  # the holder removed the file as we locked it: lock the one there now
                continue
            break
        stale = self._holder(handle, default=None)
        if stale is not None:
            logger.warning("took over the lock of %s left in %s: that process has ended", stale, self.output_dir)
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        command = " ".join(sys.argv)[:300]
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started,
                                 "command": command}))  # fmt: skip
        handle.flush()
        self._handle = handle
        return self

    @staticmethod
    def _holder(handle, default: str | None = "a process that did not say who it is") -> str | None:
        handle.seek(0)
        try:
            holder = json.loads(handle.read() or "null")
            return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}: {holder['command']}"
        except (ValueError, KeyError, TypeError):
            return default

    @staticmethod
    def _held_by_a_live_process(handle) -> bool:
        handle.seek(0)
        try:
            holder = json.loads(handle.read() or "null")
            pid, host = int(holder["pid"]), holder["host"]
        except (ValueError, KeyError, TypeError):
            return False
        if host != socket.gethostname():
            return True  # another host's process cannot be checked from here: only its owner can remove the file
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def release(self, *, remove_empty: bool = False) -> None:
        """Unlock (the file goes first, so no one locks a file about to vanish). ``remove_empty``: a start that
        wrote nothing also removes the folders it made."""
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        self._handle.close()
        self._handle = None
        if remove_empty:
            self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:  # the output folder first, then the parents it needed
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


# -------------------------------------------------------------------------------------------- the folder


def _check_checkpoint_belongs(checkpoint: Path, output_dir: Path) -> None:
    """``--resume``: a checkpoint continues the run that saved it, in its own output folder; refuse, naming
    both runs, a checkpoint of another folder or of another run (an id drawn at step 0, in every checkpoint and in
    the folder's manifest)."""
    state_path = checkpoint / TRAINER_STATE
    try:
        checkpoint_run = json.loads(state_path.read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        checkpoint_run = None  # damaged: verify_checkpoint names the file
    manifest = read_run_manifest(output_dir) or {}
    folder_run = manifest.get("run_id")
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
            f"{folder_run} ({output_dir / RUN_MANIFEST}): it was copied in from another run; {own}"
        )


def prepare_output_dir(output_dir: Path, resume, overwrite: bool, is_main: bool, inputs=()) -> Path | None:
    """Check the output directory; return the (verified) checkpoint to resume from (None for a fresh start).

    Touches nothing: the folder is claimed by :func:`claim_output_dir` once every input has loaded. Even with
    ``overwrite`` only a folder holding one of our runs (marked by its training_config.yaml) or an empty folder
    may be replaced, and only the entries its run wrote are: a file of the user's at a name the new run writes
    is in the way, and refused by name. ``inputs``: the files the new run reads after the claim.
    """
    has_run = (output_dir / CONFIG_FILE).is_file()
    non_empty = bool(_entries(output_dir))
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output directory {output_dir} is a file; choose another --output-dir")
    previous = previous_run_dir(output_dir)
    if previous.exists():
        raise FileExistsError(
            f"{previous} holds the earlier run of {output_dir}, kept aside by an --overwrite start that stopped "
            f"before its first checkpoint; restore it (move what it holds back into {output_dir}, then rmdir "
            f"{previous}) or delete it, then start again"
        )
    if resume:
        if not has_run:
            raise FileNotFoundError(f"--resume: {output_dir} holds no simcse-weince run ({CONFIG_FILE} is missing)")
        if resume is True or resume == "latest":
            checkpoint = newest_intact_checkpoint(output_dir)
            if checkpoint is None and is_main:
                logger.warning("--resume: no checkpoint in %s yet; starting from step 0", output_dir / CHECKPOINTS)
            if checkpoint is not None:
                _check_checkpoint_belongs(checkpoint, output_dir)
            return checkpoint
        checkpoint = Path(resume).expanduser()
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"--resume: checkpoint folder {checkpoint} not found")
        _check_checkpoint_belongs(checkpoint, output_dir)
        problems = verify_checkpoint(checkpoint)
        if problems:
            intact = next((path for path in list_checkpoints(output_dir) if not verify_checkpoint(path)), None)
            hint = (
                f"the newest intact checkpoint is {intact}: resume from it with --resume {intact}"
                if intact is not None
                else f"no intact checkpoint is left in {output_dir / CHECKPOINTS}: start again with --overwrite"
            )
            raise ValueError(f"--resume: checkpoint {checkpoint} is damaged: {problems[0]}; {hint}")
        return checkpoint
    if non_empty and not overwrite:
        what = "a simcse-weince run" if has_run else "files"
        raise FileExistsError(
            f"output directory {output_dir} already holds {what}; pass --resume to continue it, --overwrite to "
            f"replace it, or choose another --output-dir"
        )
    if non_empty and not has_run:
        raise FileExistsError(
            f"output directory {output_dir} holds files that are not a simcse-weince run; refusing to delete them "
            f"even with --overwrite: choose another --output-dir"
        )
    if non_empty:
        owned = run_files(output_dir)
        held = _input_entries(output_dir, inputs)
        in_the_way = [
            name
            for name in _entries(output_dir)
            if (name not in owned or name in held) and (name in RUN_ENTRIES or _matches(name, EXPORT_PATTERNS))
        ]
        if in_the_way:
            raise FileExistsError(
                f"--overwrite: {', '.join(str(output_dir / name) for name in in_the_way)} "
                f"{'was' if len(in_the_way) == 1 else 'were'} not written by the run in {output_dir} (or "
                f"{'is an input' if len(in_the_way) == 1 else 'are inputs'} of the new run) and the new run would "
                f"write there; move {'it' if len(in_the_way) == 1 else 'them'} elsewhere or choose another --output-dir"
            )
    return None


def claim_output_dir(output_dir: Path, resume, inputs=(), run_id: str | None = None) -> Path | None:
    """Make the output folder the new run's (main process, once every input has loaded and the resume
    checkpoint is in memory) and write its manifest. With an earlier run there (``--overwrite``), the entries
    its manifest lists are moved aside, not deleted, into :func:`previous_run_dir`, which is returned; it is
    deleted by the first :func:`save_checkpoint` or at the end of training, and a start that fails before then
    puts the entries back (:func:`restore_previous_run`). Entries that no run wrote, and those holding an input of
    the new run (``inputs``), stay where they are, named in a warning."""
    previous = None
    output_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        manifest = read_run_manifest(output_dir)
        if manifest is None:  # a run of an earlier release: what it wrote is what every run writes
            manifest = {"format": 1, "run_id": run_id, "files": run_files(output_dir)}
        manifest["run_id"] = manifest.get("run_id") or run_id
        manifest["files"].update({name: "run" for name in RUN_ENTRIES if name not in manifest["files"]})
        _write_run_manifest(output_dir, manifest)
        return None
    if _entries(output_dir):
        owned, held = run_files(output_dir), _input_entries(output_dir, inputs)
        previous = previous_run_dir(output_dir)
        previous.mkdir()
        for name in _entries(output_dir):
            if name in owned and name not in held:
                os.replace(output_dir / name, previous / name)
        left = {name: held.get(name) for name in _entries(output_dir)}
        if left:
            logger.warning(
                "--overwrite replaced the earlier run in %s and left what it did not write: %s",
                output_dir,
                ", ".join(f"{name} (holds the input {held[name]})" if held.get(name) else name for name in left),
            )
    _write_run_manifest(output_dir, {"format": 1, "run_id": run_id, "files": dict.fromkeys(RUN_ENTRIES, "run")})
    return previous


def release_previous_run(output_dir: Path) -> None:
    """The new run has started (a checkpoint or the export exists): the run it replaced can go."""
    shutil.rmtree(previous_run_dir(output_dir), ignore_errors=True)


def _remove_run_entries(output_dir: Path) -> None:
    """Remove what the folder's run wrote (its manifest's entries), nothing else."""
    for name in run_files(output_dir):
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def restore_previous_run(output_dir: Path) -> bool:
    """Put back the run that a failed ``--overwrite`` start moved aside; True when there was one."""
    previous = previous_run_dir(output_dir)
    if not previous.is_dir():
        return False
    _remove_run_entries(output_dir)
    for entry in sorted(previous.iterdir()):
        os.replace(entry, output_dir / entry.name)
    previous.rmdir()
    return True


def list_checkpoints(output_dir: Path) -> list[Path]:
    """The step checkpoints of a run, newest first (finished ones only: a save in progress ends in .tmp)."""
    return sorted((output_dir / CHECKPOINTS).glob("step-*[0-9]"), reverse=True)


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = [path for path in list_checkpoints(output_dir) if (path / TRAINER_STATE).is_file()]
    return checkpoints[0] if checkpoints else None


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


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and sha256 of every file of a checkpoint, so a damaged file is found on resume."""
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1), encoding="utf-8")


def verify_checkpoint(checkpoint: Path) -> list[str]:
    """What is wrong with a checkpoint's files (empty when intact), each problem naming the file.

    With a manifest: every listed file must be there with its size and sha256. A checkpoint written before
    manifests existed is checked by loading each file instead (and a warning says it cannot be verified)."""
    manifest_path = checkpoint / MANIFEST
    if not manifest_path.is_file():
        return _probe_checkpoint_files(checkpoint)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as error:
        return [f"its manifest {manifest_path} is unreadable ({error})"]
    problems = []
    if TRAINER_STATE not in files:
        problems.append(f"{manifest_path} lists no trainer_state.json")
    for name, entry in files.items():
        path = checkpoint / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(
                f"{path} has {path.stat().st_size} bytes where {entry['size']} were saved (truncated or replaced)"
            )
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{path} does not match the sha256 saved in {MANIFEST} (corrupted)")
    # a manifest rewritten to match a damaged file hides nothing from this: the RNG state must restore
    return problems or _rng_state_problems(checkpoint)


def _probe_checkpoint_files(checkpoint: Path) -> list[str]:
    """Load every file of a checkpoint without a manifest (older versions), naming the one that fails."""
    state_path = checkpoint / TRAINER_STATE
    if not state_path.is_file():
        return [f"{state_path} is missing"]
    logger.warning(
        "checkpoint %s has no %s (saved by an older simcse-weince): its files are checked by loading them",
        checkpoint,
        MANIFEST,
    )
    problems = []
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.name == TRAINER_STATE:
                if not isinstance(json.loads(path.read_text(encoding="utf-8")).get("step"), int):
                    raise ValueError("no step")
            elif path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        handle.get_tensor(key)
            elif path.suffix in PICKLE_SUFFIXES:
                load_tensors(path)  # never unpickled: the folder may come from elsewhere
        except Exception as error:  # noqa: BLE001 - any failure to load means the file is damaged
            problems.append(_unreadable(path, error))
    return problems or _rng_state_problems(checkpoint)


def _rng_state_problems(checkpoint: Path) -> list[str]:
    """Each RNG state file of a checkpoint must restore every generator it holds: Accelerate only logs "Could not
    load random states" (at INFO) and the resumed run would then draw other dropout masks and augmentations.
    Checked on fresh generators, so the global ones are untouched."""
    paths = sorted(checkpoint.glob(RNG_STATE_GLOB))
    if not paths:
        return [f"{checkpoint / 'random_states_0.pkl'} is missing (the RNG state)"]
    problems = []
    for path in paths:
        try:
            states = load_tensors(path)
            _restore_rng(states, generators=None)
        except Exception as error:  # noqa: BLE001 - any failure means this part of the state cannot be restored
            problems.append(_rng_problem(path, error))
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


def _restore_rng(states: dict, generators: str | None) -> None:
    """Set Python's, numpy's and torch's CPU generators (and those of ``generators``, a device type such as "cuda")
    from an Accelerate RNG state; with ``generators=None`` fresh generators are set instead, as a check."""
    import random

    import numpy as np

    if generators is None:
        random.Random().setstate(states["random_state"])
        np.random.RandomState().set_state(states["numpy_random_seed"])
        torch.Generator().set_state(states["torch_manual_seed"])
        for device_state in states.get("torch_cuda_manual_seed", []):
            if not (isinstance(device_state, torch.Tensor) and device_state.dtype == torch.uint8):
                raise TypeError("torch_cuda_manual_seed holds a value that is not a generator state")
        return
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if generators not in ("cpu", "mps"):  # Accelerate keeps the accelerator's under torch_<type>_manual_seed
        getattr(torch, generators).set_rng_state_all(states[f"torch_{generators}_manual_seed"])


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
        return _probe_write(folder) or f"a write failed ({first_line})"
    return None


def _probe_write(folder: Path) -> str | None:
    """Write 1 MiB beside the failed file (before the partial copy is removed) to learn the errno torch dropped."""
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    probe = folder / ".write-probe"
    try:
        with probe.open("wb") as handle:
            handle.write(bytes(1 << 20))
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error.strerror or str(error)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


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
    """Model, optimizer, scheduler and RNG states (Accelerate) plus our trainer state (step, data position,
    best score, history) and a manifest of their sizes and checksums, written to a temporary folder and renamed:
    a kill mid-save leaves no half checkpoint, and a file damaged later is found on resume. A failed write
    (full disk) removes the temporary folder and raises :class:`WriteError`; the earlier checkpoints stay.
    ``limit``: keep that many checkpoints (0: delete none)."""
    final = output_dir / CHECKPOINTS / f"step-{state['step']:07d}"
    staging = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:  # a save killed midway leaves its .tmp: it may be what fills the disk
        for stale in (output_dir / CHECKPOINTS).glob("step-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
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
            (staging / TRAINER_STATE).write_text(json.dumps(state), encoding="utf-8")
            write_manifest(staging)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(staging, final)
    if accelerator.is_main_process:
        release_previous_run(output_dir)  # the new run now has a checkpoint: the run it replaced can go
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
                problem = _unreadable(path, error)
                raise ValueError(f"--resume: checkpoint {checkpoint} cannot be used: {problem}") from None
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as error:
        raise RuntimeError(
            f"--resume: cannot load checkpoint {checkpoint} ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:300]}); resume with the settings it was saved with"
        ) from error
    rng_path = checkpoint / f"random_states_{accelerator.process_index}.pkl"
    try:
        _restore_rng(load_tensors(rng_path), generators=accelerator.device.type)
    except Exception as error:  # noqa: BLE001 - a part of the RNG state that does not restore ends the resume
        raise ValueError(
            f"--resume: checkpoint {checkpoint} cannot be resumed exactly: {_rng_problem(rng_path, error)}; "
            f"resume from an earlier one (--resume {checkpoint.parent}/step-NNNNNNN) or start again with --overwrite"
        ) from None
    return state


def _check_tensors_only(path: Path) -> None:
    try:
        load_tensors(path, mmap=True)
    except RuntimeError as error:  # mmap needs the zip format; a file of torch's legacy format is read whole
        if "mmap" not in str(error):
            raise
        load_tensors(path)


class RunFolder:
    """One run's output folder, as every trainer uses it (the functions above, in their order).

    ``RunFolder(output_dir, resume, overwrite, accelerator, inputs)`` takes the folder's lock (:class:`OutputLock`:
    a second process on the same folder is refused, naming the first), checks the folder and picks the checkpoint
    to resume from (``.checkpoint``; None for a fresh start), and writes nothing else. Inside ``with
    run.restore_on_failure():`` the trainer loads its inputs, then calls :meth:`claim` (the entries of an earlier
    run replaced with ``--overwrite`` are moved aside, the manifest and the config are written); if the new run
    fails before its first checkpoint or export, the earlier run is put back. :meth:`save_checkpoint` writes
    atomic checkpoints; :meth:`finish` drops the earlier run; leaving the block releases the lock.
    ``inputs``: the files the run reads after the claim (its training file, data folder), which ``--overwrite``
    never moves.
    """

    def __init__(self, output_dir, resume, overwrite: bool, accelerator, inputs=()):
        self.output_dir = Path(output_dir).expanduser()
        self.resume, self.accelerator, self.inputs = resume, accelerator, tuple(inputs)
        self._lock = None
        self._found = None  # a fresh start's folder as found: None (not claimed), "absent" or "empty"
        if accelerator.is_main_process:
            found = "absent" if not self.output_dir.exists() else "empty" if not _entries(self.output_dir) else None
            self._lock = OutputLock(self.output_dir).acquire()  # before anything else is written
            try:
                self.checkpoint = prepare_output_dir(self.output_dir, resume, overwrite, True, self.inputs)
            except BaseException:
                self._lock.release(remove_empty=True)
                raise
            self._found = None if resume else found
        else:
            self.checkpoint = prepare_output_dir(self.output_dir, resume, overwrite, False, self.inputs)
        accelerator.wait_for_everyone()
        self._claimed = False  # an earlier run was moved aside (--overwrite)
        self._has_claimed = False  # the manifest and config were written
        self._started = False  # a checkpoint or the export has been written

    @property
    def checkpoints(self) -> Path:
        return self.output_dir / CHECKPOINTS

    def claim(self, config, run_id: str | None = None) -> None:
        """Every input has loaded: make the folder this run's (``run_id``: the trainer state's) and write its
        manifest and config (main process)."""

        if self.accelerator.is_main_process:
            self._claimed = claim_output_dir(self.output_dir, self.resume, self.inputs, run_id) is not None
            self._has_claimed = True
            save_config(config, self.output_dir / CONFIG_FILE)
        self.accelerator.wait_for_everyone()

    def save_checkpoint(self, state: dict, limit: int) -> Path:
        saved = save_checkpoint(self.accelerator, self.output_dir, state, limit)
        self._started = True
        return saved

    def finish(self, drop: Path | None = None) -> None:
        """The run has exported its result: the run it replaced can go, and so can the checkpoint ``drop`` (the
        text trainer's last step, kept only until the export is written)."""
        self._started = True
        if self.accelerator.is_main_process:
            release_previous_run(self.output_dir)
            if drop is not None and drop.resolve().parent == self.checkpoints.resolve():  # never another run's
                shutil.rmtree(drop, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    @contextlib.contextmanager
    def restore_on_failure(self):
        left_nothing = False
        try:
            yield self
        except BaseException:
            if self._claimed and restore_previous_run(self.output_dir):
                logger.warning(
                    "the new run stopped before its first checkpoint: the earlier run in %s is back", self.output_dir
                )
            elif self._found is not None and not self._started:
                # nothing of the run is worth keeping: leave the folder as it was found, so that the same command
                # can run again (a half-made run would be refused as "already holds a simcse-weince run")
                self._undo_fresh_start()
                left_nothing = True
            raise
        finally:
            if self._lock is not None:
                self._lock.release(remove_empty=left_nothing)

    def _undo_fresh_start(self) -> None:
        if self._has_claimed:
            _remove_run_entries(self.output_dir)  # only what the run wrote: a file put there meanwhile stays
        logger.info("the run stopped before its first checkpoint; %s is left as it was found", self.output_dir)
