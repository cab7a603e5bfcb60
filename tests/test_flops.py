"""Model FLOPs and the measured matmul peak (training/flops.py): the formula against torch's own FLOP counter, the
trainer's count against the formula over an epoch's real tokens, and the peak's guarantees."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from train_helpers import write_train_file
from transformers import AutoTokenizer, BertConfig, BertModel

from simcse_weince.text.config import preset
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import train
from simcse_weince.training.flops import encoder_dimensions, encoder_training_flops, matmul_peak_flops


def counted_flops(step) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_the_formula_is_what_torch_counts_for_a_bert_forward_and_backward(tiny_model, attention):
    model = BertModel.from_pretrained(tiny_model, add_pooling_layer=False, attn_implementation=attention)
    ids = torch.randint(1000, 2000, (5, 11))

    def step():
        model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.sum().backward()

    with FlopCounterMode(display=False) as counter:
        step()
    config, layers, hidden = model.config, model.config.num_hidden_layers, model.config.hidden_size
    expected = encoder_training_flops(config, [11] * 5)
    if attention == "sdpa":
        if any("flash_attention" in str(op) for op in counter.get_flop_counts()["Global"]):
            # flash attention's backward recomputes the scores Q K^T (5 matmuls where eager's takes 4): hardware
            # FLOPs, which torch counts and model FLOPs leave out
            expected += layers * 2 * 5 * 11 * 11 * hidden
        else:
            # older torch (2.6, the floors) has no FLOP formula for the CPU flash kernel: it counts no attention
            # at all, so only the linear layers can be checked against it
            expected -= 3 * layers * 4 * 5 * 11 * 11 * hidden
    assert counter.get_total_flops() == expected
    # the attention term grows with the square of the length: other lengths give other counts
    assert encoder_training_flops(config, [11] * 5) != encoder_training_flops(config, [10, 12, 11, 11, 11])


def test_the_simcse_head_adds_its_dense_layer(tiny_model):
    model = SimCSEModel.from_pretrained(tiny_model, pooler="cls")
    model.encoder.set_attn_implementation("eager")
    model.encoder.pooler = None  # BERT's own pooler (frozen, unused by SimCSE) is not part of the model FLOPs
    batch = {"input_ids": torch.randint(1000, 2000, (4, 9)), "attention_mask": torch.ones(4, 9, dtype=torch.long)}

    def step():
        first, second = model(**batch, num_views=2)
        (first * second).sum().backward()

    expected = encoder_training_flops(model.encoder.config, [9] * 8, head=True)
    assert counted_flops(step) == expected
    assert expected - encoder_training_flops(model.encoder.config, [9] * 8) == 3 * 2 * 8 * 32 * 32


def test_configs_without_the_sizes_count_nothing():
    class Unknown:
        hidden_size = 64  # no layer count or feed-forward size

    assert encoder_dimensions(Unknown()) is None and encoder_training_flops(Unknown(), [3, 4]) is None
    distilbert_like = type("DistilBertLike", (), {"dim": 64, "n_layers": 2, "hidden_dim": 128})()
    assert encoder_dimensions(distilbert_like) == (64, 2, 128)


def test_the_peak_is_positive_and_draws_nothing_from_the_run_s_random_stream():
    torch.manual_seed(7)
    before = torch.get_rng_state()
    peak = matmul_peak_flops(torch.float32, size=256, seconds=0.01)
    assert math.isfinite(peak) and peak > 1e8  # any CPU does more than 0.1 GFLOP/s on a 256 GEMM
    assert torch.equal(torch.get_rng_state(), before)


def test_the_peak_is_the_best_timed_call_on_a_fake_clock(monkeypatch):
    """With a clock that only moves inside the GEMM (3, 1, 2 ms in turn) the peak is the fastest call's rate."""
    from itertools import cycle

    from simcse_weince.training import flops

    clock, durations, real_mm = [0.0], cycle([3e-3, 1e-3, 2e-3]), torch.mm

    def timed_mm(*args, **kwargs):
        clock[0] += next(durations)
        return real_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "mm", timed_mm)
    monkeypatch.setattr(flops.time, "perf_counter", lambda: clock[0])
    assert matmul_peak_flops(torch.float32, size=64, seconds=0.02) == pytest.approx(2 * 64**3 / 1e-3)


