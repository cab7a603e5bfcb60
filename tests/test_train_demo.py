"""The README's main command end to end: ``simcse-weince train --preset cpu-demo`` (slow: minutes on a CPU)."""

from __future__ import annotations

import json
import subprocess

import pytest
from train_helpers import cli_command, subprocess_env


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["weince", "infonce"])
def test_cpu_demo_trains_and_its_folder_reproduces_the_scores(tmp_path, data_dir, loss):
    from sentence_transformers import SentenceTransformer

    from simcse_weince.evaluation import stsb_spearman

    output_dir = tmp_path / f"demo-{loss}"
    completed = subprocess.run(
        cli_command("train", "--preset", "cpu-demo", "--loss", loss, "--output-dir", str(output_dir)),
        env=subprocess_env(), capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "STS-B dev Spearman:" in completed.stdout and "STS-B test Spearman:" in completed.stdout
    results = json.loads((output_dir / "results.json").read_text())
    assert results["total_steps"] == 186 and results["best_step"] in (62, 124, 186)
    assert set(results["sts_test"]) >= {"sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg"}
    model = SentenceTransformer(str(output_dir), device="cpu")
    assert stsb_spearman(model, split="test", data_dir=data_dir) == pytest.approx(
        results["stsb_test_spearman"], abs=1e-6
    )
    assert results["stsb_test_spearman"] > 75  # all-MiniLM-L6-v2 starts at ~82; a broken run falls far below
    assert (loss == "weince") == bool(results["lambda_stats"])
