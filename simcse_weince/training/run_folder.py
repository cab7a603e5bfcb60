"""A run's output folder, shared by the text and vision trainers: its lock, identity and manifest, --overwrite.

The layout and what is checked are in docs/training.md ("The run folder", "What is checked"). In short: one process
writes a folder (:class:`OutputLock`); the run id is drawn once, at a fresh start, and recorded in ``run_files.json``,
at the head of ``training_config.yaml`` and in every checkpoint; every start, under the lock, first settles what a
stopped ``--overwrite`` start left (:func:`settle_previous_run`), then refuses a link where the run writes, then checks
the folder, and a refusal writes nothing; ``--overwrite`` moves the earlier run's entries into a folder inside the
output folder (a rename never crosses file systems) and a move that fails puts back those already moved.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import socket
import stat
import sys
import time
from pathlib import Path

from simcse_weince.records import loads_json
from simcse_weince.settings import CONFIG_FILE
from simcse_weince.training import checkpoints, folder_io

logger = logging.getLogger(__name__)

CHECKPOINTS = checkpoints.CHECKPOINTS
RUN_MANIFEST = "run_files.json"  # the run's id and the top-level entries it wrote
LOCK_FILE = ".simcse-weince.lock"  # one writer per output folder
PREVIOUS_RUN = ".simcse-weince.previous-run"  # the run --overwrite replaces, until the new one has a checkpoint
DROPPED_RUN = ".simcse-weince.dropped-run"  # the replaced run on its way out (renamed first, then removed)
MOVED = "moved.json"  # in PREVIOUS_RUN: the names moved there and the id of the run that moved them
#: what every run writes at the top of its folder (recorded in its manifest at the claim)
RUN_ENTRIES = (CONFIG_FILE, CHECKPOINTS, "logs", "results.json")
#: what a run may have written before its first checkpoint (removed when the run it replaced is put back)
START_ENTRIES = (RUN_MANIFEST, *RUN_ENTRIES, ".export.tmp")
#: the paths a run writes at fixed names: none may be a link
WRITTEN = (*START_ENTRIES, "logs/metrics.csv", "logs/simcse-weince", "logs/simcse-weince-vision", "checkpoints/best",
           "README.md", PREVIOUS_RUN, DROPPED_RUN)  # fmt: skip
#: the names a text run's export writes (a SentenceTransformer folder and its card): a folder without a manifest
#: (an earlier release's run) is taken to own these and RUN_ENTRIES; a user's file of such a name is in the way
EXPORT_PATTERNS = (
    "README.md", "modules.json", "config*.json", "sentence_bert_config.json", "model.safetensors", "*.bin",
    "tokenizer*", "vocab.txt", "merges.txt", "sentencepiece*.model", "spiece.model", "special_tokens_map.json",
    "added_tokens.json", "[0-9]_*", ".export.tmp", ".export-staging",
)  # fmt: skip
_RUN_ID_LINE = re.compile(r"# run_id: ([0-9a-f]+)")


def _entries(output_dir: Path) -> list[str]:
    names = os.listdir(output_dir) if output_dir.is_dir() else []
    skipped = (LOCK_FILE, PREVIOUS_RUN, DROPPED_RUN)  # and a write stopped before its rename (folder_io.write_bytes)
    return sorted(name for name in names if name not in skipped and not fnmatch.fnmatch(name, ".*.[0-9]*.tmp"))


def read_run_manifest(output_dir: Path, *, overwrite: bool = False) -> dict | None:
    """The folder's ``run_files.json`` (``run_id``, ``files``: name -> "run" | "export"), or None without one."""
    path = Path(output_dir) / RUN_MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = loads_json(path.read_text(encoding="utf-8"), path)
        if not isinstance(manifest.get("files"), dict):
            raise ValueError("no files")
    except (OSError, ValueError, AttributeError) as error:
        then = "restore it, or start a new run (another --output-dir)"
        if overwrite:
            then = f"delete it (rm {path}) to let --overwrite treat the folder as an earlier release's run (the "
            then += "entries every run writes are then replaced), or choose another --output-dir"
        raise ValueError(f"the run manifest {path} is unreadable ({error}); {then}") from None
    return manifest


