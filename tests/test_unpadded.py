"""BERT's forward with the linear layers on the real tokens only (``text/fast_path/unpadded.py``) computes what
the padded Hugging Face forward computes, with the same dropout masks and the same random stream afterwards, so
the trainer's steps (losses, gradients) do not change; encoders it does not reproduce keep their own forward."""

from __future__ import annotations

import pytest
import torch
from train_helpers import assert_grads_close

from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.config import SpeedConfig
from simcse_weince.text.data import PaddingCollator
from simcse_weince.text.fast_path import TrainingForward, build_training_forward
from simcse_weince.text.fast_path.onednn_linear import onednn_linear_available
from simcse_weince.text.fast_path.unpadded import supports_unpadded, unpadded_bert_forward
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import forward_backward

#: the oneDNN cases run where this torch has the op; elsewhere they repeat torch's own linear layers
ONEDNN = onednn_linear_available()


@pytest.fixture(scope="module")
def model(minilm_path, one_thread):
    return SimCSEModel.from_pretrained(minilm_path, pooler="cls")  # dropout 0.1 from the model's config


@pytest.fixture(scope="module")
def batch(model, wiki_sentences):
    picks = torch.randperm(len(wiki_sentences), generator=torch.Generator().manual_seed(1))[:20].tolist()
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    batch = collate([model.tokenizer(wiki_sentences[i], truncation=True, max_length=32) for i in picks])
    assert (batch["attention_mask"] == 0).any(), "the batch must hold padding for the tests to mean anything"
    return batch


def _both_forwards(encoder, batch, seed=0, onednn_linear=False):
    """The padded and the unpadded last hidden state from the same seed, and the random state after each."""
    torch.manual_seed(seed)
    padded = encoder(**batch).last_hidden_state
    after_padded = torch.get_rng_state()
    torch.manual_seed(seed)
    unpadded = unpadded_bert_forward(encoder, **batch, onednn_linear=onednn_linear)
    return padded, unpadded, after_padded, torch.get_rng_state()


@pytest.mark.parametrize("onednn_linear", [False, ONEDNN], ids=["torch-linear", "onednn-linear"])
@pytest.mark.parametrize("training", [True, False], ids=["dropout", "eval"])
def test_unpadded_forward_equals_the_padded_one(model, batch, training, onednn_linear):
    encoder = model.encoder.train(training)
    assert supports_unpadded(encoder) and encoder.config.hidden_dropout_prob > 0
    padded, unpadded, after_padded, after_unpadded = _both_forwards(encoder, batch, onednn_linear=onednn_linear)
    real = batch["attention_mask"].bool()
    scale = padded[real].abs().max().item()
    assert (unpadded[real] - padded[real]).abs().max().item() <= 1e-5 * scale
    assert torch.equal(after_unpadded, after_padded)  # the same number of random draws: the next masks agree too
    assert not unpadded[~real].any()  # padding rows are zeros, never read by the poolers
    if training:  # the masks are really applied: another seed gives other hidden states
        _, other, _, _ = _both_forwards(encoder, batch, seed=1)
        assert (other[real] - unpadded[real]).abs().max().item() > 1e-2 * scale
    encoder.train()


def test_unpadded_forward_under_bf16_autocast(model, batch):
    encoder = model.encoder.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        padded, unpadded, after_padded, after_unpadded = _both_forwards(encoder, batch)
    real = batch["attention_mask"].bool()
    assert unpadded.dtype == padded.dtype
    # the same bf16 operations on the same rows; a bf16 ulp of slack for a kernel that blocks rows differently
    scale = padded[real].float().abs().max().item()
    assert (unpadded[real].float() - padded[real].float()).abs().max().item() <= 2e-2 * scale
    assert torch.equal(after_unpadded, after_padded)


