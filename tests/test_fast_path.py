"""The fast training forward's one entry point (``simcse_weince/text/fast_path/``): it checks itself by running
before the first step, and a transformers release that breaks what it reaches below the public API makes training
fall back to a plainer forward with exactly one warning, never fail (issue 37: transformers 5.25 did)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from simcse_weince.text.config import SpeedConfig, preset
from simcse_weince.text.fast_path import (
    CHECK_TOLERANCE,
    TrainingForward,
    build_training_forward,
    check_batch,
    check_batches,
    check_lengths,
    check_training_forward,
)
from simcse_weince.text.fast_path.onednn_linear import onednn_linear_available
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import train

TRAIN_LINES = 200  # the train_file fixture's sentences (conftest.py)
FAST_PATH_LOGGER = "simcse_weince.text.fast_path"


@pytest.fixture(scope="module")
def minilm_encoder(minilm_path, one_thread):
    return SimCSEModel.from_pretrained(minilm_path, pooler="cls").encoder


def _build(encoder, length_chunks=4, mixed_precision="no", max_length=32, **speed) -> TrainingForward:
    return build_training_forward(
        encoder, SpeedConfig(**speed), length_chunks=length_chunks, mixed_precision=mixed_precision,
        max_length=max_length,
    )  # fmt: skip


def make_tiny_bert(positions: int):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=positions)  # fmt: skip
    return BertModel(config)


def _fast_path_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FAST_PATH_LOGGER and r.levelno >= logging.WARNING]


# ------------------------------------------------------------------------------------------ the check


@pytest.mark.parametrize("onednn_linear", [False, True], ids=["torch-linear", "onednn-linear"])
def test_the_fast_path_passes_its_check_on_the_installed_transformers(minilm_encoder, caplog, onednn_linear):
    if onednn_linear and not onednn_linear_available():
        pytest.skip("this torch has no oneDNN linear op")
    before = torch.get_rng_state()
    minilm_encoder.train()
    forward = _build(minilm_encoder, onednn_linear=onednn_linear)
    assert forward.report["path"] == "fast" and forward.report["reason"] is None
    assert forward.unpadded_layers and forward.onednn_linear is onednn_linear and forward.length_chunks == 4
    assert forward.report["unpadded_layers"] is True and forward.report["check_seconds"] >= 0
    assert torch.equal(torch.get_rng_state(), before)  # eval mode: the check draws nothing from the stream
    assert minilm_encoder.training  # and leaves the mode as it found it
    assert not any(p.grad is not None for p in minilm_encoder.parameters())  # nor gradients in .grad
    assert _fast_path_warnings(caplog) == []


def test_the_check_compares_every_row_and_the_gradients(minilm_encoder):
    """The check is not vacuous: a forward that is wrong in one row, or only in its gradient, fails it."""
    batch = check_batch(minilm_encoder)
    assert (batch["attention_mask"] == 0).any() and len(set(batch["attention_mask"].sum(1).tolist())) > 2

    class WrongRow(TrainingForward):
        def __call__(self, encoder, inputs, pool):
            out = super().__call__(encoder, inputs, pool)
            return torch.cat([out[:-1], out[-1:] * 1.01])

    class WrongGradient(TrainingForward):
        def __call__(self, encoder, inputs, pool):
            out = super().__call__(encoder, inputs, pool)
            return out.detach() + (out - out.detach()) * 1.05  # same values, gradients 5% off

    def check(candidate):
        return check_training_forward(minilm_encoder, candidate, max_length=16)

    assert check(TrainingForward(length_chunks=4, unpadded_layers=True)) is None
    assert "outputs differ" in check(WrongRow(length_chunks=2))
    assert "gradients differ" in check(WrongGradient(length_chunks=2))
    assert CHECK_TOLERANCE < 1e-2  # a wrong row by 1% would never pass


# ------------------------------------------------------------------------- simulated transformers breaks


def _changed_signature(config, embeddings, attention_mask, cache_position):  # a required argument added, as in 5.25
    raise AssertionError("never called with its new argument")


def _wrong_mask(original, longer_than=0):
    """A mask builder that ignores the padding (returns what it returns for an all-real batch) of batches wider than
    ``longer_than`` tokens."""

    def builder(config, embeddings, attention_mask, *args, **kwargs):
        if attention_mask.shape[1] > longer_than:
            attention_mask = torch.ones_like(attention_mask)
        return original(config, embeddings, attention_mask, *args, **kwargs)

    return builder


# issue 54 case 10: a change that breaks only rows longer than the check's once were (2-9 tokens) passed the check,
# the run said "fast", and its step losses differed from the stock forward's
@pytest.mark.parametrize("break_kind", ["signature", "wrong-mask", "wrong-mask-beyond-9-tokens"])
def test_a_broken_release_trains_on_the_stock_forward_with_one_warning(
    tiny_model, train_file, tmp_path, monkeypatch, caplog, break_kind
):
    from transformers import masking_utils

    def run(name: str) -> dict:
        config = preset(
            "paper", model=tiny_model, train_file=train_file, pooler="avg", batch_size=16, max_steps=3,
            eval_steps=0, save_steps=0, final_evaluation=False, report_to=["csv"], mixed_precision="no",
            length_chunks=2, output_dir=str(tmp_path / name), **({"unpadded_layers": False} if name == "stock" else {}),
        )  # fmt: skip
        return train(config)

    stock = run("stock")  # the reference: the encoder's own forward in two length chunks
    original = masking_utils.create_bidirectional_mask
    broken = _changed_signature if break_kind == "signature" else _wrong_mask(original, 9 * ("beyond" in break_kind))
    monkeypatch.setattr(masking_utils, "create_bidirectional_mask", broken)
    with caplog.at_level(logging.WARNING):
        results = run("broken")
    warnings = _fast_path_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "transformers " in warnings[0] and "torch " in warnings[0]  # it names the versions
    assert ("TypeError" if break_kind == "signature" else "outputs differ") in warnings[0]
    report = results["training_forward"]
    assert report["path"] == "fallback" and report["unpadded_layers"] is False and report["reason"]
    assert results["unpadded_layers"] is False and results["length_chunks"] == 2
    # the run completed, on the same forward as the stock run: the same step losses, bit for bit
    assert [e["loss"] for e in results["history"]] == [e["loss"] for e in stock["history"]]
    on_disk = json.loads((tmp_path / "broken" / "results.json").read_text())
    assert on_disk["training_forward"]["path"] == "fallback"


def test_the_check_runs_the_shapes_training_sees():
    """Rows up to the run's max_length, every length chunk padded, and a batch with no padding at all."""
    for max_length, length_chunks in ((32, 4), (32, 1), (128, 8), (5, 4), (2, 1), (3, 2)):
        batches = check_lengths(max_length, length_chunks)
        forwards = []  # the row lengths of each forward the fast path runs, split as it splits them
        for lengths in batches:
            ordered = sorted(lengths, reverse=True)
            forwards += [list(chunk) for chunk in np.array_split(ordered, min(length_chunks, len(ordered)))]
            assert lengths != ordered or len(set(lengths)) == 1  # the forward's sort is exercised
        assert max(max(lengths) for lengths in batches) == max_length and min(min(b) for b in batches) == 2
        assert any(len(set(rows)) == 1 for rows in forwards), "a forward without padding"
        if max_length > 2:
            assert any(len(set(rows)) > 1 for rows in forwards), "a forward with padding"
    capped = check_batches(make_tiny_bert(positions=24), max_length=64, length_chunks=1)
    assert [batch["attention_mask"].shape[1] for batch in capped] == [24, 24]  # at most the model's positions