def test_the_trainer_counts_every_real_token_of_an_epoch(tiny_model, tmp_path, data_dir):
    """One epoch of 6 batches of 16 sees each of the 96 sentences once, twice encoded: its model FLOPs are the
    formula over their real (truncated) lengths, whatever the batches' order and padding."""
    model = Path(tiny_model)
    train_file = write_train_file(tmp_path / "train.txt", data_dir, lines=96)
    config = preset(
        "paper", model=str(model), train_file=str(train_file), pooler="cls", batch_size=16, num_epochs=1,
        eval_steps=0, save_steps=0, final_evaluation=False, eval_before_training=False, report_to=[],
        output_dir=str(tmp_path / "run"), max_length=24, mixed_precision="no",
    )  # fmt: skip
    results = train(config)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    sentences = [line for line in train_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    lengths = [len(ids) for ids in tokenizer(sentences, truncation=True, max_length=24)["input_ids"]]
    bert = json.loads((model / "config.json").read_text())
    expected = encoder_training_flops(BertConfig(**bert), lengths * 2, head=True)
    history = results["history"]
    assert history[-1]["model_flops"] == expected
    assert [entry["model_flops"] for entry in history] == sorted({entry["model_flops"] for entry in history})
    assert results["model_flops_per_second"] == pytest.approx(expected / results["train_seconds"])
    assert results["mfu"] == pytest.approx(results["model_flops_per_second"] / results["peak_flops_per_second"])
    assert results["peak_precision"] == "fp32" and 0 < results["mfu"] < 1


def test_bench_train_prints_both_trainers_utilisation_and_the_formula_check(tiny_model, tmp_path, data_dir):
    import re
    import subprocess
    import sys

    from train_helpers import REPO_ROOT, subprocess_env

    model = tiny_model
    command = [sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_train.py"), "--steps", "1",
               "--warmup", "1", "--rounds", "1", "--batch-size", "8", "--model", str(model), "--data-dir",
               str(data_dir), "--configs", "st fp32,ours fp32"]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    formula = r"formula ([0-9.]+) GFLOP, torch.utils.flop_counter ([0-9.]+) GFLOP \(ratio ([0-9.]+)\)"
    check = re.search(formula, result.stdout)
    assert check and check.group(1) == check.group(2) and check.group(3) == "1.000000", result.stdout
    assert re.search(r"measured matmul peak \(best of 1 rounds, \d+ threads\): fp32 \d+ GFLOP/s", result.stdout)
    # one tiny step's rates are noise; that each trainer's line carries its FLOP/s and fraction is what is checked
    for name in ("st fp32", "ours fp32"):
        line = re.search(rf"  {name} +[0-9.]+ sent/s +([0-9.]+) GFLOP/s +([0-9.]+)% of the fp32 peak", result.stdout)
        assert line and float(line.group(2)) < 100, result.stdout
    assert "FLOP utilisation of the measured peak, defaults: fp32 ours" in result.stdout


def test_bench_matmul_shapes_runs_at_a_small_size():
    import subprocess
    import sys

    from train_helpers import REPO_ROOT, subprocess_env

    command = [sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_matmul_shapes.py"), "--hidden", "32",
               "--feed-forward", "64", "--tokens", "40", "--seconds", "0.01"]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("a layer's linear matmuls together") == 2  # fp32 and bf16
    assert "weight gradient, h x ff" in result.stdout


def test_a_run_resumed_from_a_checkpoint_without_flop_counts_reports_no_mfu(
    tiny_model, tmp_path, data_dir, monkeypatch
):
    """A checkpoint of an earlier release has no model_flops: the resumed run cannot know its earlier steps' FLOPs,
    so results.json reports no MFU rather than one computed over part of the steps and all of the time."""
    from simcse_weince.training import loop
    from simcse_weince.training.signals import Interrupted

    model = tiny_model
    train_file = write_train_file(tmp_path / "train.txt", data_dir, lines=64)
    config = preset(
        "paper", model=str(model), train_file=str(train_file), pooler="cls", batch_size=16, max_steps=4,
        eval_steps=0, save_steps=0, final_evaluation=False, report_to=[], output_dir=str(tmp_path / "run"),
        mixed_precision="no",
    )  # fmt: skip
    steps = iter(range(1, 100))
    monkeypatch.setattr(loop, "stop_requested", lambda *args: next(steps) == 2)  # as a Ctrl-C after step 2
    fresh_state = loop.new_trainer_state

    def earlier_release_state(*args, **extra):  # the trainer state before model_flops was in it
        state = fresh_state(*args, **extra)
        del state["model_flops"]
        return state

    monkeypatch.setattr(loop, "new_trainer_state", earlier_release_state)
    with pytest.raises(Interrupted):
        train(config)
    monkeypatch.undo()
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("step-*")
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == 2 and "model_flops" not in state
    resumed = train(config, resume=True)
    assert resumed["resumed_from_step"] == 2 and "mfu" not in resumed and "model_flops_per_second" not in resumed
