"""A run folder is not trusted (issue 24, part A): nothing in it is unpickled, a failed write (full disk) ends in one
line and loses neither the earlier checkpoint nor the last step, and a resume whose RNG state does not restore
stops (or falls back to an intact checkpoint) instead of continuing on other random numbers.

Each case runs a real tiny model; the full disk is a real one (a small tmpfs) where the test may mount it, and a
writer raising ``OSError(ENOSPC)`` mid-file everywhere.
"""

from __future__ import annotations

import errno
import json
import logging
import pathlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from train_helpers import copy_run, make_tiny_model, resume_run, tree_digest, write_train_file

from simcse_weince.cli import main
from simcse_weince.settings import apply_overrides, load_config
from simcse_weince.text.config import TrainConfig
from simcse_weince.training.checkpoints import list_checkpoints, verify_checkpoint, write_manifest

STEPS = 5  # checkpoints at steps 2 and 4 (save_total_limit 2)


class Payload:
    """Unpickling this creates ``marker``: the stand-in for arbitrary code in a crafted checkpoint file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def plant_payload(path: Path, marker: Path) -> None:
    torch.save({"state": Payload(marker)}, path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A finished 5-step text run (checkpoints at steps 2 and 4) and its flags."""
    root = tmp_path_factory.mktemp("trust")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=120)
    flags = [
        "--model", str(model), "--train-file", str(train_file), "--batch-size", "8", "--max-steps", str(STEPS),
        "--save-steps", "2", "--save-total-limit", "2", "--eval-steps", "0", "--final-evaluation", "false",
        "--report-to", "csv", "--max-length", "16", "--eval-max-length", "16", "--learning-rate", "1e-3",
    ]  # fmt: skip
    run = root / "run"
    assert main(["train", *flags, "--output-dir", str(run)]) == 0
    from safetensors.torch import load_file

    return {
        "root": root,
        "run": run,
        "flags": flags,
        "history": json.loads((run / "results.json").read_text())["history"],
        "weights": load_file(str(run / "model.safetensors")),
    }