def record_run_files(output_dir: Path, names, *, kind: str = "run") -> None:
    """Record top-level entries in the manifest before they are written: ``kind`` "run" or "export" (pushed)."""
    output_dir = folder_io.run_folder_path(output_dir)
    manifest = read_run_manifest(output_dir) or {"format": 1, "run_id": None, "files": {}}
    added = {name: kind for name in names if manifest["files"].get(name) != kind}
    if added:
        manifest["files"].update(added)
        folder_io.write_text(output_dir, output_dir / RUN_MANIFEST, json.dumps(manifest, indent=1))


def run_files(output_dir: Path, *, overwrite: bool = False) -> dict[str, str]:
    """The top-level entries the folder's run wrote (name -> "run" | "export"). A run of an earlier release (no
    manifest) is taken to own the names every run writes (RUN_ENTRIES, EXPORT_PATTERNS)."""
    manifest = read_run_manifest(output_dir, overwrite=overwrite)
    if manifest is not None:
        return {**manifest["files"], RUN_MANIFEST: "run"}
    if not (output_dir / CONFIG_FILE).is_file():
        return {}
    return {name: "run" if name in RUN_ENTRIES else "export" for name in _entries(output_dir) if _owned_name(name)}


def _owned_name(name: str) -> bool:
    return name in RUN_ENTRIES or any(fnmatch.fnmatchcase(name, pattern) for pattern in EXPORT_PATTERNS)


def folder_run_id(output_dir: Path) -> str | None:
    """The run id the folder records: its manifest's, else the one heading ``training_config.yaml``."""
    manifest = read_run_manifest(output_dir) or {}
    with contextlib.suppress(OSError, UnicodeDecodeError, AttributeError):  # AttributeError: no id in the file
        return manifest.get("run_id") or _RUN_ID_LINE.match((output_dir / CONFIG_FILE).read_text("utf-8")).group(1)
    return None


def save_run_config(output_dir: Path, config, run_id: str) -> None:
    """``training_config.yaml``: the resolved config, headed by the run id (a comment: loading ignores it)."""
    import yaml

    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    folder_io.write_text(output_dir, output_dir / CONFIG_FILE, f"# run_id: {run_id}\n{text}")


_LOCKS_HELD: set[int] = set()  # descriptors of the locks this process holds


def _close_locks_in_child() -> None:  # a loader worker must not hold the lock once its parent is killed
    for descriptor in list(_LOCKS_HELD):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _LOCKS_HELD.clear()


os.register_at_fork(after_in_child=_close_locks_in_child)


