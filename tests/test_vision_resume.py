"""The vision trainer has the text trainer's machinery: Ctrl-C saves a checkpoint, a SIGKILLed run resumes exactly,
every WeinceConfig field is a flag, and the old flag names still work (with a warning)."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from train_helpers import cli_command, subprocess_env, wait_for

pytest.importorskip("torchvision")

from simcse_weince import WeinceConfig
from simcse_weince.cli import build_parser, main
from simcse_weince.settings import apply_overrides, load_config
from simcse_weince.vision.config import VisionTrainConfig
from simcse_weince.vision.trainer import train

STEPS, SAVE_EVERY = 12, 3  # FakeData, 32 images in batches of 8: 4 steps per epoch, so resumes fall mid-epoch
FLAGS = [
    "vision", "train", "--dataset", "fake", "--backbone", "resnet18", "--image-size", "16", "--batch-size", "8",
    "--train-size", "32", "--num-epochs", "3", "--max-steps", str(STEPS), "--save-steps", str(SAVE_EVERY),
    "--logging-steps", "1", "--mixed-precision", "no", "--report-to", "csv", "--seed", "3",
    "--quantile", "0.3", "--gate", "rho", "--beta", "1.0",  # WEINCE settings reach the vision trainer too
]  # fmt: skip


def _logged_losses(output_dir: Path) -> dict[int, float]:
    path = output_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open(newline="") as handle:
        return {int(row["step"]): float(row["value"]) for row in csv.DictReader(handle) if row["name"] == "loss"}


def test_vision_ctrl_c_saves_a_checkpoint_and_sigkill_resumes_exactly(tmp_path):
    env = subprocess_env()
    run_dir = tmp_path / "interrupted"

    # 1. Ctrl-C (SIGINT) after a couple of steps: a checkpoint at the step where it stopped, exit code 130
    process = subprocess.Popen(
        cli_command(*FLAGS, "--output-dir", str(run_dir)),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: len(_logged_losses(run_dir)) >= 2, process, what="two training steps")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-2000:]
    assert "checkpoint saved" in stderr and "--resume" in stderr
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*[0-9]"))
    assert checkpoints, stderr[-2000:]
    interrupted_at = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["step"]
    assert 2 <= interrupted_at < STEPS
    saved = load_config(VisionTrainConfig, run_dir / "training_config.yaml")
    assert (saved.weince.quantile, saved.weince.gate, saved.weince.beta) == (0.3, "rho", 1.0)

    # 2. the uninterrupted run with the same settings, in this process
    reference = train(apply_overrides(saved, {"output_dir": str(tmp_path / "reference")}))
    assert [entry["step"] for entry in reference["history"]] == list(range(1, STEPS + 1))

    # 3. resume, then SIGKILL right after the first periodic checkpoint past the interruption
    target = (interrupted_at // SAVE_EVERY + 1) * SAVE_EVERY
    process = subprocess.Popen(
        cli_command(*FLAGS, "--output-dir", str(run_dir), "--resume"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    checkpoint = run_dir / "checkpoints" / f"step-{target:07d}"
    wait_for(lambda: (checkpoint / "trainer_state.json").is_file(), process, what=f"the checkpoint of step {target}")
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)

    # 4. resume in this process until the end: the same batches, augmentations and updates as the reference
    resumed = train(load_config(VisionTrainConfig, run_dir / "training_config.yaml"), resume=True)
    assert resumed["history"][0]["step"] == target + 1 and resumed["step"] == STEPS
    losses = _logged_losses(run_dir)  # each step once, although the killed run had logged past its checkpoint
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert [losses[step] for step in range(1, STEPS + 1)] == pytest.approx(
        [entry["loss"] for entry in reference["history"]], abs=1e-6
    )


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return action.choices[name]


def test_vision_flags_come_from_the_config_and_old_names_still_work(capsys):
    code = main(["vision", "train", "--print-config", "--quantile", "0.25", "--weince.kappa_rho", "5", "--cpu"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert code == 0 and printed["weince"]["quantile"] == 0.25 and printed["weince"]["kappa_rho"] == 5.0
    assert printed["cpu"] is True and printed["mixed_precision"] == "auto"
    # every field of both dataclasses is a flag
    vision = _subcommand(build_parser(), "vision")
    train_flags = {option for action in _subcommand(vision, "train")._actions for option in action.option_strings}
    for field in dataclasses.fields(VisionTrainConfig):
        assert field.name == "weince" or "--" + field.name.replace("_", "-") in train_flags, field.name
    for field in dataclasses.fields(WeinceConfig):
        assert {"--" + field.name.replace("_", "-"), "--weince." + field.name} <= train_flags, field.name
    # the names of the previous release: read, with a warning naming the new one
    code = main(["vision", "train", "--print-config", "--epochs", "3", "--log-every", "2", "--lr", "0.01"])
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert code == 0 and (printed["num_epochs"], printed["logging_steps"], printed["learning_rate"]) == (3, 2, 0.01)
    assert "'epochs' is deprecated; it is now 'num_epochs'" in captured.err
    code = main(["vision", "train", "--print-config", "--dataset", "mnist"])
    assert code == 1 and "unknown dataset 'mnist'" in capsys.readouterr().err


def test_vision_stops_at_a_non_finite_loss_before_it_reaches_a_checkpoint(tmp_path, monkeypatch):
    import simcse_weince.vision.trainer as vision_train
    from simcse_weince.training.checkpoints import list_checkpoints

    class NaNAtStepTwo(vision_train.ContrastiveObjective):  # the real objective, with a NaN loss at step 2
        calls = 0

        def __call__(self, *args, **kwargs):
            loss, logs = super().__call__(*args, **kwargs)
            NaNAtStepTwo.calls += 1
            return (loss * float("nan") if NaNAtStepTwo.calls == 2 else loss), logs

    monkeypatch.setattr(vision_train, "ContrastiveObjective", NaNAtStepTwo)
    output_dir = tmp_path / "run"
    config = VisionTrainConfig(
        dataset="fake", image_size=16, batch_size=8, train_size=32, max_steps=4, save_steps=1, logging_steps=1,
        mixed_precision="no", report_to=("csv",), output_dir=str(output_dir),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="the loss is nan at step 2"):
        train(config)
    assert [path.name for path in list_checkpoints(output_dir)] == ["step-0000001"]  # step 1's, intact


def test_resume_starts_from_the_saved_settings_and_names_what_the_flags_change(tmp_path, capsys):
    from simcse_weince.settings import CONFIG_FILE, save_config

    run = tmp_path / "run"
    run.mkdir()
    save_config(VisionTrainConfig(dataset="digits", batch_size=64, output_dir=str(run)), run / CONFIG_FILE)
    code = main(["vision", "train", "--print-config", "--resume", "--output-dir", str(run), "--num-epochs", "7"])
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert code == 0 and (printed["dataset"], printed["batch_size"], printed["num_epochs"]) == ("digits", 64, 7)
    assert "differ from the saved run: num_epochs" in captured.err
