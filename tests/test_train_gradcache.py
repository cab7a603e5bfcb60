"""--mini-batch-size in the trainer (GradCache): the loss and gradients of the whole batch, in bounded memory."""

from __future__ import annotations

import shutil

import pytest
import torch
from train_helpers import assert_grads_close

from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.config import preset
from simcse_weince.text.data import PaddingCollator
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import forward_backward, train
from simcse_weince.weince.loss import WeinceConfig

TRAIN_LINES = 200  # the train_file fixture's sentences (conftest.py)
BATCH = 16


@pytest.fixture(scope="module")
def accelerator(one_thread):
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def _batch(model, wiki_sentences):
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    return collate([model.tokenizer(text, truncation=True, max_length=32) for text in wiki_sentences[:BATCH]])


def _step(model, batch, accelerator, mini_batch_size, loss="weince", seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    objective = ContrastiveObjective(loss, 0.05, weince=WeinceConfig(quantile=0.3))
    value, diagnostics = forward_backward(model, batch, objective, accelerator, mini_batch_size)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return value.item(), diagnostics, grads


@pytest.mark.parametrize("loss", ["weince", "infonce"])
@pytest.mark.parametrize("mini_batch_size", [4, 5])  # divides the batch of 16, does not
def test_mini_batches_give_the_loss_and_gradients_of_the_whole_batch(
    tiny_model, wiki_sentences, accelerator, loss, mini_batch_size
):
    model = SimCSEModel.from_pretrained(tiny_model, pooler="avg", dropout=0.0).train()
    batch = _batch(model, wiki_sentences)
    expected_loss, expected_diagnostics, expected_grads = _step(model, batch, accelerator, None, loss)
    value, diagnostics, grads = _step(model, batch, accelerator, mini_batch_size, loss)
    assert value == pytest.approx(expected_loss, rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)
    assert diagnostics.keys() == expected_diagnostics.keys()
    for name, statistic in expected_diagnostics.items():
        assert diagnostics[name].item() == pytest.approx(statistic.item(), rel=1e-4, abs=1e-5)


def test_dropout_masks_are_replayed(tiny_model, wiki_sentences, accelerator):
    """With dropout on and one chunk, the first pass draws exactly the masks of the uncached forward (same RNG
    state, same shapes) and the replay reuses them: the same loss and gradients, and the RNG state after the
    step is the uncached one (what resume relies on)."""
    model = SimCSEModel.from_pretrained(tiny_model, pooler="avg", dropout=0.1).train()
    batch = _batch(model, wiki_sentences)
    expected_loss, _, expected_grads = _step(model, batch, accelerator, None)
    expected_state = torch.get_rng_state()
    value, _, grads = _step(model, batch, accelerator, BATCH)
    assert torch.equal(torch.get_rng_state(), expected_state)
    assert value == pytest.approx(expected_loss, rel=1e-6)
    assert_grads_close(grads, expected_grads)
    # with several chunks the replay must also be exact: each chunk re-encoded as in the first pass
    replayed = []
    original_forward = model.forward

    def spy(*args, **kwargs):
        views = original_forward(*args, **kwargs)
        replayed.append(torch.cat(views).detach().clone())
        return views

    model.forward = spy
    _step(model, batch, accelerator, 5)
    assert len(replayed) == 8  # 4 chunks, encoded twice
    for first_pass, second_pass in zip(replayed[:4], replayed[4:]):
        assert torch.equal(first_pass, second_pass)


def test_mini_batch_size_is_validated():
    with pytest.raises(ValueError, match="mini_batch_size must be >= 1"):
        preset("paper", mini_batch_size=0)
    assert preset("paper").mini_batch_size is None
    assert preset("paper", mini_batch_size="none").mini_batch_size is None
    assert preset("paper", mini_batch_size="8").mini_batch_size == 8


def _config(tiny_model, train_file, output_dir, **overrides):
    # fp32 unless a test asks otherwise: under --mixed-precision auto a bf16-native CPU would round the chunked and
    # the whole-batch encodings differently, beyond the float32 tolerances these comparisons use
    settings = {
        "model": tiny_model, "train_file": train_file, "pooler": "cls", "batch_size": BATCH, "max_steps": 4,
        "eval_steps": 0, "save_steps": 2, "save_total_limit": 5, "learning_rate": 1e-3, "final_evaluation": False,
        "report_to": ["csv"], "output_dir": str(output_dir), "mixed_precision": "no", **overrides,
    }  # fmt: skip
    return preset("paper", **settings)


def test_trainer_with_mini_batches_and_accumulation_matches_the_whole_batch(tiny_model, train_file, tmp_path):
    common = {"dropout": 0.0, "gradient_accumulation_steps": 2, "max_steps": 2, "pooler": "avg"}
    whole = train(_config(tiny_model, train_file, tmp_path / "whole", **common))
    cached = train(_config(tiny_model, train_file, tmp_path / "cached", mini_batch_size=5, **common))
    for entry, expected in zip(cached["history"], whole["history"], strict=True):
        assert entry["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert entry["lambda_mean"] == pytest.approx(expected["lambda_mean"], rel=1e-4, abs=1e-5)


def test_trainer_resumes_exactly_with_mini_batches_and_mixed_precision(tiny_model, train_file, tmp_path):
    """Dropout on, bf16 autocast: a run resumed from its step-2 checkpoint repeats steps 3-4 bit for bit."""
    config = _config(tiny_model, train_file, tmp_path / "full", mini_batch_size=6, mixed_precision="bf16")
    full = train(config)
    assert len(full["history"]) == 4 and all(torch.isfinite(torch.tensor([e["loss"] for e in full["history"]])))
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full", resumed_dir)
    assert [path.name for path in (resumed_dir / "checkpoints").glob("step-*")] == ["step-0000002"]
    resumed = train(
        _config(tiny_model, train_file, resumed_dir, mini_batch_size=6, mixed_precision="bf16"), resume=True
    )
    assert resumed["resumed_from_step"] == 2
    assert [e["loss"] for e in resumed["history"]] == [e["loss"] for e in full["history"]]
