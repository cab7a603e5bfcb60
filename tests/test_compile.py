"""``--compile``: the encoder's training forward under torch.compile computes what the eager one does (issue 26).

Inductor draws its own dropout masks; with ``fallback_random`` it uses eager's random ops, so the same seed gives
the same masks and the compiled run must reproduce the eager run's per-step losses. The checkpoints and the
export must keep the encoder's own parameter names (a compiled module would prefix them with ``_orig_mod.``).
"""

from __future__ import annotations

import csv

import pytest
import torch

from simcse_weince.text.config import preset
from simcse_weince.text.trainer import train

TRAIN_LINES = 200  # the train_file fixture's sentences (conftest.py)


def _losses(output_dir) -> list[float]:
    with (output_dir / "logs" / "metrics.csv").open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["name"] == "loss"]
    return [float(row["value"]) for row in sorted(rows, key=lambda row: int(row["step"]))]


def test_compiled_training_equals_eager_and_exports_the_same_names(tiny_model, train_file, tmp_path, monkeypatch):
    import torch._inductor.config as inductor_config
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    monkeypatch.setattr(inductor_config, "fallback_random", True)  # eager's dropout masks, so runs compare
    runs = {}
    for compiled in (False, True):
        output_dir = tmp_path / f"compile-{compiled}"
        config = preset(
            "paper", model=tiny_model, train_file=train_file, pooler="cls", batch_size=16, max_steps=4,
            eval_steps=0, save_steps=2, learning_rate=1e-3, final_tasks=[], eval_max_length=32, report_to=["csv"],
            mixed_precision="no", length_chunks=2, compile=compiled, output_dir=str(output_dir),
        )  # fmt: skip
        torch._dynamo.utils.counters.clear()
        runs[compiled] = (output_dir, train(config))
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert (graphs >= 1) if compiled else (graphs == 0), graphs  # the compiled run really ran a compiled graph
    (eager_dir, eager), (compiled_dir, compiled) = runs[False], runs[True]
    assert compiled["config"]["speed"]["compile"] is True and eager["config"]["speed"]["compile"] is False
    assert compiled["training_forward"]["path"] == "fast" and compiled["training_forward"]["compile"] is True
    eager_losses, compiled_losses = _losses(eager_dir), _losses(compiled_dir)
    assert len(eager_losses) == 4 and len(set(eager_losses)) > 1  # training moved
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-6)
    # the same parameter names and (to float tolerance) values in the export and in the checkpoint
    eager_weights = load_file(str(eager_dir / "model.safetensors"))
    compiled_weights = load_file(str(compiled_dir / "model.safetensors"))
    assert set(compiled_weights) == set(eager_weights) and not any("_orig_mod" in name for name in compiled_weights)
    # Adam moves each element by about the learning rate a step whatever its gradient's size, so an element whose
    # gradient is at rounding level may differ by a fraction of it (one in ~10^6 did by 1.3e-4 on a Xeon with AMX)
    for name, value in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], value, atol=config.learning_rate, rtol=1e-3)

    def checkpoint_names(run_dir) -> set[str]:
        files = sorted(run_dir.glob("checkpoints/*/*.safetensors"))
        assert files, f"no checkpoint weights in {run_dir}"
        return {name for path in files for name in load_file(str(path))}

    assert checkpoint_names(compiled_dir) == checkpoint_names(eager_dir)
    # the exported folder loads as a SentenceTransformer and encodes
    embeddings = SentenceTransformer(str(compiled_dir), device="cpu").encode(["A man plays a guitar."])
    assert embeddings.shape == (1, 32)


def test_compile_with_gradcache_is_refused_clearly():
    with pytest.raises(ValueError, match="compile is not supported with mini_batch_size"):
        preset("cpu-demo", compile=True, mini_batch_size=16)
