"""The GradCache scripts at a small size: bench_memory.py's table and device_check.sh --cpu-dry-run's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from train_helpers import REPO_ROOT, subprocess_env


def test_bench_memory_measures_cached_and_uncached_in_fresh_processes(tiny_model, tmp_path, data_dir):
    model = tiny_model
    output = tmp_path / "rows.json"
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_memory.py"), "--model", str(model),
        "--batch-sizes", "8",
        "--mini-batch-size", "3", "--max-uncached-batch", "8", "--threads", "1", "--steps", "1", "--warmup", "0",
        "--data", str(data_dir / "wiki1m_head.txt"), "--output", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(output.read_text())
    assert [(row["path"], row["batch_size"]) for row in rows] == [("cached", 8), ("uncached", 8)]
    for row in rows:
        assert row["peak_mib"] >= row["baseline_mib"] > 0 and row["ms_per_sentence"] > 0
        assert row["tokens_per_sentence"] == 32 and row["device"] == "cpu"
    assert all(0 < row["loss"] < float("inf") for row in rows)
    assert "| 8 |" in result.stdout and "x |" in result.stdout  # one row, with the time ratio


def test_device_check_cpu_dry_run_writes_one_passing_json(tmp_path):
    env = subprocess_env()
    env["OUT"] = str(tmp_path)
    result = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "device" / "device_check.sh"), "--cpu-dry-run", "--repeats", "2"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert result.returncode == 0, json.dumps(report, indent=1)[-3000:]
    assert report["mode"] == "cpu-dry-run" and report["ok"] is True
    checks = report["checks"]
    assert set(checks) == {
        "core_topk",
        "autocast_bf16",
        "autocast_fp16",
        "cached_rng_replay",
        "loss_timing",
        "trainer_step",
        "flop_utilisation",
    }
    assert checks["cached_rng_replay"]["second_pass_bitwise_equal"] is True
    assert checks["cached_rng_replay"]["dropout_views_differ"] is True
    assert checks["autocast_bf16"]["statistics_dtype"] in ("torch.float32", "torch.float64")
    assert "skipped" in checks["autocast_fp16"]
    assert {"simclr 2x256x128", "simcse 512x512x768"} <= set(checks["loss_timing"])
    assert checks["trainer_step"]["no"]["ok"] and checks["trainer_step"]["bf16"]["ok"]
    utilisation = checks["flop_utilisation"]
    assert utilisation["ok"] and 0 < utilisation["fp32"]["mfu"] < 1
    assert utilisation["fp32"]["training_forward"] == "fast"
    assert utilisation["fp32"]["achieved_tflops"] == pytest.approx(
        utilisation["model_gflop_per_step"] / 1e3 / (utilisation["fp32"]["step_ms"] / 1e3)
    )


def test_device_check_refuses_to_run_without_a_gpu_unless_dry(tmp_path):
    import torch

    if torch.cuda.is_available():
        return
    env = subprocess_env()
    env["OUT"] = str(tmp_path)
    script = REPO_ROOT / "scripts" / "device" / "device_check.sh"
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--cpu-dry-run" in result.stderr
    assert not (tmp_path / "device_check.json").exists()


def test_bench_st_trainer_prints_weince_over_mnrl_in_the_trainer_and_alone(tiny_model, tmp_path, data_dir):
    output = tmp_path / "bench.json"
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_st_trainer.py"), "--model", str(tiny_model),
        "--batch-size", "8", "--steps", "2", "--rounds", "2", "--loss-repeats", "3", "--threads", "1",
        "--data", str(data_dir / "wiki1m_head.txt"), "--output-dir", str(tmp_path / "runs"), "--output", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    numbers = json.loads(output.read_text())
    # two rounds of two timed steps per loss (each round's first step is a warm-up), three loss-alone pairs
    assert numbers["trainer_step"]["samples"] == {"mnrl": 4, "weince": 4}
    assert numbers["loss_alone"]["samples"] == {"mnrl": 3, "weince": 3}
    for row in (numbers["trainer_step"], numbers["loss_alone"]):
        assert (
            row["weince_over_mnrl"] == pytest.approx(row["ms"]["weince"] / row["ms"]["mnrl"]) and row["ms"]["mnrl"] > 0
        )
    assert "trainer step" in result.stdout and "loss alone" in result.stdout and "x" in result.stdout


def test_bench_train_memory_measures_both_trainers_and_where_ours_goes(tiny_model, tmp_path, data_dir):
    output = tmp_path / "rows.json"
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_train_memory.py"), "--model", tiny_model,
        "--steps", "3", "--batch-size", "8", "--max-length", "16", "--precisions", "fp32", "--threads", "1",
        "--data-dir", str(data_dir), "--output", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(output.read_text())
    assert [(row["trainer"], row["precision"]) for row in rows] == [("ours", "fp32"), ("sentence-transformers", "fp32")]
    for row in rows:
        assert row["steps"] == 3 and row["peak_mib"] >= row["rss_mib"]["3"] > 0
        assert row["late_over_early"] == pytest.approx(row["peak_mib"] / row["peak_after_early_mib"], rel=2e-3)
        assert row["late_over_early"] >= 1
    parts = rows[0]["breakdown_mib"]
    assert list(parts) == ["runtime", "data", "model", "optimizer state", "activations",
                           "kernel caches and other growth"]  # fmt: skip
    assert parts["runtime"] > 0 and parts["optimizer state"] > 0
    assert "peak RSS ours / sentence-transformers, fp32:" in result.stdout and "where ours goes, fp32" in result.stdout
