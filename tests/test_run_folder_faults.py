"""A random walk over a run folder R and its surroundings: whatever happens to a run, nothing outside it is lost,
a killed run resumes exactly, a refusal writes nothing and says what to do, and ``results.json`` tells the truth.

Each sequence (one seed of ``random.Random``) lives in its own home folder: a data file, victim files and folders
outside R (link targets), a neighbour file beside R, and R itself. Its operations are the CLI's (``train``,
``--resume``, ``--overwrite``; some killed with SIGKILL or stopped with SIGTERM at an observed moment: the n-th
logged step, a checkpoint being written or appearing, a hidden entry appearing (the export's staging folder,
``--overwrite``'s aside folder, a manifest being replaced), or after a random delay) and a user's: edit
``training_config.yaml``, rewrite the data file keeping its mtime, plant a link in R pointing outside it, copy in
another run's checkpoint (with or without ``run_files.json``), start a second writer while one runs.

After every operation:

* no byte outside R changes: the home folder but R, the model folder and every link target are hashed (links not
  followed) before and after;
* a finished run's step losses (``results.json`` history and ``logs/metrics.csv``) equal the uninterrupted run's
  on the settings ``results.json`` names and the data the run read; each reference run is trained once per
  session, cached by settings and data hash;
* a finished ``--resume`` started at the newest checkpoint the run had (``resumed_from_step``): no progress lost,
  also where a stopped ``--overwrite`` start is settled;
* ``results.json``'s config is the settings the run trained with (those of record in R's training_config.yaml for
  ``--resume``, the command's for a fresh start or ``--overwrite``);
* a refusal (exit 1) leaves R's tree as it was (the lock file aside; where a stopped start left hidden entries in
  R, such as --overwrite's aside folder, the start may first settle them: then none may be left), and its last
  stderr line names a path or a setting and says what to do (it holds one of NEXT_STEP_WORDS);
* stderr never holds a Python traceback;
* where the expected outcome is defined, it happens: a run with nothing changed resumes; a changed training
  setting or data file on ``--resume`` (a checkpoint of the run on disk) is refused; a link where ``--resume``
  writes (the lock, README.md, logs, logs/metrics.csv, results.json, checkpoints) is refused; a fresh start in a
  folder holding anything is refused; ``--overwrite`` replaces the run (it must refuse a link at the lock, and
  may refuse one where it writes); a second writer is refused while the first runs; after a kill, R holds a
  resumable run or nothing, or the next start (a fresh start again, or ``--resume`` of the run R held) settles
  what the stopped one left and runs.

The CLI runs in processes forked from a server that imported the package once (multiprocessing's forkserver):
each start is a new process, as on the command line, without its seconds of imports.

Replay: ``SIMCSE_WEINCE_FAULT_SEEDS=12,40 python -m pytest -s tests/test_run_folder_faults.py -k default_random``
runs those seeds (the operations chosen depend on the seed and on what each operation observed, so a kill that
lands elsewhere may take the walk another way); ``SIMCSE_WEINCE_FAULT_SEQUENCE='12:train,link:LOCK,resume'`` runs
those operations (names as :meth:`Sequence.dispatch` takes them; a failure prints this line for its walk, to
replay it or shorten it by hand). ``-m slow`` runs SIMCSE_WEINCE_FAULT_SEQUENCES random walks (200 unless set) of
SIMCSE_WEINCE_FAULT_OPERATIONS operations (7). A failure names every failing walk: its seed, its operations and the
violated invariant; each walk's folders stay under pytest's tmp folder (seed-N).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from train_helpers import REPO_ROOT, make_tiny_model

DEFAULT_SEEDS = (3,)
#: fixed walks through the issue's flows (seed, operations), run by default besides DEFAULT_SEEDS
SCENARIOS = {
    # killed before the first checkpoint, resumed (from step 0), killed after a checkpoint, resumed
    "a_restart_from_step_0_keeps_the_run": (1, ["kill:train@step1", "kill:resume@checkpoint", "resume"]),
    # an --overwrite killed before its first checkpoint: the run it replaces is R's and resumes
    "a_killed_overwrite_leaves_the_replaced_run": (1, ["train", "kill:overwrite@step1", "resume"]),
    # an edited seed on --resume; the data rewritten with its mtime kept, --overwrite; a link at README.md
    "edited_settings_and_links_are_refused": (2, ["train", "edit-yaml:seed", "resume", "overwrite", "rewrite-data",
                                                  "overwrite", "link:README.md", "resume"]),
    # another run's checkpoint (R's settings, another id) copied in, run_files.json deleted
    "another_runs_checkpoint_is_refused": (2, ["train", "foreign:without-manifest", "resume"]),
    # a second writer while one trains; a link at the lock
    "a_second_writer_and_a_linked_lock_are_refused": (3, ["second-writer", "link:LOCK", "resume"]),
}  # fmt: skip
SLOW_SEQUENCES = int(os.environ.get("SIMCSE_WEINCE_FAULT_SEQUENCES", "200"))
OPERATIONS_PER_SEQUENCE = int(os.environ.get("SIMCSE_WEINCE_FAULT_OPERATIONS", "7"))
TRAIN_LINES = 400
#: a refusal's last line says what to do: one of these words (a deliberately simple check)
NEXT_STEP_WORDS = (
    "pass", "choose", "use", "resume", "start", "remove", "move", "delete", "restore", "wait", "put", "continue",
    "rerun", "run", "rename", "set", "copy", "edit", "give", "free",
)  # fmt: skip
#: the settings a resumed run must keep (edited in training_config.yaml by the walk)
EDITABLE = {"batch_size": (8, 16), "seed": (1, 2), "learning_rate": (1e-3, 5e-3)}
#: where a link is planted: (path in R, link to a victim "file" or "folder", written by --resume)
LINK_PLACES = (
    ("LOCK", "file", True),
    ("README.md", "file", True),
    ("results.json", "file", True),
    ("logs", "folder", True),
    ("logs/metrics.csv", "file", True),
    ("checkpoints", "folder", True),
    ("CHECKPOINT_FILE", "file", False),
)
PRELOAD = ["simcse_weince.cli", "simcse_weince.text.trainer", "torch", "transformers", "sentence_transformers",
           "accelerate", "datasets"]  # fmt: skip


def _lock_file_name() -> str:
    from simcse_weince.training.run_folder import LOCK_FILE

    return LOCK_FILE


# ------------------------------------------------------------------ CLI processes forked from a warm server


def _cli_child(argv: list[str], cwd: str, stdout_path: str, stderr_path: str) -> None:
    """The console script, in a process forked from the server: stdout and stderr go to files."""
    for fd, path in ((1, stdout_path), (2, stderr_path)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    os.chdir(cwd)
    sys.argv = ["simcse-weince", *argv]
    from simcse_weince.cli import main

    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def _noop() -> None:
    return None


class CliServer:
    """Starts ``simcse-weince ARGS`` as a process forked from a server that imported the package once."""

    def __init__(self, logs: Path, env: dict):
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(PRELOAD)
        self.logs, self.count = logs, 0
        saved = dict(os.environ)
        os.environ.update(env)  # the server (and every process it forks) starts with these
        try:
            self.call(_noop)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def call(self, target, *args) -> int:
        process = self.context.Process(target=target, args=args)
        process.start()
        process.join()
        return process.exitcode

    def start(self, argv: list[str], cwd: Path) -> Running:
        self.count += 1
        stdout, stderr = self.logs / f"{self.count:05d}.out", self.logs / f"{self.count:05d}.err"
        process = self.context.Process(target=_cli_child, args=(argv, str(cwd), str(stdout), str(stderr)))
        process.start()
        return Running(process, stderr, time.time())

    def run(self, argv: list[str], cwd: Path, timeout: float = 600) -> tuple[int, str]:
        running = self.start(argv, cwd)
        return running.wait(timeout), running.stderr()


@dataclass
class Running:
    process: multiprocessing.Process
    stderr_path: Path
    started: float

    def wait(self, timeout: float = 600) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise TimeoutError(f"the CLI ran over {timeout} s: {self.stderr()[-2000:]}")
        return self.process.exitcode

    def alive(self) -> bool:
        return self.process.exitcode is None and self.process.is_alive()

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace") if self.stderr_path.exists() else ""


# ------------------------------------------------------------------------------------------- hashing trees


def tree_state(root: Path, skip=()) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): a file's sha256, a link's target, a folder's mark."""
    state: dict[str, tuple] = {}
    if not os.path.lexists(root):
        return state
    skip = {Path(path) for path in skip}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except NotADirectoryError:
            continue
        except FileNotFoundError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if path in skip:
                continue
            name = path.relative_to(root).as_posix()
            if entry.is_symlink():
                state[name] = ("link", os.readlink(path))
            elif entry.is_dir():
                state[name] = ("folder",)
                stack.append(path)
            elif entry.is_file():
                try:
                    state[name] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
                except OSError as error:
                    state[name] = ("unreadable", str(error))
            else:
                state[name] = ("other",)
    return state


