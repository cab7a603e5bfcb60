"""A run folder knows its files, its run and its writer (issue 54, classes 1, 2, 7 and 12).

* ``--overwrite`` moves aside only what the earlier run wrote (its ``run_files.json``): a user's note and the new
  run's own training file stay; a user's file where the new run writes is refused by name.
* ``--resume PATH`` continues only a checkpoint of the folder's own run (its ``run_id``, drawn at step 0), named
  with both runs otherwise, before anything is written.
* ``push`` uploads exactly the export (class 12): the files the manifest records as ``export``, not a partial
  ``.export.tmp``, checkpoints, logs or the user's files; a link in the export is refused.
* One process writes a folder: a second is refused, naming the first (pid, host, start time); a lock left by a
  process that has ended is taken over with a warning.

Each case runs a real tiny model on the CLI, in this process (a second process only holds the lock).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import make_tiny_model, subprocess_env, tree_digest, write_train_file

from simcse_weince.cli import main
from simcse_weince.training.checkpoints import list_checkpoints
from simcse_weince.training.run_folder import LOCK_FILE, RUN_MANIFEST


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A finished 5-step run (checkpoints at steps 2 and 4) and its flags."""
    root = tmp_path_factory.mktemp("run_folders")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=120)
    flags = [
        "--model", str(model), "--batch-size", "8", "--max-steps", "5", "--save-steps", "2",
        "--save-total-limit", "2", "--eval-steps", "0", "--final-evaluation", "false", "--report-to", "csv",
        "--max-length", "16", "--eval-max-length", "16", "--learning-rate", "1e-3",
    ]  # fmt: skip
    run = root / "run"
    assert main(["train", *flags, "--train-file", str(train_file), "--output-dir", str(run)]) == 0
    return {"root": root, "run": run, "flags": flags, "train_file": train_file}


def _copy(finished, tmp_path, name="run"):
    copy = tmp_path / name
    shutil.copytree(finished["run"], copy)
    return copy


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def test_the_manifest_lists_what_the_run_wrote_and_its_id(finished):
    manifest = json.loads((finished["run"] / RUN_MANIFEST).read_text())
    files = manifest["files"]
    run_entries = {name for name, kind in files.items() if kind == "run"}
    export_entries = {name for name, kind in files.items() if kind == "export"}
    assert {"training_config.yaml", "checkpoints", "logs", ".export.tmp"} <= run_entries
    assert {"model.safetensors", "modules.json", "README.md", "results.json"} <= export_entries
    on_disk = {path.name for path in finished["run"].iterdir()} - {RUN_MANIFEST}
    assert on_disk <= set(files), on_disk - set(files)
    assert not (finished["run"] / LOCK_FILE).exists(), "the lock outlived the run"
    for checkpoint in list_checkpoints(finished["run"]):  # every checkpoint carries the run's id
        assert json.loads((checkpoint / "trainer_state.json").read_text())["run_id"] == manifest["run_id"]