def _error_line(capsys) -> str:
    """The one error line on stderr (from its start: a progress bar may end without a newline before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    [line] = [line for line in err.splitlines() if "error:" in line]
    return line[line.index("simcse-weince ") :]


def _losses(history) -> list[float]:
    return [entry["loss"] for entry in history]


def test_the_payload_runs_code_when_unpickled(tmp_path):
    """The control: the crafted file of the tests below does run code under a plain unpickling."""
    marker = tmp_path / "ran"
    plant_payload(tmp_path / "extra.pt", marker)
    torch.load(tmp_path / "extra.pt", weights_only=False)
    assert marker.exists()


# ------------------------------------------------------------------------- 1. no unpickling of run-folder files


def test_a_checkpoint_without_manifest_is_never_loaded(finished, tmp_path, caplog):
    """A checkpoint without a manifest cannot be verified and is not loaded: the crafted extra.pt in it never runs;
    the resume falls back to the intact older checkpoint and says why."""
    run = copy_run(finished["run"], tmp_path)
    checkpoint = run / "checkpoints" / "step-0000004"
    (checkpoint / "manifest.json").unlink()
    marker = tmp_path / "ran"
    plant_payload(checkpoint / "extra.pt", marker)
    with caplog.at_level(logging.WARNING, logger="simcse_weince"):
        results = resume_run(run)
    assert not marker.exists()
    warnings = " ".join(record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING)
    assert f"{checkpoint / 'manifest.json'} is missing" in warnings
    assert results["resumed_from_step"] == 2
    assert _losses(results["history"]) == pytest.approx(_losses(finished["history"]), abs=1e-6)


def test_a_crafted_file_listed_in_the_newest_manifest_stops_in_one_line(finished, tmp_path, capsys):
    run = copy_run(finished["run"], tmp_path)
    marker, checkpoint = tmp_path / "ran", run / "checkpoints" / "step-0000004"
    plant_payload(checkpoint / "extra.pt", marker)
    write_manifest(checkpoint)
    assert main(["train", *finished["flags"], "--output-dir", str(run), "--resume"]) == 1
    line = _error_line(capsys)
    assert not marker.exists()
    assert f"{checkpoint}/extra.pt holds a pickled Python object (" in line, line


def test_a_compare_rerun_of_an_unfinished_cell_never_unpickles_it(finished, tmp_path):
    """compare resumes a cell without results.json: the same refusal."""
    from simcse_weince.text.cells import run_cell

    run = copy_run(finished["run"], tmp_path)
    (run / "results.json").unlink()
    marker = tmp_path / "ran"
    for checkpoint in list_checkpoints(run):
        plant_payload(checkpoint / "extra.pt", marker)
        write_manifest(checkpoint)
    config = apply_overrides(load_config(TrainConfig, run / "training_config.yaml"), {"output_dir": str(run)})
    with pytest.raises(ValueError, match="holds a pickled Python object"):
        run_cell(config)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin", "random_states_0.pkl"])
def test_a_crafted_checkpoint_file_with_a_matching_manifest_is_refused(finished, tmp_path, capsys, name):
    """A manifest proves integrity, not origin: a crafted file listed in it is still read as tensors only."""
    run = copy_run(finished["run"], tmp_path)
    marker, checkpoint = tmp_path / "ran", run / "checkpoints" / "step-0000004"
    plant_payload(checkpoint / name, marker)
    write_manifest(checkpoint)
    assert main(["train", *finished["flags"], "--output-dir", str(run), "--resume", str(checkpoint)]) == 1
    line = _error_line(capsys)
    assert not marker.exists()
    assert f"{checkpoint / name} holds a pickled Python object" in line and "refused unread" in line, line


def test_vision_resume_never_unpickles_the_extra_terms_state(tmp_path, capsys):
    """Accelerate loads a registered object's state (the extra terms' EMA) with weights_only=False: the
    crafted file must be refused before it gets there."""
    pytest.importorskip("torchvision")
    run = tmp_path / "vision"
    flags = [
        "vision", "train", "--dataset", "fake", "--backbone", "resnet18", "--image-size", "16", "--batch-size", "8",
        "--train-size", "16", "--max-steps", "2", "--save-steps", "1", "--extra-terms", "true",
        "--mixed-precision", "no", "--report-to", "csv", "--output-dir", str(run),
    ]  # fmt: skip
    assert main(flags) == 0
    checkpoint = run / "checkpoints" / "step-0000002"
    custom = checkpoint / "custom_checkpoint_0.pkl"
    assert custom.is_file()
    marker = tmp_path / "ran"
    plant_payload(custom, marker)
    write_manifest(checkpoint)
    capsys.readouterr()
    assert main([*flags, "--resume", str(checkpoint)]) == 1
    line = _error_line(capsys)
    assert not marker.exists()
    assert f"{custom} holds a pickled Python object" in line, line


def test_a_crafted_imagenet32_batch_is_refused_before_anything_in_it_runs(tmp_path, capsys):
    """Issue 39: ImageNet-32's batches are pickles by their format; a crafted one given to the vision trainer is
    refused by the allow-list reader, in one line naming the file, and its payload never runs."""
    import pickle

    pytest.importorskip("torchvision")
    marker = tmp_path / "ran"
    folder = tmp_path / "data" / "imagenet32" / "train"
    folder.mkdir(parents=True)
    batch = folder / "train_data_batch_1"
    with open(batch, "wb") as handle:
        pickle.dump({"data": Payload(marker), "labels": [1]}, handle)
    flags = ["vision", "train", "--dataset", "imagenet32", "--data-dir", str(tmp_path / "data"), "--max-steps", "1",
             "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(flags) == 1
    line = _error_line(capsys)
    assert not marker.exists()
    assert f"{batch} holds a pickled Python object (pathlib.Path.touch)" in line, line
    assert "weights_only=False" not in line and "refused unread" in line


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_a_model_folder_with_a_crafted_pickle_is_refused_in_one_line(finished, tmp_path, capsys, command):
    """Issue 39: transformers' own refusal (torch's message) suggests weights_only=False; ours names the file."""
    from safetensors.torch import load_file

    model = tmp_path / "received-model"
    shutil.copytree(finished["root"] / "tiny", model)
    marker = tmp_path / "ran"
    state = load_file(str(model / "model.safetensors"))
    torch.save({**state, "extra": Payload(marker)}, model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    if command == "train":
        flags = ["train", *finished["flags"], "--output-dir", str(tmp_path / "run")]
        flags[flags.index("--model") + 1] = str(model)
    else:
        flags = ["evaluate", str(model), "--pooler", "cls"]
    assert main(flags) == 1
    line = _error_line(capsys)
    assert not marker.exists() and not (tmp_path / "run").exists()
    assert f"{model / 'pytorch_model.bin'} holds a pickled Python object" in line, line
    assert "weights_only" not in line and "Traceback" not in line


def test_no_module_but_the_safe_reader_unpickles():
    """Issue 39: the allow-list reader is the only caller of pickle.load / torch.load in the package."""
    import ast

    package = Path(__file__).resolve().parents[1] / "simcse_weince"
    callers = []
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = f"{getattr(owner, 'id', getattr(owner, 'attr', '?'))}.{node.func.attr}"
                if name in {"pickle.load", "pickle.loads", "torch.load", "pickle.Unpickler"}:
                    callers.append(f"{source.relative_to(package)}:{node.lineno} {name}")
    assert callers == ["safe_load.py:" + callers[0].split(":")[1]] and "torch.load" in callers[0], callers


# ------------------------------------------------------------------------ 3b. --resume continues the same run


def test_resume_refuses_training_data_that_changed_since_the_run_started(finished, tmp_path, capsys):
    """Issue 39: after a kill, replacing the training file's content and resuming trained on the new content."""
    run = copy_run(finished["run"], tmp_path)
    train_file = finished["root"] / "train.txt"
    original = train_file.read_bytes()
    before = tree_digest(run)
    try:
        train_file.write_bytes(original.replace(b"a", b"e", 1))  # the same size: only the hash sees it
        assert main(["train", *finished["flags"], "--output-dir", str(run), "--resume"]) == 1
    finally:
        train_file.write_bytes(original)
    line = _error_line(capsys)
    assert "--resume: the training data changed since the run started" in line and str(train_file) in line, line
    assert tree_digest(run) == before