def tree_changes(before: dict, after: dict) -> list[str]:
    changed = [f"{name} changed" for name in before if name in after and before[name] != after[name]]
    changed += [f"{name} removed" for name in before if name not in after]
    changed += [f"{name} appeared" for name in after if name not in before]
    return sorted(changed)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class Settings:
    batch_size: int = 8
    seed: int = 1
    learning_rate: float = 1e-3
    max_steps: int = 6
    num_workers: int = 0

    def flags(self) -> list[str]:
        return ["--batch-size", str(self.batch_size), "--seed", str(self.seed), "--learning-rate",
                str(self.learning_rate), "--max-steps", str(self.max_steps), "--num-workers",
                str(self.num_workers)]  # fmt: skip

    @staticmethod
    def of(config: dict) -> Settings:
        return Settings(int(config["batch_size"]), int(config["seed"]), float(config["learning_rate"]),
                        int(config["max_steps"]), int(config.get("num_workers") or 0))  # fmt: skip


def common_flags(model: Path, data: Path, save_steps: int, save_total_limit: int) -> list[str]:
    return [
        "--model", str(model), "--train-file", str(data), "--eval-steps", "0", "--final-evaluation", "false",
        "--report-to", "csv", "--max-length", "16", "--eval-max-length", "16", "--logging-steps", "1",
        "--mixed-precision", "no", "--pooler", "cls", "--save-steps", str(save_steps),
        "--save-total-limit", str(save_total_limit),
    ]  # fmt: skip