def test_a_break_under_the_runs_precision_only_falls_back(minilm_encoder, monkeypatch, caplog):
    """A mask builder that fails under autocast only: the fp32 check alone passed it, and a bf16 run then failed at
    its first step. The check runs in the run's precision too."""
    from transformers import masking_utils

    original = masking_utils.create_bidirectional_mask

    def no_autocast(config, embeddings, attention_mask, *args, **kwargs):
        if torch.is_autocast_enabled(embeddings.device.type):
            raise TypeError("simulated: this release's mask builder refuses autocast")
        return original(config, embeddings, attention_mask, *args, **kwargs)

    monkeypatch.setattr(masking_utils, "create_bidirectional_mask", no_autocast)
    assert _build(minilm_encoder, mixed_precision="no", max_length=12).report["path"] == "fast"  # fp32 runs: fine
    with caplog.at_level(logging.WARNING):
        forward = _build(minilm_encoder, mixed_precision="bf16", max_length=12)
    assert forward.report["path"] == "fallback" and not forward.unpadded_layers
    reason = forward.report["reason"]
    assert "TypeError: simulated: this release's mask builder refuses autocast, on 5 rows of 2-12 tokens in bf16" in (
        reason
    )
    assert len(_fast_path_warnings(caplog)) == 1


def test_a_fallback_that_also_fails_ends_on_the_stock_forward(minilm_encoder, monkeypatch, caplog):
    """If even the length chunks on the encoder's own forward disagree, the stock forward (one padded batch) runs."""
    from simcse_weince.text import fast_path

    monkeypatch.setattr(fast_path, "check_training_forward", lambda encoder, candidate, **_: "simulated failure")
    with caplog.at_level(logging.WARNING):
        forward = _build(minilm_encoder)
    assert forward.report["path"] == "stock" and forward.length_chunks == 1 and not forward.unpadded_layers
    warnings = _fast_path_warnings(caplog)
    assert len(warnings) == 1 and warnings[0].count("simulated failure") == 2


def test_the_speed_section_keeps_the_old_flags_and_files(tmp_path):
    from simcse_weince.settings import load_config, read_config_file
    from simcse_weince.text.config import TrainConfig

    config = preset("cpu-demo", length_chunks=2, onednn_linear=False)  # today's top-level names
    assert config.speed == SpeedConfig(length_chunks=2, unpadded_layers=True, onednn_linear=False, compile=False)
    assert preset("cpu-demo", speed={"compile": True}).speed.compile is True
    old = tmp_path / "old.yaml"  # a run folder's training_config.yaml from before the section
    old.write_text("length_chunks: 3\nunpadded_layers: false\n", encoding="utf-8")
    assert load_config(TrainConfig, old).speed == SpeedConfig(length_chunks=3, unpadded_layers=False)
    new = tmp_path / "new.yaml"
    new.write_text("speed:\n  length_chunks: 5\n", encoding="utf-8")
    assert read_config_file(new) == {"speed.length_chunks": 5}
    assert load_config(TrainConfig, new).speed.length_chunks == 5
    with pytest.raises(ValueError, match="unknown speed setting 'chunks'"):
        preset("cpu-demo", **{"speed.chunks": 2})