@pytest.mark.parametrize(
    ("flags", "difference"),
    [(["--batch-size", "4"], "batch_size: 8 != 4"), (["--learning-rate", "2e-3"], "learning_rate: 0.001 != 0.002"),
     (["--train-file", "{triplets}"], "train_file: {train} != {triplets}")],
    ids=["batch-size", "learning-rate", "triplet-file"],
)  # fmt: skip
def test_resume_refuses_settings_that_define_the_run_and_names_what_may_change(
    finished, tmp_path, capsys, flags, difference
):
    run = copy_run(finished["run"], tmp_path)
    triplets = tmp_path / "triplets.csv"
    triplets.write_text("sent0,sent1,hard_neg\n" + "a b,c d,e f\n" * 40)
    names = {"triplets": str(triplets), "train": str(finished["root"] / "train.txt")}
    before = tree_digest(run)
    argv = ["train", *finished["flags"], "--output-dir", str(run), "--resume", *[f.format(**names) for f in flags]]
    assert main(argv) == 1
    line = _error_line(capsys)
    assert difference.format(**names) in line and "only --data-dir" in line and "--max-steps" in line, line
    assert "start a new run (another --output-dir, or --overwrite)" in line
    assert tree_digest(run) == before


def test_resume_may_extend_max_steps(finished, tmp_path, caplog):
    run = copy_run(finished["run"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="simcse_weince"):
        assert main(["train", *finished["flags"], "--output-dir", str(run), "--resume", "--max-steps", "7"]) == 0
    assert "differ from the saved run: max_steps" in caplog.text
    results = json.loads((run / "results.json").read_text())
    assert [entry["step"] for entry in results["history"]] == list(range(1, 8))
    assert _losses(results["history"])[:4] == _losses(finished["history"])[:4]  # steps 1-4 are the run's own


# ------------------------------------------------------------------------------ 4. a failed write (full disk)


def _enospc_on(monkeypatch, fragment: str):
    """torch.save writes half of the file, then the disk is full, for paths containing ``fragment``."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if fragment in str(f):
            Path(f).write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_a_full_disk_during_a_checkpoint_ends_in_one_line_and_keeps_the_earlier_one(
    finished, tmp_path, capsys, monkeypatch
):
    run = tmp_path / "run"
    _enospc_on(monkeypatch, "step-0000004.tmp/optimizer.bin")
    assert main(["train", *finished["flags"], "--output-dir", str(run)]) == 1
    line = _error_line(capsys)
    earlier = run / "checkpoints" / "step-0000002"
    assert line == (
        f"simcse-weince train: error: cannot write {run}/checkpoints/step-0000004: No space left on device; the "
        f"partial copy is removed and the newest checkpoint, {earlier}, is untouched: free space, then continue "
        f"with --resume"
    )
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert list_checkpoints(run) == [earlier] and verify_checkpoint(earlier) == []
    monkeypatch.undo()  # space again: the resume continues the uninterrupted run exactly
    results = resume_run(run)
    assert results["resumed_from_step"] == 2
    assert _losses(results["history"]) == pytest.approx(_losses(finished["history"]), abs=1e-6)


def test_a_full_disk_during_the_export_keeps_the_last_step_in_a_checkpoint(finished, tmp_path, capsys, monkeypatch):
    from safetensors.torch import load_file

    from simcse_weince.text.model import SimCSEModel

    run = tmp_path / "run"
    real_export = SimCSEModel.save_sentence_transformer

    def export_until_full(self, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"\0" * 4096)  # half a file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SimCSEModel, "save_sentence_transformer", export_until_full)
    assert main(["train", *finished["flags"], "--output-dir", str(run)]) == 1
    line = _error_line(capsys)
    last = run / "checkpoints" / f"step-{STEPS:07d}"
    assert line == (
        f"simcse-weince train: error: cannot write {run}: No space left on device; the partial export is removed; "
        f"the last step's weights are in {last}: free space, then run the same command with --resume to export"
    )
    assert not (run / ".export.tmp").exists() and not (run / "model.safetensors").exists()
    assert verify_checkpoint(last) == [] and json.loads((last / "trainer_state.json").read_text())["step"] == STEPS
    monkeypatch.setattr(SimCSEModel, "save_sentence_transformer", real_export)
    capsys.readouterr()
    assert main(["train", *finished["flags"], "--output-dir", str(run), "--resume"]) == 0
    # only exported: the same model as the uninterrupted run's, and the last step's checkpoint is gone again
    results = json.loads((run / "results.json").read_text())
    assert results["resumed_from_step"] == STEPS
    assert _losses(results["history"]) == pytest.approx(_losses(finished["history"]), abs=1e-6)
    exported = load_file(str(run / "model.safetensors"))
    assert exported.keys() == finished["weights"].keys()
    assert all(torch.equal(exported[name], finished["weights"][name]) for name in exported)
    assert [path.name for path in list_checkpoints(run)] == ["step-0000004", "step-0000002"]


@pytest.fixture()
def small_disk(tmp_path):
    """A real file system of a given size (tmpfs; needs root), grown with ``grow()``; skips where not allowed."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()

    def mount(size: str):
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                                capture_output=True, text=True)  # fmt: skip
        if result.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()[:100]})")
        return mount_point

    def grow(size: str):
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)

    mount.grow = grow
    yield mount
    subprocess.run(["umount", str(mount_point)], capture_output=True)