class Session:
    """What every sequence shares: the CLI server, the tiny model, the two data contents, the reference runs and
    another run whose checkpoint is copied into R."""

    def __init__(self, root: Path, data_dir: Path):
        self.root = root
        (root / "cli-logs").mkdir(parents=True, exist_ok=True)
        cache = root / "cache"
        env = {
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "HF_HOME": str(cache / "hf"), "HF_DATASETS_CACHE": str(cache / "datasets"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }  # fmt: skip
        self.server = CliServer(root / "cli-logs", env)
        self.model = root / "tiny"
        assert self.server.call(make_tiny_model, self.model) == 0
        lines = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
        self.contents = ["\n".join(lines[:TRAIN_LINES]) + "\n", "\n".join(lines[TRAIN_LINES : 2 * TRAIN_LINES]) + "\n"]
        self.references: dict[tuple, list[float]] = {}
        self.lock_name = _lock_file_name()
        self.starts = 0

    def data_file(self, content: bytes) -> Path:
        path = self.root / "refdata" / f"{sha(content)[:16]}.txt"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(content)
        return path

    def reference(self, settings: Settings, content: bytes) -> list[float]:
        """The step losses of the uninterrupted run on ``settings`` and ``content`` (trained once a session)."""
        key = (settings, sha(content))
        if key not in self.references:
            output = self.root / "references" / f"{len(self.references):04d}"
            argv = ["train", *common_flags(self.model, self.data_file(content), 0, 1), *settings.flags(),
                    "--output-dir", str(output)]  # fmt: skip
            code, stderr = self.server.run(argv, self.root)
            self.starts += 1
            assert code == 0, f"the reference run {settings} failed: {stderr[-3000:]}"
            history = json.loads((output / "results.json").read_text())["history"]
            self.references[key] = [entry["loss"] for entry in history]
        return self.references[key]


# ---------------------------------------------------------------------------------------- one sequence


class Violation(AssertionError):
    pass


@dataclass
class Expected:
    """What the walk knows of R: the run it holds (settings of record, data read at its start), and what a user
    changed since."""

    settings: Settings | None = None  # None: R holds no run
    data_at_start: bytes | None = None
    yaml_edits: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)  # path in R -> (target, written by --resume)
    foreign: str | None = None  # the name of a checkpoint copied in from another run
    killed: bool = False
    leftovers: bool = False  # a stopped fresh start left entries: the same command again must clear them and run
    newest: int = 0  # the step of the run's newest checkpoint, as last seen with the run in R: a resume starts there


KILL_POINTS = ("step", "checkpoint-tmp", "checkpoint", "hidden", "export", "delay")


