"""The run folder as a user meets it: each refusal writes nothing and names its cause and next step; each flow that
must work works. One case per test, run on the CLI with a tiny model (the mechanism's classes are named in
docs/training.md#what-is-checked).

* links: the lock, or an entry the run writes (the model card, ``logs/``), planted as a link is refused by its path
  and target, and the link's target is untouched;
* the lock: a FIFO is named; another host's lock file is refused, never taken over; a forked child (a loader
  worker) does not keep the lock after its parent is killed;
* one identity: a --resume that restarts from step 0 keeps the folder's run id; a checkpoint of another run is
  refused by its recorded id without the manifest;
* settings of record: --resume compares with the checkpoint's settings, not with an edited training_config.yaml;
* one folder, however spelt (``.``, ``../R/``);
* --overwrite completes or changes nothing: never replaces the model it trains from, a move that fails puts back
  what moved, a start killed at any point of the move or of the restore is put back by the next start; an
  unreadable manifest says what to do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import yaml
from train_helpers import (
    cli_command,
    logged_steps,
    make_tiny_model,
    subprocess_env,
    tree_digest,
    wait_for,
    write_train_file,
)

from simcse_weince.cli import main
from simcse_weince.training import folder_io
from simcse_weince.training.checkpoints import list_checkpoints, write_manifest
from simcse_weince.training.run_folder import (
    LOCK_FILE,
    PREVIOUS_RUN,
    RUN_MANIFEST,
    OutputLock,
    _move_aside,
    run_files,
    settle_previous_run,
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A finished 5-step run (checkpoints at steps 2 and 4) and its flags."""
    root = tmp_path_factory.mktemp("run_folder_cases")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=120)
    flags = [
        "--model", str(model), "--train-file", str(train_file), "--batch-size", "8", "--max-steps", "5",
        "--save-steps", "2", "--save-total-limit", "2", "--eval-steps", "0", "--final-evaluation", "false",
        "--report-to", "csv", "--max-length", "16", "--eval-max-length", "16", "--learning-rate", "1e-3",
    ]  # fmt: skip
    run = root / "run"
    assert main(["train", *flags, "--output-dir", str(run)]) == 0
    return {"root": root, "run": run, "flags": flags, "model": model}


@pytest.fixture()
def run(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished["run"], copy)
    return copy


def _train(finished, output_dir, *extra) -> int:
    return main(["train", *finished["flags"], "--output-dir", str(output_dir), *extra])


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def _refused(finished, run, capsys, *extra, output_dir=None) -> str:
    """The command is refused in one line and the folder is byte for byte as it was."""
    before = tree_digest(run)
    assert _train(finished, output_dir or run, *extra) == 1
    assert tree_digest(run) == before
    return _error_line(capsys)


@pytest.mark.parametrize("extra", [["--resume"], ["--overwrite"], []])
def test_a_lock_planted_as_a_link_is_refused_and_its_target_untouched(finished, run, tmp_path, capsys, extra):
    victim = tmp_path / "victim.txt"
    victim.write_text("my data\n")
    (run / LOCK_FILE).symlink_to(victim)
    line = _refused(finished, run, capsys, *extra)
    assert f"the lock {run / LOCK_FILE} is a link (to {victim})" in line and f"rm {run / LOCK_FILE}" in line
    assert victim.read_text() == "my data\n" and (run / LOCK_FILE).is_symlink()


def test_a_lock_that_is_a_fifo_is_named(finished, run, capsys):
    os.mkfifo(run / LOCK_FILE)
    line = _refused(finished, run, capsys, "--resume")
    assert f"the lock {run / LOCK_FILE} is a FIFO, not a regular file: remove it (rm {run / LOCK_FILE})" in line


@pytest.mark.parametrize("entry", ["README.md", "logs", "logs/metrics.csv", "checkpoints"])
def test_a_link_where_the_run_writes_is_refused_and_its_target_untouched(finished, run, tmp_path, capsys, entry):
    """A link planted where --resume writes (the model card, the log folder or file, the checkpoints)."""
    target = tmp_path / "elsewhere" / entry.replace("/", "-")
    target.parent.mkdir()
    shutil.move(run / entry, target)
    (run / entry).symlink_to(target)
    outside = tree_digest(target.parent)
    line = _refused(finished, run, capsys, "--resume", "--max-steps", "6")
    assert f"{run / entry} is a link (to {target}), where simcse-weince writes" in line
    assert f"remove the link (rm {run / entry})" in line
    assert tree_digest(target.parent) == outside


def test_overwrite_refuses_to_replace_the_model_it_trains_from(finished, run, capsys):
    """``--model R --output-dir R --overwrite``: the model would be moved aside, then removed at the first
    checkpoint, and the run could never be resumed."""
    line = _refused(finished, run, capsys, "--model", str(run), "--overwrite")
    assert f"--overwrite: {run}, an input of the new run, lies in the folder {run} itself" in line
    assert f"--output-dir {run}-2" in line