def test_overwrite_keeps_the_users_files_and_the_new_runs_training_file_and_takes_over_a_stale_lock(
    finished, tmp_path, caplog
):
    """Issue 54 case 1 as written (``--train-file R/mydata.txt --output-dir R --overwrite``), in a folder whose
    lock was left by a process that was killed (case 7: a stale lock does not block)."""
    run = _copy(finished, tmp_path)
    mydata = run / "mydata.txt"
    shutil.copy(finished["train_file"], mydata)
    (run / "NOTES.md").write_text("my notes\n")
    (run / "plots").mkdir()
    (run / "plots" / "mine.png").write_bytes(b"png")
    holder = _hold_lock(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    before = {name: (run / name).read_bytes() for name in ("mydata.txt", "NOTES.md", "plots/mine.png")}
    old_manifest = json.loads((run / RUN_MANIFEST).read_text())
    caplog.set_level("WARNING", logger="simcse_weince")
    code = main(["train", *finished["flags"], "--train-file", str(mydata), "--output-dir", str(run), "--overwrite",
                 "--max-steps", "3"])  # fmt: skip
    assert code == 0
    assert {name: (run / name).read_bytes() for name in before} == before
    results = json.loads((run / "results.json").read_text())
    assert results["train_file"] == str(mydata) and results["total_steps"] == 3
    manifest = json.loads((run / RUN_MANIFEST).read_text())
    assert manifest["run_id"] != old_manifest["run_id"]
    assert not {"mydata.txt", "NOTES.md", "plots"} & set(manifest["files"])
    assert not (run / ".simcse-weince.previous-run").exists() and not (run / LOCK_FILE).exists()
    assert f"pid {holder.pid} on {socket.gethostname()}" in caplog.text and "has ended" in caplog.text
    assert "left what it did not write: NOTES.md, mydata.txt, plots" in caplog.text
    # the run can be continued: its training file is where results.json says
    assert main(["train", *finished["flags"], "--train-file", str(mydata), "--output-dir", str(run), "--resume",
                 "--max-steps", "4"]) == 0  # fmt: skip


def test_overwrite_refuses_a_file_it_did_not_write_where_the_new_run_writes(finished, tmp_path, capsys):
    run = _copy(finished, tmp_path)
    manifest = json.loads((run / RUN_MANIFEST).read_text())
    del manifest["files"]["README.md"]  # the user's own README.md, not the run's card
    (run / RUN_MANIFEST).write_text(json.dumps(manifest))
    before = tree_digest(run)
    code = main(["train", *finished["flags"], "--train-file", str(finished["train_file"]), "--output-dir", str(run),
                 "--overwrite"])  # fmt: skip
    assert code == 1
    line = _error_line(capsys)
    assert f"the run in {run} did not write {run / 'README.md'}, where the new run writes" in line
    assert "move it elsewhere" in line
    assert tree_digest(run) == before


def test_resume_refuses_a_checkpoint_of_another_output_folder_naming_both(finished, tmp_path, capsys):
    """Issue 54 case 2: ``--output-dir A --resume B/checkpoints/step-N`` once continued B's run in A."""
    run_a, run_b = _copy(finished, tmp_path, "a"), _copy(finished, tmp_path, "b")
    manifest = json.loads((run_b / RUN_MANIFEST).read_text())
    manifest["run_id"] = "another-run"
    (run_b / RUN_MANIFEST).write_text(json.dumps(manifest))
    before = tree_digest(run_a)
    checkpoint = list_checkpoints(run_b)[0]
    code = main(["train", *finished["flags"], "--train-file", str(finished["train_file"]), "--output-dir",
                 str(run_a), "--resume", str(checkpoint)])  # fmt: skip
    assert code == 1
    line = _error_line(capsys)
    run_id = json.loads((checkpoint / "trainer_state.json").read_text())["run_id"]
    assert f"checkpoint {checkpoint} belongs to the run in {run_b} (run {run_id}), not to the run in {run_a}" in line
    assert f"--output-dir {run_b} --resume" in line
    assert tree_digest(run_a) == before


@pytest.mark.parametrize("how", ["named", "latest"])
def test_resume_refuses_a_checkpoint_saved_by_another_run(finished, tmp_path, capsys, how):
    """A checkpoint in the folder whose run id is not the folder's (copied in from another run)."""
    run = _copy(finished, tmp_path)
    manifest = json.loads((run / RUN_MANIFEST).read_text())
    folder_run, manifest["run_id"] = manifest["run_id"], "0123456789abcdef"
    (run / RUN_MANIFEST).write_text(json.dumps(manifest))
    before = tree_digest(run)
    checkpoint = list_checkpoints(run)[0]
    resume = [str(checkpoint)] if how == "named" else []
    code = main(["train", *finished["flags"], "--train-file", str(finished["train_file"]), "--output-dir", str(run),
                 "--resume", *resume])  # fmt: skip
    assert code == 1
    line = _error_line(capsys)
    assert f"checkpoint {checkpoint} was saved by run {folder_run}, but {run} holds run 0123456789abcdef" in line
    assert tree_digest(run) == before


def _hold_lock(*folders):
    """A second process that holds the lock of each folder (as a running ``train`` does) until it is stopped."""
    code = (
        "import sys; from pathlib import Path; from simcse_weince.training.run_folder import OutputLock; "
        "locks = [OutputLock(Path(folder)).acquire() for folder in sys.argv[1:]]; print('held', flush=True); "
        "sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, *map(str, folders)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=subprocess_env())  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_naming_the_first(finished, tmp_path, capsys):
    """Issue 54 case 7: two processes on one --output-dir once both started; the second is now refused before it
    writes anything, whether it resumes, overwrites or starts in a new folder."""
    run, new = _copy(finished, tmp_path), tmp_path / "new" / "run"
    holder = _hold_lock(run, new)
    try:
        for folder, extra in ((run, ["--resume"]), (run, ["--overwrite"]), (new, [])):
            before = tree_digest(folder)
            code = main(["train", *finished["flags"], "--train-file", str(finished["train_file"]), "--output-dir",
                         str(folder), *extra])  # fmt: skip
            assert code == 1, extra
            line = _error_line(capsys)
            holder_named = f"pid {holder.pid} on {socket.gethostname()}, started "
            assert f"output directory {folder} is in use by another run ({holder_named}" in line
            assert tree_digest(folder) == before and (folder / LOCK_FILE).is_file()
    finally:
        holder.stdin.close()
        holder.wait()


def test_push_uploads_exactly_the_export_and_never_prints_the_token(finished, tmp_path, monkeypatch, capsys):
    """``simcse-weince push`` against a local stand-in for HfApi that records the commit's files. Issue 54 case 12:
    a stale partial export (``.export.tmp/``), the run's checkpoints and logs and the user's own files stay home,
    and a file of the export replaced by a link to a file outside the run is refused, not uploaded."""
    import huggingface_hub

    from simcse_weince.cli import main

    folder = _copy(finished, tmp_path)
    assert (folder / "checkpoints").is_dir()  # the run kept checkpoints: they must stay home
    (folder / ".export.tmp").mkdir()
    (folder / ".export.tmp" / "model.safetensors").write_bytes(b"half a model")  # a killed export's leftover
    (folder / "NOTES.md").write_text("my notes\n")
    calls = {}

    class LocalHub:  # records what HfApi would be asked to do
        def __init__(self, token=None, **kwargs):
            calls["token"] = token

        def create_repo(self, repo_id, **kwargs):
            calls["create_repo"] = (repo_id, kwargs)

        def create_commit(self, *, repo_id, operations, **kwargs):
            calls["uploaded"] = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
            return huggingface_hub.CommitInfo(
                commit_url=f"https://huggingface.co/{repo_id}/commit/abc123", commit_message="m",
                commit_description="", oid="abc123",
            )  # fmt: skip

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub, "HfApi", LocalHub)
    secret = "hf_not_a_real_token_0123456789"
    assert main(["push", str(folder), "me/simcse-tiny", "--token", secret, "--private"]) == 0
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
    assert "pushed" in captured.out and "https://huggingface.co/me/simcse-tiny/commit/abc123" in captured.out
    assert calls["token"] == secret and calls["create_repo"] == (
        "me/simcse-tiny",
        {"private": True, "exist_ok": True, "repo_type": "model"},
    )
    uploaded = calls["uploaded"]
    model_files = {
        path.relative_to(finished["run"]).as_posix()
        for path in finished["run"].rglob("*")
        if path.is_file() and path.relative_to(finished["run"]).parts[0] not in ("checkpoints", "logs")
    } - {"training_config.yaml", "run_files.json", "export_files.json"}
    assert set(uploaded) == model_files  # every file of the export, nothing else
    assert {"modules.json", "model.safetensors", "README.md", "results.json", "1_Pooling/config.json"} <= set(uploaded)
    assert uploaded["model.safetensors"] == (folder / "model.safetensors").read_bytes()

    outside = tmp_path / "secret.txt"
    outside.write_text("not the run's")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(outside)
    calls.clear()
    assert main(["push", str(folder), "me/simcse-tiny", "--token", secret]) == 1
    error = capsys.readouterr().err
    assert f"{folder / 'tokenizer.json'} is a symbolic link (to {outside})" in error and "uploaded" not in calls
