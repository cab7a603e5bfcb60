"""SIGTERM (what Slurm, Kubernetes and ``timeout`` send) is handled as Ctrl-C in every long command: the step
finishes, a checkpoint is saved, the message says how to resume, and the exit code is 143 (128 + 15); the resumed
run continues from that step. The Ctrl-C (SIGINT, 130) side is in test_train_resume.py and test_vision_resume.py."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from train_helpers import cli_command, logged_steps, make_tiny_model, subprocess_env, wait_for, write_train_file

from simcse_weince.cli import main

STEPS = 60  # long enough that the run is still training when the signal lands (a tiny step takes ~20 ms)


@pytest.fixture(scope="module")
def text_setup(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("signals")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=200)
    # --save-steps 0: no periodic checkpoint at all, so the one found afterwards is the signal's
    flags = [
        "--model", str(model), "--train-file", str(train_file), "--pooler", "cls", "--batch-size", "16",
        "--max-steps", str(STEPS), "--eval-steps", "0", "--save-steps", "0", "--final-evaluation", "false",
        "--eval-before-training", "false", "--learning-rate", "1e-3", "--max-length", "16", "--eval-max-length", "16",
        "--report-to", "csv", "--logging-steps", "1", "--mixed-precision", "no",
    ]  # fmt: skip
    return root, flags


def _sigterm_after_two_steps(command: list[str], run_dir: Path) -> str:
    """Start the command, send SIGTERM once ``run_dir`` has logged two steps; returns its stderr (exit 143)."""
    process = subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: logged_steps(run_dir) >= 2, process, what="two training steps")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr[-2000:]  # 128 + SIGTERM, not -15 (killed without a word)
    assert "Traceback" not in stderr, stderr[-2000:]
    assert "SIGTERM: saving a checkpoint after this step" in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted by SIGTERM"
    return stderr


def _signal_checkpoint(run_dir: Path, stderr: str) -> int:
    """The step of the one checkpoint the signal saved (named in the message, with the hint to resume)."""
    [checkpoint] = sorted((run_dir / "checkpoints").glob("step-*[0-9]"))
    assert f"interrupted by SIGTERM: checkpoint saved to {checkpoint}; continue with --resume" in stderr
    step = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
    assert 2 <= step < STEPS
    return step


def test_sigterm_stops_train_with_a_checkpoint_and_exit_143_and_resume_continues(text_setup):
    root, flags = text_setup
    run_dir = root / "train"
    stderr = _sigterm_after_two_steps(cli_command("train", *flags, "--output-dir", str(run_dir)), run_dir)
    stopped_at = _signal_checkpoint(run_dir, stderr)
    assert not (run_dir / "results.json").exists()

    assert main(["train", *flags, "--output-dir", str(run_dir), "--resume"]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["resumed_from_step"] == stopped_at and results["total_steps"] == STEPS
    assert [entry["step"] for entry in results["history"]] == list(range(1, STEPS + 1))


def test_sigterm_stops_a_compare_cell_with_a_checkpoint_and_the_same_command_resumes_it(text_setup):
    root, flags = text_setup
    sweep = root / "sweep"
    args = ["compare", "--preset", "cpu-demo", "--losses", "infonce", "--seeds", "1", *flags, "--output-dir",
            str(sweep)]  # fmt: skip
    cell = sweep / "infonce" / "seed-1"
    stderr = _sigterm_after_two_steps(cli_command(*args), cell)
    stopped_at = _signal_checkpoint(cell, stderr)
    assert f"compare stopped in cell {cell}: run the same compare command again to continue" in stderr
    assert not (sweep / "comparison.json").exists()

    assert main(args) == 0
    results = json.loads((cell / "results.json").read_text())
    assert results["resumed_from_step"] == stopped_at
    assert [entry["step"] for entry in results["history"]] == list(range(1, STEPS + 1))
    assert json.loads((sweep / "comparison.json").read_text())["runs"][0]["seed"] == 1


def test_sigterm_stops_vision_train_with_a_checkpoint_and_exit_143_and_resume_continues(tmp_path):
    pytest.importorskip("torchvision")
    from simcse_weince.settings import load_config
    from simcse_weince.vision.config import VisionTrainConfig
    from simcse_weince.vision.trainer import train

    steps = 40  # 8 steps per epoch: the signal lands mid-epoch, before the first epoch checkpoint
    flags = [
        "vision", "train", "--dataset", "fake", "--backbone", "resnet18", "--image-size", "16", "--batch-size", "8",
        "--train-size", "64", "--num-epochs", "5", "--max-steps", str(steps), "--logging-steps", "1",
        "--mixed-precision", "no", "--report-to", "csv", "--seed", "3",
    ]  # fmt: skip
    run_dir = tmp_path / "vision"
    stderr = _sigterm_after_two_steps(cli_command(*flags, "--output-dir", str(run_dir)), run_dir)
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*[0-9]"))
    assert f"interrupted by SIGTERM: checkpoint saved to {checkpoints[-1]}; continue with --resume" in stderr
    stopped_at = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["step"]
    assert 2 <= stopped_at < steps

    resumed = train(load_config(VisionTrainConfig, run_dir / "training_config.yaml"), resume=True)
    assert resumed["history"][0]["step"] == stopped_at + 1 and resumed["step"] == steps


def test_a_sigterm_while_the_loaders_workers_start_stops_after_one_step(text_setup, monkeypatch, capsys):
    """The signal lands while ``iter(loader)`` starts its workers: the run still stops at a step boundary with a
    checkpoint, the bar is closed before the last line, and no worker is left to start after its parent ended."""
    import os

    from torch.utils.data import DataLoader

    root, flags = text_setup
    run_dir = root / "loader-start"
    start_workers = DataLoader.__iter__

    def start_under_a_signal(loader):
        os.kill(os.getpid(), signal.SIGTERM)
        return start_workers(loader)

    monkeypatch.setattr(DataLoader, "__iter__", start_under_a_signal)
    assert main(["train", *flags, "--num-workers", "2", "--output-dir", str(run_dir)]) == 143
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "SIGTERM: saving a checkpoint after this step" in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted by SIGTERM", stderr[-1500:]
    [checkpoint] = sorted((run_dir / "checkpoints").glob("step-*[0-9]"))
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == 1


def test_a_sigterm_inside_a_finalizer_is_not_lost():
    """A signal that lands while a finalizer (``__del__``, e.g. a progress bar's) runs would raise where Python drops
    the exception ("Exception ignored in ..."): it comes again once the finalizer is done, and stops the program."""
    import time

    from simcse_weince.training.signals import Interrupted, sigterm_interrupts

    class SignalledWhileFinalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    with pytest.raises(Interrupted), sigterm_interrupts():
        SignalledWhileFinalized()  # finalized at once: the signal lands inside __del__
        time.sleep(2)  # the signal, raised again after the finalizer, ends this wait