def test_a_restart_from_step_0_keeps_the_run_id_and_its_checkpoints_resume(finished, tmp_path):
    """Killed before its first checkpoint, resumed (from step 0) until a checkpoint, resumed again."""
    folder = tmp_path / "run"
    command = cli_command("train", *finished["flags"], "--max-steps", "400", "--save-steps", "0",
                          "--logging-steps", "1", "--output-dir", str(folder))  # fmt: skip
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: logged_steps(folder) >= 1, process, what="a training step")
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    assert not list_checkpoints(folder)
    run_id = json.loads((folder / RUN_MANIFEST).read_text())["run_id"]
    assert _train(finished, folder, "--resume", "--max-steps", "3", "--save-steps", "2") == 0
    assert json.loads((folder / RUN_MANIFEST).read_text())["run_id"] == run_id
    [checkpoint] = list_checkpoints(folder)
    assert json.loads((checkpoint / "trainer_state.json").read_text())["run_id"] == run_id
    assert _train(finished, folder, "--resume", str(checkpoint), "--max-steps", "4") == 0


def test_overwrite_of_a_linked_output_folder_writes_nothing_beside_it(finished, run, tmp_path):
    """The earlier run is moved aside inside the output folder (a rename never crosses file systems), also when
    the output folder is a link to another place."""
    link = tmp_path / "linked" / "R"
    link.parent.mkdir()
    link.symlink_to(run)
    assert _train(finished, link, "--overwrite", "--max-steps", "3") == 0
    assert sorted(os.listdir(link.parent)) == ["R"] and sorted(os.listdir(tmp_path)) == ["linked", "run"]
    assert json.loads((run / "results.json").read_text())["total_steps"] == 3


def test_an_entry_that_cannot_be_moved_makes_overwrite_change_nothing(finished, run, capsys, monkeypatch):
    """One entry cannot move (``chattr +i``, here a rename that fails): those moved before it are put back."""
    real_replace = os.replace

    def replace(source, target):
        if os.path.basename(source) == "logs" and PREVIOUS_RUN in str(target):
            raise PermissionError(1, "Operation not permitted")
        real_replace(source, target)

    monkeypatch.setattr(folder_io.os, "replace", replace)
    line = _refused(finished, run, capsys, "--overwrite")
    assert f"--overwrite: cannot move {run / 'logs'} aside (Operation not permitted); nothing was changed" in line


@pytest.mark.parametrize("spelling", [".", "../run/"])
def test_another_spelling_of_the_folder_is_the_same_folder(finished, run, capsys, caplog, monkeypatch, spelling):
    """``cd R; --output-dir . --resume`` (and ``../R/``) continues R, without a warning that the folder differs."""
    (run.parent / "elsewhere").mkdir()
    monkeypatch.chdir(run if spelling == "." else run.parent / "elsewhere")
    caplog.set_level("WARNING", logger="simcse_weince")
    assert _train(finished, spelling, "--resume", "--max-steps", "6") == 0
    assert "output_dir" not in caplog.text
    results = json.loads((run / "results.json").read_text())
    assert results["total_steps"] == 6 and results["resumed_from_step"] == 4


def test_the_lock_is_not_kept_by_a_forked_child_of_a_killed_run(tmp_path):
    """A loader worker (a forked child) outlives its killed parent: the folder is free all the same."""
    code = (
        "import os, sys, time; from simcse_weince.training.run_folder import OutputLock; "
        "OutputLock(sys.argv[1]).acquire(); child = os.fork(); "
        "(time.sleep(60), os._exit(0)) if child == 0 else (print(child, flush=True), os.kill(os.getpid(), 9))"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())  # fmt: skip
    child = int(holder.stdout.readline())
    holder.wait()
    try:
        os.kill(child, 0)  # the child still runs
        OutputLock(tmp_path).acquire().release()
    finally:
        os.kill(child, signal.SIGKILL)


def test_another_hosts_lock_is_refused_never_taken_over(finished, run, capsys):
    lock = {"pid": 4242, "host": "elsewhere.example", "started": "2026-01-01 00:00:00 UTC", "command": "train"}
    (run / LOCK_FILE).write_text(json.dumps(lock))
    line = _refused(finished, run, capsys, "--resume")
    assert "holds the lock of pid 4242 on elsewhere.example" in line
    assert f"if that run has ended, delete the lock (rm {run / LOCK_FILE})" in line


def test_resume_compares_with_the_checkpoints_settings_not_the_edited_config(finished, run, capsys):
    """training_config.yaml edited (batch 16, seed 99, learning rate 0.5), then ``--resume``."""
    path = run / "training_config.yaml"
    config = yaml.safe_load(path.read_text())
    record = json.loads((list_checkpoints(run)[0] / "trainer_state.json").read_text())["settings"]
    config.update(batch_size=16, seed=99, learning_rate=0.5)
    path.write_text(yaml.safe_dump(config))
    before = tree_digest(run)
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "6"]) == 1
    line = _error_line(capsys)
    assert tree_digest(run) == before
    assert f"batch_size: {record['batch_size']} != 16" in line and f"seed: {record['seed']} != 99" in line
    assert f"learning_rate: {record['learning_rate']} != 0.5" in line and "start a new run" in line


