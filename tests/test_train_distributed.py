"""Two CPU processes (torchrun + gloo): gathered negatives give the single-process global-batch loss, with and
without GradCache mini-batches."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from train_helpers import REPO_ROOT, make_tiny_model, subprocess_env, write_train_file

from simcse_weince.text.config import preset
from simcse_weince.text.trainer import train


def _two_process_report(script: str, report_name: str, tmp_path, data_dir):
    """Run ``tests/<script>`` on 2 processes with a tiny BERT and 200 wiki sentences; its JSON report, the model
    and the training file."""
    if shutil.which("torchrun") is None and not _has_torchrun_module():
        pytest.skip("torchrun is not available")
    model = make_tiny_model(tmp_path / "tiny")
    train_file = write_train_file(tmp_path / "train.txt", data_dir, lines=200)
    output_dir = tmp_path / "run"
    _run_two_processes(script, model, train_file, output_dir)
    return json.loads((output_dir / report_name).read_text()), model, train_file


def test_two_processes_gather_negatives_and_train(tmp_path, data_dir):
    report, _, _ = _two_process_report("distributed_train_check.py", "distributed_report.json", tmp_path, data_dir)
    output_dir = tmp_path / "run"
    assert report["world"] == 2
    for loss_name in ("weince", "infonce"):
        numbers = report[loss_name]
        assert numbers["loss"] == pytest.approx(numbers["single_process_loss"], rel=1e-5, abs=1e-6)
        # with dropout off the positives sit at cosine 1, where WEINCE's shortfall term -log(1 - s) is steep:
        # float32 rounding of the two summation orders shows in its gradient at ~1e-5
        assert numbers["max_grad_difference"] <= 1e-4 * max(numbers["max_grad"], 1.0)
    # one scheduler step per optimizer update (not one per process): linear decay from 1e-3 over 4 steps
    assert [e["learning_rate"] for e in report["train"]["history"]] == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0])
    assert report["train"]["num_processes"] == 2 and report["train"]["total_steps"] == 4
    assert len(report["train"]["history"]) == 4 and "lambda_mean" in report["train"]["history"][0]
    assert (output_dir / "modules.json").is_file() and (output_dir / "checkpoints" / "step-0000002").is_dir()


def test_two_processes_with_mini_batches_match_one_process_on_the_whole_batch(tmp_path, data_dir):
    report, model, train_file = _two_process_report(
        "distributed_cached_check.py", "distributed_cached_report.json", tmp_path, data_dir
    )
    assert report["world"] == 2
    checks = {**report["sentence_transformers"], **report["trainer_step"]}
    assert set(checks) == {"1_columns", "2_columns", "weince", "infonce", "weince_triplets", "infonce_triplets"}
    for name, numbers in checks.items():
        assert numbers["loss"] == pytest.approx(numbers["single_process_loss"], rel=1e-5, abs=1e-6), name
        assert numbers["num_grads"] > 10 and numbers["max_grad"] > 0, name
        assert numbers["max_grad_difference"] <= 1e-5 * numbers["max_grad"], name
    # the trainer on two processes with --mini-batch-size 3 repeats one process without it
    config = preset(
        "paper", model=str(model), train_file=str(train_file), pooler="avg", dropout=0.0, batch_size=16, max_steps=3,
        eval_steps=0, save_steps=0, final_evaluation=False, report_to=["csv"], output_dir=str(tmp_path / "one"),
        cpu=True, learning_rate=1e-3, mixed_precision="no",
    )  # fmt: skip
    expected = [entry["loss"] for entry in train(config)["history"]]
    assert report["train"]["num_processes"] == 2
    assert [entry["loss"] for entry in report["train"]["history"]] == pytest.approx(expected, rel=1e-5)


def _run_two_processes(script: str, *args) -> None:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(REPO_ROOT / "tests" / script), *map(str, args),
    ]  # fmt: skip
    # a new session, so that a hang can be ended with the whole process group (torchrun and its workers)
    process = subprocess.Popen(
        command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail("the two-process run hung")
    assert process.returncode == 0, stderr[-4000:]


def _has_torchrun_module() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch.distributed.run") is not None
