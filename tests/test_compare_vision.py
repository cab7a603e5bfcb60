"""`simcse-weince vision compare`: real (tiny) SimCLR sweeps on scikit-learn's digits, paired by seed, with the
untrained backbone of each seed as a variant."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("sklearn")

from simcse_weince.cli import main
from simcse_weince.compare import compare, load_variants
from simcse_weince.vision import VISION_CELLS, VISION_VARIANTS
from simcse_weince.vision.config import VisionTrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def tiny(tmp_path, **overrides) -> VisionTrainConfig:
    """8-px digits, batch 16, 2 steps: seconds per cell."""
    settings = {"dataset": "digits", "image_size": 8, "batch_size": 16, "num_epochs": 1, "max_steps": 2,
                "logging_steps": 1, "mixed_precision": "no", "report_to": ("csv",),
                "output_dir": str(tmp_path / "unused")}  # fmt: skip
    settings.update(overrides)
    return VisionTrainConfig(**settings)


def _flat_weights(checkpoint):
    import torch

    from simcse_weince.vision.trainer import load_pretrained

    model, _ = load_pretrained(checkpoint)  # parameters only: a training step also moves BatchNorm's running stats
    return torch.cat([value.detach().float().flatten() for value in model.backbone.parameters()])


def test_vision_compare_cli_runs_pairs_and_rereads(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["vision", "compare", "--dataset", "digits", "--image-size", "8", "--batch-size", "16", "--max-steps",
            "2", "--num-epochs", "1", "--logging-steps", "1", "--losses", "infonce,weince,untrained", "--seeds", "1,2",
            "--report-to", "csv", "--mixed-precision", "no", "--output-dir", str(sweep)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((sweep / "comparison.json").read_text())
    assert (
        summary["kind"] == "vision"
        and summary["score_scale"]["low"] == 0.0
        and summary["deltas"] == ["knn@20", "linear_probe"]
    )
    assert {(run["variant"], run["seed"]) for run in summary["runs"]} == {
        (name, seed) for name in ("infonce", "weince", "untrained") for seed in (1, 2)
    }
    cells = {}
    for run in summary["runs"]:
        results = json.loads((sweep / run["variant"] / f"seed-{run['seed']}" / "results.json").read_text())
        cells[run["variant"], run["seed"]] = results
        assert results["config"]["seed"] == run["seed"]
        assert results["step"] == (0 if run["variant"] == "untrained" else 2)
        evaluation = results["evaluation"]
        assert evaluation["num_train"] == 1438 and evaluation["num_test"] == 359  # the stratified real split
        assert run["knn@20"] == pytest.approx(100 * evaluation["knn_accuracy"]["20"])
        assert run["linear_probe"] == pytest.approx(100 * evaluation["linear_accuracy"]["mean"])
        assert 10.0 < run["knn@20"] <= 100.0  # ten classes: far above chance even untrained
    # the paired difference is computed from the cells, seed by seed
    for metric in ("knn@20", "linear_probe"):
        expected = [
            next(r[metric] for r in summary["runs"] if r["variant"] == "untrained" and r["seed"] == seed)
            - next(r[metric] for r in summary["runs"] if r["variant"] == "infonce" and r["seed"] == seed)
            for seed in (1, 2)
        ]
        difference = summary["differences"]["untrained"][metric]
        assert difference["mean"] == pytest.approx(sum(expected) / 2)
        if expected[0] != expected[1]:  # the interval depends on which runs are paired (the mean does not)
            from scipy import stats

            half = stats.t.ppf(0.975, 1) * abs(expected[0] - expected[1]) / 2
            assert difference["ci95"] == pytest.approx([sum(expected) / 2 - half, sum(expected) / 2 + half])
    # WEINCE logged its λ statistics; the untrained cells trained nothing
    assert set(summary["lambda_curves"]) == {"weince"}
    assert cells["untrained", 1]["history"] == []
    table = (sweep / "comparison.md").read_text()
    assert table.startswith("| variant | n | kNN@20 | kNN@1 | linear probe | Δ kNN@20 vs infonce")
    assert "| untrained | 2 |" in table
    assert (sweep / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a cell killed during its evaluation (final checkpoint written, results.json not yet) only evaluates again
    cell = sweep / "weince" / "seed-2"
    state_before = (cell / "checkpoints").rglob("trainer_state.json").__next__().read_text()
    (cell / "results.json").unlink()
    kept = {path: path.stat().st_mtime_ns for path in sweep.glob("*/seed-*/results.json")}
    assert main(args) == 0
    for path, mtime in kept.items():  # read, not retrained
        assert path.stat().st_mtime_ns == mtime, path
    again = json.loads((cell / "results.json").read_text())
    assert again["step"] == 2
    assert again["evaluation"]["knn_accuracy"] == cells["weince", 2]["evaluation"]["knn_accuracy"]
    assert next((cell / "checkpoints").rglob("trainer_state.json")).read_text() == state_before

    # archived (results.json + training_config.yaml per cell) and restored elsewhere: the grid is read, not rerun
    import subprocess
    import sys

    from train_helpers import REPO_ROOT

    archive, restored = tmp_path / "archive", tmp_path / "restored"
    for source, destination in ((sweep, archive), (archive, restored)):
        script = REPO_ROOT / "scripts" / "study" / "archive_study.py"
        subprocess.run([sys.executable, str(script), str(source), str(destination)], check=True, capture_output=True)
    assert not list(archive.rglob("*.safetensors")) and not list(archive.rglob("checkpoints"))
    assert main([*args[:-1], str(restored)]) == 0
    assert not list(restored.rglob("checkpoints"))  # nothing trained
    assert json.loads((restored / "comparison.json").read_text())["differences"] == differences_of(sweep)


def differences_of(sweep):
    return json.loads((sweep / "comparison.json").read_text())["differences"]


def test_untrained_variant_is_the_initialisation_of_the_trained_cells_of_its_seed(tmp_path):
    # One Adam step at lr 1e-9 moves each weight by about 1e-9: the trained cell's weights must equal the
    # untrained cell's of the same seed to that, and differ from another seed's initialisation by far more.
    variants = {"infonce": {"loss": "infonce", "max_steps": 1, "learning_rate": 1e-9}, "untrained": {"num_epochs": 0}}
    summary = compare(tiny(tmp_path), variants, [3, 4], tmp_path / "sweep", kind=VISION_CELLS)
    weights = {(name, seed): _flat_weights(tmp_path / "sweep" / name / f"seed-{seed}")
               for name in variants for seed in (3, 4)}  # fmt: skip
    for seed in (3, 4):
        assert (weights["infonce", seed] - weights["untrained", seed]).abs().max().item() < 1e-6
    assert (weights["untrained", 3] - weights["untrained", 4]).abs().max().item() > 1e-2
    assert summary["per_variant"]["untrained"]["knn@20"]["n"] == 2


def test_vision_compare_bad_input_is_one_clear_line(tmp_path, capsys):
    base = ["vision", "compare", "--dataset", "digits", "--output-dir", str(tmp_path / "s")]
    assert main([*base, "--losses", "infonce,infonce-hardness"]) == 1  # a text-only variant
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "infonce-hardness" in error and "known: infonce, weince" in error
    assert main([*base, "--seed", "3"]) == 1
    assert "use --seeds" in capsys.readouterr().err
    assert main([*base, "--num-epochs", "-1"]) == 1
    assert "num_epochs must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # nothing ran


def test_vision_variants_file_merges_over_the_vision_builtins(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text("q03: {loss: weince, weince: {quantile: 0.3}}\n")
    variants = load_variants(path, VISION_VARIANTS)
    assert variants["q03"] == {"loss": "weince", "weince.quantile": 0.3}
    assert variants["untrained"] == {"num_epochs": 0} and "infonce-hardness" not in variants