def test_a_really_full_disk_names_the_cause_torch_does_not(finished, small_disk, capsys):
    """torch's own message for a full disk is "[enforce fail at inline_container.cc:672] . unexpected pos ...":
    the line says "No space left on device" instead, and the run continues once there is space."""
    disk = small_disk("18m")  # the run and its step-2 checkpoint (12 MB) fit; the step-4 one does not
    run = disk / "run"
    assert main(["train", *finished["flags"], "--output-dir", str(run), "--save-total-limit", "1"]) == 1
    line = _error_line(capsys)
    earlier = run / "checkpoints" / "step-0000002"
    assert f"cannot write {run}/checkpoints/step-0000004: No space left on device;" in line, line
    assert f"the newest checkpoint, {earlier}, is untouched" in line and "unexpected pos" not in line
    assert not list((run / "checkpoints").glob("*.tmp")) and verify_checkpoint(earlier) == []
    small_disk.grow("64m")
    results = resume_run(run)
    assert results["resumed_from_step"] == 2
    assert _losses(results["history"]) == pytest.approx(_losses(finished["history"]), abs=1e-6)


def test_a_really_full_disk_during_the_export_loses_no_step(finished, small_disk, capsys):
    disk = small_disk("16m")  # the last step's checkpoint (12 MB) fits, the exported model beside it does not
    run = disk / "run"
    assert main(["train", *finished["flags"], "--output-dir", str(run), "--save-steps", "0"]) == 1
    line = _error_line(capsys)
    last = run / "checkpoints" / f"step-{STEPS:07d}"
    assert f"cannot write {run}: No space left on device; the partial export is removed" in line, line
    assert f"the last step's weights are in {last}" in line
    assert not (run / ".export.tmp").exists() and verify_checkpoint(last) == []
    small_disk.grow("64m")
    results = resume_run(run)
    assert results["resumed_from_step"] == STEPS
    assert _losses(results["history"]) == pytest.approx(_losses(finished["history"]), abs=1e-6)
    assert (run / "model.safetensors").is_file() and not list_checkpoints(run)