def test_unpadded_forward_with_token_types_and_without_padding(model, batch):
    encoder = model.encoder.train()
    token_types = torch.zeros_like(batch["input_ids"])
    token_types[:, 3:] = 1  # a second segment: the token-type embeddings are read, not the defaults
    inputs = {**batch, "token_type_ids": token_types}
    padded, unpadded, _, _ = _both_forwards(encoder, inputs)
    real = batch["attention_mask"].bool()
    assert (unpadded[real] - padded[real]).abs().max().item() <= 1e-5 * padded[real].abs().max().item()
    full = {name: value[:, :4] for name, value in batch.items()}  # every sentence has >= 4 tokens: no padding
    assert full["attention_mask"].all()
    padded, unpadded, _, _ = _both_forwards(encoder, full)
    assert (unpadded - padded).abs().max().item() <= 1e-5 * padded.abs().max().item()


def test_eager_attention_is_reproduced_too(one_thread):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, attn_implementation="eager")  # fmt: skip
    encoder = BertModel(config).train()  # dropout 0.1 in attention and hidden states
    assert encoder.config._attn_implementation == "eager" and supports_unpadded(encoder)
    input_ids = torch.randint(1, 50, (5, 9))
    attention_mask = (torch.arange(9) < torch.tensor([[9], [3], [7], [1], [5]])).long()
    padded, unpadded, after_padded, after_unpadded = _both_forwards(
        encoder, {"input_ids": input_ids, "attention_mask": attention_mask}
    )
    real = attention_mask.bool()
    assert (unpadded[real] - padded[real]).abs().max().item() <= 1e-5 * padded[real].abs().max().item()
    assert torch.equal(after_unpadded, after_padded)


def test_other_encoders_and_compiled_models_keep_their_own_forward(model):
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    roberta = RobertaModel(RobertaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                         intermediate_size=64))  # fmt: skip
    decoder = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=64, is_decoder=True))  # fmt: skip
    assert not supports_unpadded(roberta) and not supports_unpadded(decoder)

    def built(encoder, **speed):
        return build_training_forward(
            encoder, SpeedConfig(**speed), length_chunks=1, mixed_precision="no", max_length=32
        )

    assert built(roberta).unpadded_layers is False and built(roberta).report["path"] == "fast"  # nothing to check
    assert built(model.encoder, unpadded_layers=False).unpadded_layers is False
    assert built(model.encoder).unpadded_layers is True
    # a compiled forward is the HF one (no silent bypass); the compile itself is not run here (lazy, and slow)
    import torch as torch_module

    original = torch_module.compile
    torch_module.compile = lambda function, **options: function
    try:
        compiled = built(model.encoder, compile=True)
    finally:
        torch_module.compile = original
    assert compiled.unpadded_layers is False and compiled.compiled is not None


@pytest.mark.parametrize("onednn_linear", [False, ONEDNN], ids=["torch-linear", "onednn-linear"])
@pytest.mark.parametrize("length_chunks", [1, 4])
def test_a_training_step_is_unchanged(model, batch, length_chunks, onednn_linear, monkeypatch):
    """The trainer's forward and backward (dropout on, WEINCE, length chunks): the same loss and gradients, with
    torch's fp32 linear layers and with oneDNN's."""
    from accelerate import Accelerator

    from simcse_weince.text.fast_path import onednn_linear as onednn_module

    onednn_calls = []
    original = onednn_module._linear_pointwise
    monkeypatch.setattr(onednn_module, "_linear_pointwise", lambda *args: onednn_calls.append(1) or original(*args))
    accelerator = Accelerator(cpu=True)
    objective = ContrastiveObjective("weince", 0.05, geometry="simcse")
    results = {}
    for unpadded in (False, True):
        model.train().training_forward = TrainingForward(
            length_chunks=length_chunks, unpadded_layers=unpadded, onednn_linear=unpadded and onednn_linear
        )
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        loss, _ = forward_backward(model, batch, objective, accelerator)
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        results[unpadded] = (loss.item(), grads)
    # 6 layers x 6 linear layers x chunks: a forward each, and an input gradient each (the first query, key and
    # value projections' inputs are the embeddings, which need one too)
    assert len(onednn_calls) == (2 * 36 * length_chunks if onednn_linear else 0)
    model.training_forward = None
    model.zero_grad(set_to_none=True)
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    assert_grads_close(results[True][1], results[False][1])


