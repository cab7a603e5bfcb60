"""Interrupted runs: Ctrl-C saves a checkpoint, a SIGKILLed run resumes exactly where it stopped."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from train_helpers import cli_command, logged_steps, make_tiny_model, subprocess_env, wait_for, write_train_file

from simcse_weince.settings import apply_overrides, load_config
from simcse_weince.text.config import TrainConfig
from simcse_weince.text.trainer import train

STEPS, SAVE_EVERY = 20, 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("resume")
    model = make_tiny_model(root / "tiny")
    train_file = write_train_file(root / "train.txt", data_dir, lines=400)
    flags = [
        "--model", str(model), "--train-file", str(train_file), "--pooler", "cls", "--batch-size", "16",
        "--max-steps", str(STEPS), "--eval-steps", "10", "--save-steps", str(SAVE_EVERY), "--learning-rate", "1e-3",
        "--final-tasks", "none", "--eval-max-length", "32", "--report-to", "csv",
    ]  # fmt: skip
    return root, flags


def test_ctrl_c_saves_a_checkpoint_and_sigkill_resumes_exactly(setup):
    root, flags = setup
    env = subprocess_env()

    # 1. uninterrupted reference, in this process
    reference_dir = root / "reference"
    reference = None

    # 2. Ctrl-C (SIGINT) after a couple of steps: a checkpoint at the step where it stopped, exit code 130
    run_dir = root / "interrupted"
    command = cli_command("train", *flags, "--output-dir", str(run_dir))
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: logged_steps(run_dir) >= 2, process, what="two training steps")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr[-2000:]
    assert "checkpoint saved" in stderr and "--resume" in stderr
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*[0-9]"))
    assert checkpoints, stderr[-2000:]
    interrupted_at = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["step"]
    assert 2 <= interrupted_at < STEPS

    # meanwhile (the subprocess is done), the uninterrupted run with the same settings
    config = apply_overrides(
        load_config(TrainConfig, run_dir / "training_config.yaml"), {"output_dir": str(reference_dir)}
    )
    reference = train(config)

    # 3. resume, then SIGKILL right after the first periodic checkpoint past the interruption
    target = (interrupted_at // SAVE_EVERY + 1) * SAVE_EVERY
    process = subprocess.Popen(
        cli_command("train", *flags, "--output-dir", str(run_dir), "--resume"),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    checkpoint = run_dir / "checkpoints" / f"step-{target:07d}"
    wait_for(lambda: (checkpoint / "trainer_state.json").is_file(), process, what=f"the checkpoint of step {target}")
    assert process.poll() is None, "the run finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert not (run_dir / "results.json").exists()

    # 4. resume in this process until the end: same steps, same data, same dropout masks, same model
    saved = json.loads((checkpoint / "trainer_state.json").read_text())  # the run keeps only its newest checkpoints
    resumed = train(load_config(TrainConfig, run_dir / "training_config.yaml"), resume=True)
    assert resumed["resumed_from_step"] == target
    # the wall time and its parts carry the earlier sessions (up to the checkpoint resumed from)
    assert resumed["wall_time_seconds"] > saved["wall_seconds"] > 0
    assert resumed["setup_seconds"] > saved["time_parts"]["setup"] > 0
    assert resumed["evaluation_seconds"] > saved["time_parts"]["evaluation"] >= 0  # STS-B dev at steps 10, 20
    assert resumed["total_steps"] == reference["total_steps"] == STEPS
    losses = [entry["loss"] for entry in resumed["history"]]
    assert len(losses) == STEPS
    assert losses == pytest.approx([entry["loss"] for entry in reference["history"]], abs=1e-5)
    assert resumed["best_step"] == reference["best_step"]
    # the model FLOPs of every step, across the three sessions, are the uninterrupted run's
    assert [entry["model_flops"] for entry in resumed["history"]] == [e["model_flops"] for e in reference["history"]]
    assert "mfu" in resumed and 0 < resumed["mfu"] < 1
    assert resumed["stsb_test_spearman"] == pytest.approx(reference["stsb_test_spearman"], abs=0.05)
    assert resumed["stsb_dev_spearman"] == pytest.approx(reference["stsb_dev_spearman"], abs=0.05)
    # the CSV log holds each step once, although the killed run had logged past its checkpoint
    rows = (run_dir / "logs" / "metrics.csv").read_text().splitlines()[1:]
    loss_steps = [int(row.split(",")[0]) for row in rows if row.split(",")[1] == "loss"]
    assert loss_steps == list(range(1, STEPS + 1))