# --------------------------------------------------------------------------------- 6. an RNG state that fails


def _damage_rng(path: Path, how: str) -> None:
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
        return
    states = torch.load(path, weights_only=False)  # our own file, written by the fixture's run
    if how == "numpy-state-cut-short":
        name, keys, *rest = states["numpy_random_seed"]
        states["numpy_random_seed"] = (name, keys[:100], *rest)
    else:  # "no-torch-state"
        del states["torch_manual_seed"]
    torch.save(states, path)


RNG_DAMAGES = ["truncated", "numpy-state-cut-short", "no-torch-state"]


@pytest.mark.parametrize("how", RNG_DAMAGES)
@pytest.mark.parametrize("resume", ["latest", "named"])
def test_a_damaged_rng_state_behind_a_rewritten_manifest_stops_in_one_line(finished, tmp_path, capsys, how, resume):
    """The manifest matches the damaged RNG state (rewritten): the state is checked where it is set, and the resume
    stops, naming the file and the earlier checkpoint to resume from, before a step runs on other random numbers."""
    run = copy_run(finished["run"], tmp_path)
    checkpoint = run / "checkpoints" / "step-0000004"
    damaged = checkpoint / "random_states_0.pkl"
    _damage_rng(damaged, how)
    write_manifest(checkpoint)  # the hashes match the damaged file
    before = tree_digest(run)
    flag = ["--resume", str(checkpoint)] if resume == "named" else ["--resume"]
    assert main(["train", *finished["flags"], "--output-dir", str(run), *flag]) == 1
    line = _error_line(capsys)
    assert f"checkpoint {checkpoint} cannot be used: {damaged}" in line, line
    assert f"resume from an earlier one (--resume {run / 'checkpoints' / 'step-0000002'})" in line, line
    assert tree_digest(run) == before