def test_chunks_look_up_the_word_embeddings_once(model, batch):
    """With the unpadded layers the length chunks share one word-embedding lookup (so the vocabulary-sized gradient
    is built once a step, not once a chunk); the padded forward keeps one per chunk. Same embeddings either way."""
    lookups = []
    hook = model.encoder.get_input_embeddings().register_forward_hook(lambda *unused: lookups.append(1))
    embeddings = {}
    try:
        for unpadded in (False, True):
            model.train().training_forward = TrainingForward(length_chunks=4, unpadded_layers=unpadded)
            lookups.clear()
            torch.manual_seed(5)
            first, second = model(**batch, num_views=2)
            embeddings[unpadded] = torch.cat([first, second]).detach()
            assert len(lookups) == (1 if unpadded else 4)
    finally:
        hook.remove()
        model.training_forward = None
    scale = embeddings[False].abs().max().item()
    torch.testing.assert_close(embeddings[True], embeddings[False], rtol=1e-5, atol=1e-5 * scale)


def test_unpadded_forward_from_looked_up_word_embeddings(model, batch):
    encoder = model.encoder.train()
    words = encoder.get_input_embeddings()(batch["input_ids"])
    torch.manual_seed(0)
    from_ids = unpadded_bert_forward(encoder, **batch)
    torch.manual_seed(0)
    rest = {name: value for name, value in batch.items() if name != "input_ids"}
    from_embeddings = unpadded_bert_forward(encoder, inputs_embeds=words, **rest)
    assert torch.equal(from_ids, from_embeddings)


def test_rounding_the_row_count_changes_no_number_beyond_rounding(model, batch, monkeypatch):
    """The layers compute padding tokens' rows up to a multiple of ROW_MULTIPLE (one kernel shape for many
    batches); the real tokens' hidden states, the padding's zeros, the random stream and the weight gradients are
    those of the real rows alone."""
    from simcse_weince.text.fast_path import unpadded

    encoder = model.encoder.train()
    real = batch["attention_mask"].bool()
    computed, real_count = unpadded._computed_rows(batch["attention_mask"])
    assert real_count == int(real.sum()) and len(computed) % unpadded.ROW_MULTIPLE == 0 and len(computed) > real_count

    def forward_and_gradients(multiple):
        monkeypatch.setattr(unpadded, "ROW_MULTIPLE", multiple)
        encoder.zero_grad()
        torch.manual_seed(0)
        hidden = unpadded_bert_forward(encoder, **batch)
        (hidden[real].sin().sum()).backward()
        gradients = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        return hidden.detach(), torch.get_rng_state(), gradients

    rounded, rng_rounded, grads_rounded = forward_and_gradients(64)
    assert len(grads_rounded) > 10
    exact, rng_exact, grads_exact = forward_and_gradients(1)
    assert torch.equal(rng_rounded, rng_exact) and not rounded[~real].any()
    assert (rounded - exact).abs().max().item() <= 1e-5 * exact.abs().max().item()
    for name, gradient in grads_exact.items():
        scale = gradient.abs().max().item()
        assert (grads_rounded[name] - gradient).abs().max().item() <= 1e-5 * scale + 1e-12, name


def test_bench_row_counts_runs_at_a_small_size():
    """The script behind ROW_MULTIPLE's measurement prints the three timings side by side."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "benchmarks" / "bench_row_counts.py"
    done = subprocess.run(
        [sys.executable, str(script), "--dtype", "fp32", "--shapes", "3"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert "3 new row counts" in line and "the same again (cached)" in line and "rounded up to 64 (1 shapes)" in line