class OutputLock:
    """One writer per output folder: ``.simcse-weince.lock``, held with ``flock`` and naming its process. This host's
    lock file with no flock on it is taken over (its process has ended); another host's is refused."""

    def __init__(self, output_dir: Path):
        self.output_dir = folder_io.run_folder_path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self._descriptor: int | None = None
        self._previous: bytes | None = None  # the lock file's content when found (None: this lock created it)
        self._created: list[Path] = []  # the folders acquire() made (removed again by a refusal)

    def acquire(self) -> OutputLock:
        if self.output_dir.exists() and not self.output_dir.is_dir():
            raise FileExistsError(f"output directory {self.output_dir} is a file; choose another --output-dir")
        missing = self.output_dir
        while not missing.exists() and missing != missing.parent:
            self._created.append(missing)
            missing = missing.parent
        self.output_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock()
        except BaseException:
            self._remove_created()
            raise
        return self

    def _lock(self) -> None:
        import fcntl

        while True:
            if os.path.islink(self.path):
                raise folder_io.LinkInRunFolder(
                    f"the lock {self.path} is a link (to {os.readlink(self.path)}); simcse-weince never writes "
                    f"through a link in a run folder: remove the link (rm {self.path}) and start again"
                )
            flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                descriptor, self._previous = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644), None
            except FileExistsError:
                descriptor, self._previous = os.open(self.path, flags), b""
            mode = os.fstat(descriptor).st_mode
            if not stat.S_ISREG(mode):
                os.close(descriptor)
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a file"
                raise FileExistsError(f"the lock {self.path} is {kind}, not a regular file: remove it (rm {self.path}) "
                                      f"and start again")  # fmt: skip
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                holder = _holder(os.pread(descriptor, 1 << 16, 0))[1] or "a process that did not say who it is"
                os.close(descriptor)
                cause = f"is in use by another run ({holder}; lock {self.path}): wait for it to end or choose another"
                if not isinstance(error, BlockingIOError):  # a file system without flock cannot tell
                    cause = f"cannot be locked ({error.strerror or error}): choose one on a local file system as"
                raise FileExistsError(f"output directory {self.output_dir} {cause} --output-dir") from None
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(descriptor).st_ino:
                break
            os.close(descriptor)  # the holder removed the file as we locked it: lock the one there now
        if self._previous is not None:
            self._previous = os.pread(descriptor, 1 << 16, 0)
        found, holder = _holder(self._previous)
        if found and found.get("host") != socket.gethostname():
            os.close(descriptor)
            raise FileExistsError(
                f"output directory {self.output_dir} holds the lock of {holder} (lock {self.path}): a run on another "
                f"host cannot be checked from here; if that run has ended, delete the lock (rm {self.path}) and "
                f"start again, or choose another --output-dir"
            )
        if holder is not None:
            logger.warning("took over the lock of %s left in %s: that process has ended", holder, self.output_dir)
        started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started,
                  "command": " ".join(sys.argv)[:300]}  # fmt: skip
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(record).encode(), 0)
        self._descriptor = descriptor
        _LOCKS_HELD.add(descriptor)

    def release(self, *, refused: bool = False) -> None:
        """Unlock (the file goes first). ``refused``: a lock file found is left as it was, made folders go."""
        if self._descriptor is None:
            return
        if refused and self._previous is not None:
            os.ftruncate(self._descriptor, 0)
            os.pwrite(self._descriptor, self._previous, 0)
        else:
            with contextlib.suppress(OSError):
                self.path.unlink()
        _LOCKS_HELD.discard(self._descriptor)
        os.close(self._descriptor)
        self._descriptor = None
        if refused:
            self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:  # the output folder first, then the parents it needed
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


def _holder(content: bytes | None) -> tuple[dict | None, str | None]:
    try:
        found = json.loads(content or b"null")
        return found, f"pid {found['pid']} on {found['host']}, started {found['started']}: {found['command']}"
    except (ValueError, KeyError, TypeError):
        return None, None


def _move_aside(output_dir: Path, names: list[str], run_id: str) -> None:
    """Move the earlier run's entries aside (recorded first); a move that fails puts back those moved, refusing."""
    aside = output_dir / PREVIOUS_RUN
    folder_io.make_dir(output_dir, aside)
    folder_io.write_text(output_dir, aside / MOVED, json.dumps({"moved": names, "run_id": run_id}))
    moved = []
    for name in names:
        try:
            folder_io.move(output_dir, output_dir / name, aside / name)
        except OSError as error:
            for done in reversed(moved):
                folder_io.move(output_dir, aside / done, output_dir / done)
            folder_io.remove(output_dir, aside)
            raise FileExistsError(
                f"--overwrite: cannot move {output_dir / name} aside ({error.strerror or error}); nothing was "
                f"changed: make it movable (its permissions, chattr -i) and start again, or choose another "
                f"--output-dir"
            ) from None
        moved.append(name)