class Sequence:
    def __init__(self, session: Session, seed: int, home: Path, random_settings: bool = True):
        self.session, self.seed, self.rng = session, seed, random.Random(seed)
        self.home = home
        self.run_dir = home / "runs" / "R"
        self.data = home / "data" / "train.txt"
        self.victims = home / "victims"
        self.log: list[str] = []
        self.names: list[str] = []  # the operations run, as dispatch() takes them (to replay the walk)
        self.forced: list[str] = []  # operations that must come next (the start after a stopped one)
        self.operations = 0
        self.expected = Expected()
        self.save_steps = self.rng.choice((2, 3))
        self.save_total_limit = self.rng.choice((1, 2))
        self.num_workers = 2 if random_settings and self.rng.random() < 0.15 else 0
        self.content_index = 0
        (home / "runs").mkdir(parents=True)
        (home / "runs" / "neighbour.txt").write_text("a file beside the run\n")
        self.data.parent.mkdir()
        self.data.write_text(session.contents[0], encoding="utf-8")
        (self.victims / "folder" / "sub").mkdir(parents=True)
        (self.victims / "folder" / "kept.txt").write_text("a victim folder's file\n")
        (self.victims / "folder" / "sub" / "deep.txt").write_text("deeper\n")
        for index in range(8):
            (self.victims / f"victim-{index}.txt").write_text(f"victim {index}: a user's notes\n" * 4)

    # ---- helpers

    def fail(self, what: str) -> None:
        raise Violation(what)

    def surroundings(self) -> dict:
        state = tree_state(self.home, skip=[self.run_dir])
        state.update({f"<model>/{k}": v for k, v in tree_state(self.session.model).items()})
        return state

    def run_tree(self) -> dict:
        return tree_state(self.run_dir, skip=[self.run_dir / self.session.lock_name])

    def flags(self, settings: Settings) -> list[str]:
        return [*common_flags(self.session.model, self.data, self.save_steps, self.save_total_limit),
                *settings.flags()]  # fmt: skip

    def random_settings(self) -> Settings:
        return Settings(
            batch_size=self.rng.choice(EDITABLE["batch_size"]),
            seed=self.rng.choice(EDITABLE["seed"]),
            learning_rate=self.rng.choice(EDITABLE["learning_rate"]),
            max_steps=self.rng.choice((6, 6, 16)),
            num_workers=self.num_workers,
        )

    def own_checkpoints(self) -> list[Path]:
        folder = self.run_dir / "checkpoints"
        if folder.is_symlink() or not folder.is_dir():
            return []
        return [path for path in sorted(folder.glob("step-*[0-9]")) if path.name != self.expected.foreign]

    def yaml_settings(self) -> Settings | None:
        import yaml

        path = self.run_dir / "training_config.yaml"
        aside = self.run_dir / ".simcse-weince.previous-run" / "training_config.yaml"
        if self.replaced_run_pending() and aside.is_file():
            path = aside  # the next start puts the earlier run back, with its own config: that config is R's
        if path.is_symlink() or not path.is_file():
            return None
        return Settings.of(yaml.safe_load(path.read_text(encoding="utf-8")))

    def data_content(self) -> bytes:
        return self.data.read_bytes()

    def entries(self) -> list[str]:
        if not self.run_dir.is_dir():
            return []
        return sorted(name for name in os.listdir(self.run_dir) if name != self.session.lock_name)

    # ---- the walk

    def walk(self, operations) -> None:
        """``operations``: how many to draw, or the list to run (names as :meth:`dispatch` takes them)."""
        planned = list(operations) if isinstance(operations, list) else None
        drawn = 0
        while True:
            if self.forced:
                name = self.forced.pop(0)
            elif planned is not None:
                if not planned:
                    break
                name = planned.pop(0)
            elif drawn < operations:
                name, drawn = self.choose(), drawn + 1
            else:
                break
            self.step(name)
        if self.expected.settings is not None and self.clean():
            self.step("resume")  # the end: a run with nothing changed resumes and finishes exactly

    def clean(self) -> bool:
        e = self.expected
        return not e.yaml_edits and not e.links and e.foreign is None and e.data_at_start == self.data_content()

    def choose(self) -> str:
        e, rng = self.expected, self.rng
        if e.settings is None:
            choices = ["train"] * 3 + ["kill:train", "kill:train", "term:train", "second-writer", "rewrite-data"]
            if not self.entries():
                choices.append("link")
        else:
            choices = ["resume", "resume", "overwrite", "kill:resume", "kill:overwrite", "kill:overwrite",
                       "term:resume", "edit-yaml", "rewrite-data", "link", "link", "foreign", "second-writer",
                       "train"]  # fmt: skip
            if e.killed:
                choices += ["resume"] * 6
        return rng.choice(choices)

    def step(self, name: str) -> None:
        self.operations += 1
        index = len(self.log)
        self.log.append(name)
        self.names.append(name)
        before = self.surroundings()
        try:
            self.dispatch(name, index)
        except Violation as violation:
            changed = self.changed_outside(before, index)
            if changed:
                raise Violation(f"bytes outside R changed: {changed[:8]}; and {violation}") from None
            raise
        changed = self.changed_outside(before, index)
        if changed:
            self.fail(f"bytes outside R changed: {changed[:8]}")

    def changed_outside(self, before: dict, index: int) -> list[str]:
        changed = tree_changes(before, self.surroundings())
        if self.log[index].startswith("rewrite-data"):
            changed = [line for line in changed if not line.startswith("data/")]
        return changed

    def dispatch(self, name: str, index: int) -> None:
        """``name``: an operation, with an optional choice after a colon (``link:LOCK``, ``kill:resume@step3``,
        ``edit-yaml:seed``, ``foreign:without-manifest``) that the walk otherwise draws."""
        kind, _, choice = name.partition(":")
        if kind in ("train", "resume", "overwrite"):
            self.cli_operation(kind, index)
        elif kind in ("kill", "term"):
            operation, _, point = choice.partition("@")
            self.cli_operation(operation, index, stop=kind, point=point or None)
        elif kind == "edit-yaml":
            self.edit_yaml(index, choice or None)
        elif kind == "rewrite-data":
            self.rewrite_data(index)
        elif kind == "link":
            self.plant_link(index, choice or None)
        elif kind == "foreign":
            self.copy_foreign(index, choice or None)
        elif kind == "second-writer":
            self.second_writer(index)

    # ---- a user's operations

    def edit_yaml(self, index: int, name: str | None = None) -> None:
        path = self.run_dir / "training_config.yaml"
        if path.is_symlink() or not path.is_file():
            self.log[index] += " (no training_config.yaml: nothing edited)"
            return
        name = name or self.rng.choice(sorted(EDITABLE))
        text = path.read_text(encoding="utf-8")
        current = re.search(rf"^{name}: (.*)$", text, flags=re.M)
        value = next(v for v in EDITABLE[name] if float(v) != float(current.group(1)))
        path.write_text(text.replace(current.group(0), f"{name}: {value}"), encoding="utf-8")
        record = self.expected.settings
        if self.replaced_run_pending():
            # a stopped --overwrite start's config: the next start puts the earlier run back, and this file goes
            self.log[index] += f" ({name}: {current.group(1)} -> {value}, in the config of a stopped --overwrite)"
            return
        if record is not None:
            edited = self.yaml_settings()
            self.expected.yaml_edits = {key: getattr(edited, key) for key in EDITABLE
                                        if getattr(edited, key) != getattr(record, key)}  # fmt: skip
        self.log[index] += f" ({name}: {current.group(1)} -> {value})"

    def replaced_run_pending(self) -> bool:
        """An --overwrite start stopped before its first checkpoint: the run it moved aside is put back next."""
        try:
            run_id = json.loads((self.run_dir / ".simcse-weince.previous-run" / "moved.json").read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            return False  # no aside, or one that moved nothing
        for state in (self.run_dir / "checkpoints").glob("step-*[0-9]/trainer_state.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(state.read_text()).get("run_id") == run_id:
                    return False  # the new run reached a checkpoint: it holds the folder
        return True

    def rewrite_data(self, index: int) -> None:
        """Other lines in the same file, its mtime put back (as ``cp -p`` / ``rsync -t`` leave it)."""
        stat = self.data.stat()
        self.content_index = 1 - self.content_index
        self.data.write_text(self.session.contents[self.content_index], encoding="utf-8")
        os.utime(self.data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        self.log[index] += f" (content {self.content_index}, mtime kept)"

    def plant_link(self, index: int, place: str | None = None) -> None:
        where, kind, written = next(p for p in LINK_PLACES if p[0] == place) if place else self.rng.choice(LINK_PLACES)
        if where == "LOCK":
            where = self.session.lock_name
        if where == "CHECKPOINT_FILE":
            checkpoints = self.own_checkpoints()
            if not checkpoints:
                self.log[index] += " (no checkpoint: none planted)"
                return
            where = f"checkpoints/{checkpoints[-1].name}/model.safetensors"
        link = self.run_dir / where
        if link.parent != self.run_dir and (link.parent.is_symlink() or not link.parent.is_dir()):
            self.log[index] += f" ({where}: its folder is missing: none planted)"
            return
        self.run_dir.mkdir(exist_ok=True)
        target = self.victims / ("folder" if kind == "folder" else f"victim-{self.rng.randrange(8)}.txt")
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.symlink_to(target)
        self.expected.links[where] = (target, written)
        self.log[index] += f" ({where} -> {target.relative_to(self.home)})"

    def copy_foreign(self, index: int, how: str | None = None) -> None:
        checkpoints = self.run_dir / "checkpoints"
        if checkpoints.is_symlink() or not checkpoints.is_dir():
            self.log[index] += " (no checkpoints folder: nothing copied)"
            return
        other = self.other_checkpoint()
        shutil.copytree(other, checkpoints / other.name, dirs_exist_ok=True)
        self.expected.foreign = other.name
        without_manifest = how == "without-manifest" if how else self.rng.random() < 0.5
        if without_manifest:
            (self.run_dir / "run_files.json").unlink(missing_ok=True)
        self.log[index] += f" ({other.name}{', run_files.json deleted' if without_manifest else ''})"

    def other_checkpoint(self) -> Path:
        """A checkpoint of another run (step 17 of 18) on R's data file, with R's settings: it differs from R's run
        only by its identity and length (which --resume may change), so only the run id tells it apart."""
        settings = replace(self.expected.settings or self.random_settings(), max_steps=18)
        output = self.session.root / "other-runs" / f"{self.seed}-{self.operations}"
        argv = ["train", *common_flags(self.session.model, self.data, 17, 1), *settings.flags(), "--output-dir",
                str(output)]  # fmt: skip
        code, stderr = self.session.server.run(argv, self.home)
        self.session.starts += 1
        assert code == 0, f"the other run failed: {stderr[-3000:]}"
        checkpoints = sorted((output / "checkpoints").glob("step-*[0-9]"))
        assert checkpoints, f"the other run kept no checkpoint: {sorted(output.rglob('*'))}"
        return checkpoints[-1]

    # ---- the CLI's operations

    def command(self, operation: str, settings: Settings | None) -> list[str]:
        if operation == "resume":
            return ["train", "--output-dir", str(self.run_dir), "--resume"]
        extra = ["--overwrite"] if operation == "overwrite" else []
        return ["train", *self.flags(settings), "--output-dir", str(self.run_dir), *extra]

    def expected_refusal(self, operation: str) -> str | None:
        """Why ``operation`` must be refused now, or None where it must run (or either is fine: "either")."""
        e = self.expected
        lock_link = self.session.lock_name in e.links
        if lock_link:
            return f"a link at {self.session.lock_name}"
        if operation == "train":
            return f"{self.run_dir} holds {self.entries()}" if self.entries() and not e.leftovers else None
        written = sorted(where for where, (_, writes) in e.links.items() if writes)
        if operation == "overwrite":  # a link where the run writes: refused by its path, or moved aside with R's run
            if written:
                return "either"
            return None if e.settings is not None or not self.entries() else "either"
        # --resume
        if e.settings is None:
            return "either" if not (self.run_dir / "training_config.yaml").is_file() else None
        if written:
            return f"a link at {written[0]}"
        if self.own_checkpoints():
            if e.yaml_edits:
                return f"training_config.yaml edited: {sorted(e.yaml_edits)[0]}"
            if e.data_at_start is not None and self.data_content() != e.data_at_start:
                return f"the data file {self.data} changed"
        if e.foreign is not None or any(where.startswith("checkpoints/") for where in e.links):
            return "either"
        if not self.own_checkpoints() and (e.yaml_edits or self.data_content() != e.data_at_start):
            return "either"
        return None

    def cli_operation(self, operation: str, index: int, stop: str | None = None, point: str | None = None) -> None:
        e = self.expected
        if operation == "resume" and e.settings is None and not self.entries():
            operation = "train"
            self.log[index] = self.log[index].replace("resume", "train")
        settings = self.random_settings() if operation != "resume" else None
        if operation == "overwrite" and e.settings is not None:
            if self.rng.random() < 0.5:
                settings = replace(e.settings, seed=self.rng.choice(EDITABLE["seed"]))  # often the same run again
            if settings == e.settings:  # a replaced run differs from the new one, so that results.json tells which
                settings = replace(settings, seed=next(seed for seed in EDITABLE["seed"] if seed != settings.seed))
        if settings is not None:
            self.log[index] += f" {settings}"
        refusal = self.expected_refusal(operation)
        yaml_before, data_now = self.yaml_settings(), self.data_content()
        tree_before = self.run_tree()
        checkpoints_before = [path.name for path in self.own_checkpoints()]
        argv = self.command(operation, settings)
        running = self.session.server.start(argv, self.home)
        self.session.starts += 1
        fired = self.stop_at(running, stop, settings or yaml_before, point) if stop else None
        code = running.wait()
        stderr = running.stderr()
        self.log[index] += f" -> exit {code}" + (f" ({fired})" if fired else "")
        if "Traceback" in stderr:
            self.fail(f"a traceback in stderr: {stderr[-2500:]}")
        if code == 1:
            self.check_refusal(stderr, tree_before)
            if refusal is None:
                self.fail(f"{operation} was refused where it must run: {last_line(stderr)}")
            return
        # -SIGTERM: the signal came before the CLI had installed its handler (a plain kill, as SIGKILL)
        if code not in (0, 143, -signal.SIGKILL) and not (code == -signal.SIGTERM and stop == "term"):
            self.fail(f"exit code {code}: {stderr[-2000:]}")
        if refusal not in (None, "either") and not (code < 0 and fired.split(" ", 1)[1].startswith("after")):
            self.fail(f"{operation} ran (exit {code}) where it must be refused ({refusal})")
        if code == 143:
            if last_line(stderr) != "interrupted by SIGTERM":
                self.fail(f"SIGTERM: the last line is {last_line(stderr)!r}")
        if operation == "resume":  # the run of record, or the edited YAML where no checkpoint holds a record
            settings = yaml_before if e.yaml_edits or e.settings is None else e.settings
        if code == 0:
            results = self.check_finished(settings, data_now)
            checkpoints_changed = e.foreign or any(where.startswith("checkpoints") for where in e.links)
            resumed_from = results["resumed_from_step"] or 0  # None: started at step 0
            if operation == "resume" and not checkpoints_changed and resumed_from < e.newest:
                self.fail(f"progress lost: --resume started at step {resumed_from}, the run had a checkpoint at "
                          f"step {e.newest} (checkpoints before it: {checkpoints_before})")  # fmt: skip
            self.expected = Expected(settings, data_now, newest=self.newest_step())
            return
        self.after_stop(operation, settings, data_now, running.started, tree_before)

    def after_stop(self, operation: str, settings: Settings, data_now: bytes, started: float, before: dict) -> None:
        """A kill (or SIGTERM): R holds a run that resumes, or nothing (a start stopped before it claimed R). An
        --overwrite start holds R once it has a checkpoint; before, the run it replaces is R's (put back at the
        next start); a --resume that ran restarted a run without a checkpoint with the YAML and data of now."""
        e = self.expected
        if self.yaml_settings() is None:
            left = [name for name in self.entries() if name not in before]  # the user's links were there before
            if left:  # the next start must settle them: the same command again, or --resume of the run it replaced
                self.forced.append("resume" if e.settings is not None else "train")
                self.log[-1] += f" (left {left}: the next {self.forced[-1]} must run)"
            if e.settings is not None and left:
                e.killed = True
                return
            self.expected = Expected(links={where: link for where, link in e.links.items()
                                            if (self.run_dir / where).is_symlink()}, leftovers=bool(left))  # fmt: skip
            return
        if operation == "train" or e.settings is None or (operation == "overwrite" and self.new_checkpoints(started)):
            self.expected = e = Expected(settings, data_now, newest=self.newest_step())
        elif operation == "resume" and self.new_checkpoints(started):
            e.settings, e.data_at_start, e.yaml_edits, e.newest = settings, data_now, {}, self.newest_step()
        if not self.replaced_run_pending():  # pending: the run's links and copied checkpoint come back with it
            e.links = {where: link for where, link in e.links.items() if (self.run_dir / where).is_symlink()}
            if e.foreign is not None and not (self.run_dir / "checkpoints" / e.foreign).is_dir():
                e.foreign = None
        e.killed = True

    def stop_at(self, running: Running, how: str, settings: Settings, point: str | None) -> str:
        """SIGKILL (``kill``) or SIGTERM (``term``) at a random observed point (``point``: one of KILL_POINTS,
        ``stepN`` for the N-th logged step); returns what fired."""
        point = point or self.rng.choice(KILL_POINTS)
        step = self.rng.randint(1, settings.max_steps) if settings else 1
        if point.startswith("step") and point != "step":
            point, step = "step", int(point[4:])
        delay = self.rng.uniform(0.3, 6.0)
        known = self.hidden_entries()
        export_marks = self.export_marks()
        deadline = running.started + (delay if point == "delay" else 600)
        fired = None
        while running.alive() and fired is None:
            if point == "step" and logged_steps(self.run_dir) >= step and self.started_by(running):
                fired = f"at step {step}"
            elif point == "checkpoint-tmp" and self.checkpoint_temporaries(running.started):
                fired = "during a checkpoint write"
            elif point == "checkpoint" and self.new_checkpoints(running.started):
                fired = "a new checkpoint appeared"
            elif point == "hidden" and (appeared := sorted(self.hidden_entries() - known)):
                fired = f"hidden entry {appeared[0]} appeared"  # read once: a temporary may be gone a moment later
            elif point == "export" and self.export_marks() != export_marks:
                fired = "during the export"
            elif time.time() >= deadline:
                fired = f"after {delay:.1f} s" if point == "delay" else "timed out"
            else:
                time.sleep(0.002)
                continue
        if fired is None:
            return f"{point}: the run ended first"
        os.kill(running.process.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        return f"{how} {fired}"

    def newest_step(self) -> int:
        return max((int(path.name.split("-")[1]) for path in self.own_checkpoints()), default=0)

    def new_checkpoints(self, since: float) -> list[Path]:
        """The run's checkpoints written since ``since`` (by the process started then)."""
        found = []
        for checkpoint in self.own_checkpoints():
            with contextlib.suppress(OSError):
                if (checkpoint / "trainer_state.json").stat().st_mtime >= since:
                    found.append(checkpoint)
        return found

    def started_by(self, running: Running) -> bool:
        path = self.run_dir / "logs" / "metrics.csv"
        try:
            return path.stat().st_mtime >= running.started
        except OSError:
            return False

    def checkpoint_temporaries(self, since: float) -> bool:
        """A checkpoint being written (``step-N.tmp``) by the process started at ``since`` (not a stale one)."""
        folder = self.run_dir / "checkpoints"
        try:
            names = [name for name in os.listdir(folder) if name.startswith("step-") and not name[-1].isdigit()]
            return any(os.stat(folder / name).st_mtime >= since for name in names)
        except OSError:
            return False

    def hidden_entries(self) -> set[str]:
        found = set()
        for folder in (self.run_dir, self.run_dir.parent):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            found |= {
                f"{folder.name}/{name}" for name in names if name.startswith(".") and name != self.session.lock_name
            }
        return found

    def export_marks(self) -> tuple:
        marks = []
        for name in ("modules.json", "model.safetensors", "results.json", "README.md"):
            try:
                marks.append(os.stat(self.run_dir / name, follow_symlinks=False).st_mtime_ns)
            except OSError:
                marks.append(None)
        return tuple(marks)

    def second_writer(self, index: int) -> None:
        """A run in R and, while it trains, another start on R: refused, naming the first, which then finishes."""
        e = self.expected
        lock_link = self.session.lock_name in e.links
        operation = "overwrite" if e.settings is not None or self.entries() else "train"
        settings = replace(self.random_settings(), max_steps=16)
        first_refusal = self.expected_refusal(operation)
        self.log[index] += f" (first: {operation} {settings})"
        data_now = self.data_content()
        first = self.session.server.start(self.command(operation, settings), self.home)
        self.session.starts += 1
        while first.alive() and not (logged_steps(self.run_dir) >= 1 and self.started_by(first)):
            time.sleep(0.01)
        if first.alive():
            second_operation = self.rng.choice(("resume", "train", "overwrite"))
            second_settings = settings if second_operation != "resume" else None
            code, stderr = self.session.server.run(self.command(second_operation, second_settings), self.home)
            self.session.starts += 1
            still_running = first.alive()
            self.log[index] += f" second {second_operation} -> exit {code}"
            if "Traceback" in stderr:
                self.fail(f"a traceback in the second writer's stderr: {stderr[-2500:]}")
            if still_running:
                if code != 1:
                    self.fail(f"a second writer ({second_operation}) ran (exit {code}) while the first trained")
                self.check_message(stderr)
        code = first.wait()
        stderr = first.stderr()
        self.log[index] += f"; first -> exit {code}"
        if "Traceback" in stderr:
            self.fail(f"a traceback in stderr: {stderr[-2500:]}")
        if code == 1 and first_refusal is not None:
            self.check_message(stderr)
            return
        if code != 0:
            self.fail(f"the first writer ended with exit {code}: {last_line(stderr)}")
        if first_refusal not in (None, "either") and not lock_link:
            self.fail(f"{operation} ran where it must be refused ({first_refusal})")
        self.check_finished(settings, data_now)
        self.expected = Expected(settings, data_now, newest=self.newest_step())

    # ---- the checks

    def check_message(self, stderr: str) -> None:
        line = last_line(stderr)
        names = "/" in line or any(name in line for name in (*EDITABLE, "batch-size", "learning-rate", "seed"))
        says = any(re.search(rf"\b{word}\b", line) for word in NEXT_STEP_WORDS)
        if not (names and says):
            self.fail(f"the refusal's last line names no path or setting, or no next step: {line!r}")

    def check_refusal(self, stderr: str, tree_before: dict) -> None:
        self.check_message(stderr)
        changed = tree_changes(tree_before, self.run_tree())
        asides = (".simcse-weince.previous-run", ".simcse-weince.dropped-run")
        left = sorted(name for name in tree_before if name in asides)
        if changed and left and not [name for name in left if name in self.run_tree()]:
            return  # a stopped start's leftovers (an aside folder): every start first settles them, as promised
        if changed:
            self.fail(f"a refusal ({last_line(stderr)!r}) wrote in R: {changed[:8]}")

    def check_finished(self, settings: Settings, data: bytes) -> dict:
        """``results.json`` names the settings and the data that trained, and its losses are the reference's."""
        results_path = self.run_dir / "results.json"
        if results_path.is_symlink() or not results_path.is_file():
            self.fail("the run finished without results.json")
        results = json.loads(results_path.read_text())
        config = results["config"]
        recorded = Settings.of(config)
        if recorded != settings:
            self.fail(f"results.json names {recorded}; the run was given {settings}")
        if Path(config["train_file"]).resolve() != self.data.resolve():
            self.fail(f"results.json names the data {config['train_file']}, not {self.data}")
        fingerprint = results.get("data_fingerprint")
        if isinstance(fingerprint, dict):
            fingerprint = fingerprint.get("sha256")
        if fingerprint and fingerprint != sha(data):
            self.fail(f"results.json's data fingerprint {fingerprint} is not the data's {sha(data)}")
        losses = [entry["loss"] for entry in results["history"]]
        steps = [entry["step"] for entry in results["history"]]
        if steps != list(range(1, settings.max_steps + 1)):
            self.fail(f"results.json's history has the steps {steps}")
        reference = self.session.reference(settings, data)
        if losses != pytest.approx(reference, abs=1e-5):
            first = next(i for i, (a, b) in enumerate(zip(losses, reference)) if abs(a - b) > 1e-5)
            self.fail(f"step losses differ from the uninterrupted run's from step {first + 1}: "
                      f"{losses[first]:.6f} vs {reference[first]:.6f} ({settings}, data {sha(data)[:8]})")  # fmt: skip
        csv = self.run_dir / "logs" / "metrics.csv"
        if csv.is_symlink() or not csv.is_file():
            self.fail("the run finished without logs/metrics.csv")
        rows = [row.split(",") for row in csv.read_text().splitlines()[1:]]
        logged = [(int(row[0]), float(row[2])) for row in rows if row[1] == "loss"]
        if [step for step, _ in logged] != steps:
            self.fail(f"logs/metrics.csv has the loss steps {[step for step, _ in logged]}")
        if [loss for _, loss in logged] != pytest.approx(reference, abs=1e-5):
            self.fail("logs/metrics.csv's losses are not the uninterrupted run's")
        return results


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def logged_steps(output_dir: Path) -> int:
    path = output_dir / "logs" / "metrics.csv"
    try:
        if path.is_symlink() or path.parent.is_symlink():
            return 0
        text = path.read_text()
    except OSError:
        return 0
    steps = [line.split(",", 1)[0] for line in text.splitlines()[1:]]
    return max((int(step) for step in steps if step.isdigit()), default=0)


# ------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def session(tmp_path_factory, data_dir):
    if sys.platform != "linux":
        pytest.skip("the walk forks the CLI from a server and reads link-free trees the Linux way")
    return Session(tmp_path_factory.mktemp("faults"), data_dir)


TOTALS = {"sequences": 0, "operations": 0}


def explore(session: Session, walks, tmp_path_factory) -> list[str]:
    """Run each walk (a seed, or a seed and its operations); returns each failing walk's report."""
    failures = []
    for walk in walks:
        seed, planned = walk if isinstance(walk, tuple) else (walk, OPERATIONS_PER_SEQUENCE)
        sequence = Sequence(session, seed, tmp_path_factory.mktemp(f"seed-{seed}"), isinstance(planned, int))
        outcome = "kept every invariant"
        try:
            sequence.walk(planned)
        except Exception as error:  # noqa: BLE001 - a crash of the walk itself is reported with its steps too
            crash = f"crashed: {traceback.format_exc()[-2500:]}"
            outcome = f"violated: {error}" if isinstance(error, Violation) else crash
            replay = f"SIMCSE_WEINCE_FAULT_SEQUENCE='{seed}:{','.join(sequence.names)}'"
            failures.append(f"seed {seed} (home {sequence.home}; replay: {replay}):\n{_steps(sequence)}\n  {outcome}")
        TOTALS["sequences"] += 1
        TOTALS["operations"] += sequence.operations
        print(f"seed {seed}: {sequence.operations} operations\n{_steps(sequence)}\n  {outcome}", flush=True)
    return failures


def _steps(sequence: Sequence) -> str:
    return "\n".join(f"    {i + 1}. {line}" for i, line in enumerate(sequence.log))


def _walks(default) -> list:
    """SIMCSE_WEINCE_FAULT_SEEDS (seeds) or SIMCSE_WEINCE_FAULT_SEQUENCE (``seed:op,op,...``) replace ``default``."""
    given, sequence = os.environ.get("SIMCSE_WEINCE_FAULT_SEEDS"), os.environ.get("SIMCSE_WEINCE_FAULT_SEQUENCE")
    if sequence:
        seed, _, operations = sequence.partition(":")
        return [(int(seed), operations.split(","))]
    return [int(seed) for seed in given.split(",")] if given else list(default)


def check_walks(session: Session, walks, tmp_path_factory) -> None:
    started = time.monotonic()
    failures = explore(session, walks, tmp_path_factory)
    summary = (
        f"{len(walks)} sequences here ({TOTALS['sequences']} sequences, {TOTALS['operations']} operations in this "
        f"module so far; {session.starts} CLI starts, {len(session.references)} reference runs), "
        f"{time.monotonic() - started:.0f} s"
    )
    print(summary)
    assert not failures, f"{len(failures)} of {summary} failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_default_walk(session, tmp_path_factory, name):
    """The run folder's known flows as fixed walks."""
    check_walks(session, [SCENARIOS[name]], tmp_path_factory)


def test_default_random_walks(session, tmp_path_factory):
    check_walks(session, _walks(DEFAULT_SEEDS), tmp_path_factory)


@pytest.mark.slow
def test_many_random_walks(session, tmp_path_factory):
    """At least SIMCSE_WEINCE_FAULT_SEQUENCES (200) random walks."""
    check_walks(session, _walks(range(1000, 1000 + SLOW_SEQUENCES)), tmp_path_factory)