def test_a_checkpoint_of_another_run_is_refused_without_the_manifest(finished, run, capsys):
    """Another run's checkpoint copied into the folder, ``run_files.json`` deleted: the id heading
    training_config.yaml still names the folder's run."""
    run_id = json.loads((run / RUN_MANIFEST).read_text())["run_id"]
    foreign = run / "checkpoints" / "step-0000009"
    shutil.copytree(list_checkpoints(run)[0], foreign)
    state = json.loads((foreign / "trainer_state.json").read_text())
    (foreign / "trainer_state.json").write_text(json.dumps({**state, "run_id": "0ther"}))
    write_manifest(foreign)
    (run / RUN_MANIFEST).unlink()
    line = _refused(finished, run, capsys, "--resume")
    assert f"checkpoint {foreign} was saved by run 0ther, but {run} holds run {run_id}" in line
    assert f"rm -r {foreign}" in line


def test_overwrite_with_an_unreadable_manifest_says_what_to_do_and_that_works(finished, run, capsys):
    (run / RUN_MANIFEST).write_text("{")
    line = _refused(finished, run, capsys, "--overwrite")
    assert f"delete it (rm {run / RUN_MANIFEST}) to let --overwrite treat the folder as an earlier release" in line
    (run / RUN_MANIFEST).unlink()
    assert _train(finished, run, "--overwrite", "--max-steps", "3") == 0


def test_a_stopped_overwrite_start_is_put_back_whenever_it_was_killed(run, monkeypatch):
    """An --overwrite start killed after k of its moves (or after all, once it wrote its own manifest, config and
    logs), and its restore killed after some moves back: the next start puts the earlier run back byte for byte."""
    before = tree_digest(run)
    names = sorted(name for name in run_files(run) if (run / name).exists())
    real_move = folder_io.move

    def killed_after(limit):
        moves = []

        def move(output_dir, source, target):
            if len(moves) == limit:
                raise KeyboardInterrupt  # stands for the kill
            moves.append(source)
            real_move(output_dir, source, target)

        return move

    for kill_at in range(len(names) + 1):
        for restore_kill_at in (None, kill_at // 2) if kill_at else (None,):
            monkeypatch.setattr("simcse_weince.training.folder_io.move", killed_after(kill_at))
            try:
                _move_aside(run, names, "newrun")
                for name in (RUN_MANIFEST, "training_config.yaml", "logs/metrics.csv"):  # the new run's claim
                    (run / name).parent.mkdir(exist_ok=True)
                    (run / name).write_text("the new run's")
            except KeyboardInterrupt:
                pass
            if restore_kill_at is not None:
                monkeypatch.setattr("simcse_weince.training.folder_io.move", killed_after(restore_kill_at))
                with pytest.raises(KeyboardInterrupt):
                    settle_previous_run(run)
            monkeypatch.setattr("simcse_weince.training.folder_io.move", real_move)
            settle_previous_run(run)
            assert tree_digest(run) == before, (kill_at, restore_kill_at)


def test_resume_after_a_stopped_overwrite_continues_the_run_it_replaced(finished, run):
    """An --overwrite start with another seed, killed before its first checkpoint (its manifest and config written),
    then ``--resume`` with no other flag: the earlier run is put back and continued with its own settings."""
    names = sorted(name for name in run_files(run) if (run / name).exists())
    _move_aside(run, names, "0123abcd")
    (run / RUN_MANIFEST).write_text(json.dumps({"format": 1, "run_id": "0123abcd", "files": {}}))
    config = yaml.safe_load((run / PREVIOUS_RUN / "training_config.yaml").read_text())
    (run / "training_config.yaml").write_text("# run_id: 0123abcd\n" + yaml.safe_dump({**config, "seed": 1}))
    assert main(["train", "--output-dir", str(run), "--resume", "--max-steps", "6"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["resumed_from_step"] == 4 and results["config"]["seed"] == config["seed"]
    assert not (run / PREVIOUS_RUN).exists()


def test_exporting_again_never_removes_a_file_put_in_an_export_folder(finished, run, capsys):
    """A file put inside an export folder (``R/1_Pooling/sub/.env``), then ``--resume`` that exports again: refused
    naming the file, which stays."""
    planted = run / "1_Pooling" / "sub" / ".env"
    planted.parent.mkdir()
    planted.write_text("TOKEN=mine\n")
    assert _train(finished, run, "--resume", "--max-steps", "6") == 1
    line = _error_line(capsys)
    assert f"{planted} was not written by the export of {run}" in line and "--resume to export" in line
    assert planted.read_text() == "TOKEN=mine\n"