def settle_previous_run(output_dir: Path) -> None:
    """What a stopped ``--overwrite`` start left: the earlier run, moved aside, is put back unless the new run
    reached a checkpoint (then it is dropped). Idempotent, so a kill during this is settled by the next start."""
    if os.path.lexists(output_dir / DROPPED_RUN):
        folder_io.remove(output_dir, output_dir / DROPPED_RUN)
    aside = output_dir / PREVIOUS_RUN
    if not aside.is_dir():
        return
    try:
        record = json.loads((aside / MOVED).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # stopped before anything was moved
        return folder_io.remove(output_dir, aside)
    if record["run_id"] in map(checkpoints.checkpoint_run_id, checkpoints.list_checkpoints(output_dir)):
        return drop_previous_run(output_dir)  # the new run reached a checkpoint
    moved = record["moved"]
    for name in START_ENTRIES:
        if name not in moved and os.path.lexists(output_dir / name):
            folder_io.remove(output_dir, output_dir / name)  # the new run's own, written before it stopped
    for name in sorted(moved, key=lambda name: name == RUN_MANIFEST):  # the manifest last
        if os.path.lexists(aside / name):
            if os.path.lexists(output_dir / name):
                folder_io.remove(output_dir, output_dir / name)
            folder_io.move(output_dir, aside / name, output_dir / name)
    folder_io.remove(output_dir, aside)
    logger.warning("the run that an --overwrite start in %s replaced is back: that start stopped before its "
                   "first checkpoint", output_dir)  # fmt: skip


def config_of_record(output_dir) -> Path:
    """The ``training_config.yaml`` --resume continues: the one a stopped --overwrite start left aside, if any."""
    output_dir = folder_io.run_folder_path(output_dir)
    aside, path = output_dir / PREVIOUS_RUN, output_dir / CONFIG_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        run_id = json.loads((aside / MOVED).read_text(encoding="utf-8"))["run_id"]
        kept = run_id not in map(checkpoints.checkpoint_run_id, checkpoints.list_checkpoints(output_dir))
        return aside / CONFIG_FILE if kept and (aside / CONFIG_FILE).is_file() else path
    return path


def drop_previous_run(output_dir: Path) -> None:
    """The new run has a checkpoint or its export: the run it replaced goes (renamed first: a kill mid-removal
    leaves DROPPED_RUN, which the next start removes, never a half run to put back)."""
    if (output_dir / PREVIOUS_RUN).is_dir():
        folder_io.move(output_dir, output_dir / PREVIOUS_RUN, output_dir / DROPPED_RUN)
    if os.path.lexists(output_dir / DROPPED_RUN):
        folder_io.remove(output_dir, output_dir / DROPPED_RUN)


def _inputs_replaced(output_dir: Path, inputs, owned: dict) -> list[tuple[str, str]]:
    """(input, where) for each input of the new run that lies in what --overwrite would move or replace."""
    root, found = output_dir.resolve(), []
    for given in inputs:
        path = Path(given).expanduser().resolve()
        if path == root:
            found.append((str(given), f"the folder {output_dir} itself"))
        elif root in path.parents:
            top = path.relative_to(root).parts[0]
            if top in owned or _owned_name(top):
                found.append((str(given), str(output_dir / top)))
    return found


def prepare_output_dir(output_dir: Path, resume, overwrite: bool, is_main: bool, inputs=()) -> Path | None:
    """Check the folder (writing nothing); the verified checkpoint to resume from (None for a fresh start)."""
    has_run = (output_dir / CONFIG_FILE).is_file()
    non_empty = bool(_entries(output_dir))
    if resume:
        if not has_run:
            raise FileNotFoundError(f"--resume: {output_dir} holds no simcse-weince run ({CONFIG_FILE} is missing)")
        return checkpoints.checkpoint_to_resume(output_dir, resume, folder_run_id(output_dir), is_main)
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
        owned = run_files(output_dir, overwrite=True)
        for given, where in _inputs_replaced(output_dir, inputs, owned):
            raise FileExistsError(
                f"--overwrite: {given}, an input of the new run, lies in {where}, which --overwrite replaces; "
                f"train into another folder (--output-dir {output_dir}-2) or move the input out of {output_dir}"
            )
        in_the_way = [
            str(output_dir / name) for name in _entries(output_dir) if name not in owned and _owned_name(name)
        ]
        if in_the_way:
            raise FileExistsError(
                f"--overwrite: the run in {output_dir} did not write {', '.join(in_the_way)}, where the new run "
                f"writes; move {'it' if len(in_the_way) == 1 else 'them'} elsewhere or choose another --output-dir"
            )
    return None


class RunFolder:
    """One run's output folder: the constructor locks, settles, checks and picks ``.checkpoint`` (None: a fresh
    start) and ``.run_id`` (the folder's, on --resume); inside ``restore_on_failure()`` the trainer loads its
    inputs (files --overwrite may not replace), then :meth:`claim` writes the folder's manifest and config."""

    def __init__(self, output_dir, resume, overwrite: bool, accelerator, inputs=()):
        self.output_dir = folder_io.run_folder_path(output_dir)
        self.resume, self.accelerator, self.inputs = resume, accelerator, tuple(inputs)
        self._lock = None
        self._found = None  # a fresh start's folder as found: None (not claimed), "absent" or "empty"
        if accelerator.is_main_process:
            found = "absent" if not self.output_dir.exists() else "empty" if not _entries(self.output_dir) else None
            self._lock = OutputLock(self.output_dir).acquire()  # before anything else is written
            try:
                folder_io.check_entries(self.output_dir, WRITTEN)
                settle_previous_run(self.output_dir)
                self.checkpoint = prepare_output_dir(self.output_dir, resume, overwrite, True, self.inputs)
                self.run_id = folder_run_id(self.output_dir) if resume else None
            except BaseException:
                self._lock.release(refused=True)
                raise
            self._found = None if resume else found
        accelerator.wait_for_everyone()
        if not accelerator.is_main_process:
            self.checkpoint = prepare_output_dir(self.output_dir, resume, overwrite, False, self.inputs)
            self.run_id = folder_run_id(self.output_dir) if resume else None
        # an earlier run was moved aside (--overwrite); the manifest and config were written; a checkpoint or the
        # export was written
        self._claimed = self._has_claimed = self._started = False

    @property
    def checkpoints(self) -> Path:
        return self.output_dir / CHECKPOINTS

    def claim(self, config, run_id: str) -> None:
        """Every input has loaded: make the folder the run ``run_id``'s and write its manifest and config."""
        output_dir = self.output_dir
        if self.accelerator.is_main_process:
            if self.resume:
                manifest = read_run_manifest(output_dir) or {"format": 1, "files": run_files(output_dir)}
                manifest["run_id"] = run_id
                manifest["files"].update({name: "run" for name in RUN_ENTRIES if name not in manifest["files"]})
            elif _entries(output_dir):
                owned = run_files(output_dir, overwrite=True)
                _move_aside(output_dir, [name for name in _entries(output_dir) if name in owned], run_id)
                self._claimed = True
                if _entries(output_dir):
                    logger.warning("--overwrite replaced the earlier run in %s and left what it did not write: %s",
                                   output_dir, ", ".join(_entries(output_dir)))  # fmt: skip
            if not self.resume:
                manifest = {"format": 1, "run_id": run_id, "files": dict.fromkeys(RUN_ENTRIES, "run")}
            self._has_claimed = True
            save_run_config(output_dir, config, run_id)  # first: it marks a run, so a kill after it leaves one
            folder_io.write_text(output_dir, output_dir / RUN_MANIFEST, json.dumps(manifest, indent=1))
        self.accelerator.wait_for_everyone()

    def save_checkpoint(self, state: dict, limit: int) -> Path:
        saved = checkpoints.save_checkpoint(self.accelerator, self.output_dir, state, limit)
        self._started = True
        if self.accelerator.is_main_process:
            drop_previous_run(self.output_dir)  # the new run now has a checkpoint: the run it replaced can go
        return saved

    def finish(self, drop: Path | None = None) -> None:
        """The run has exported its result: the run it replaced goes, and so does the checkpoint ``drop``."""
        self._started = True
        if self.accelerator.is_main_process:
            drop_previous_run(self.output_dir)
            if drop is not None and drop.resolve().parent == self.checkpoints.resolve():  # never another run's
                folder_io.remove(self.output_dir, self.checkpoints / drop.name)
        self.accelerator.wait_for_everyone()

    @contextlib.contextmanager
    def restore_on_failure(self):
        left_nothing = False  # the folder is as the start found it (and so is a lock file it found)
        try:
            yield self
        except BaseException:
            left_nothing = not self._has_claimed or (self._claimed and not self._started)  # the earlier run is back
            if self._claimed and self.accelerator.is_main_process:
                settle_previous_run(self.output_dir)  # back, unless the new run reached a checkpoint
            elif self._found is not None and not self._started:
                # leave the folder as found, so that the same command can run again
                if self._has_claimed:
                    for name in run_files(self.output_dir):  # only what the run wrote: a file put there stays
                        folder_io.remove(self.output_dir, self.output_dir / name)
                left_nothing = True
            raise
        finally:
            if self._lock is not None:
                self._lock.release(refused=left_nothing)
