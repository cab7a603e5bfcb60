"""Encoding real tokens only: length-sorted chunks (our trainer) and the GradCache token budget
(sentence-transformers' mechanism, in CachedWeinceLoss) give the embeddings, loss and gradients of the padded
batch, while the encoder sees fewer padding positions."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers import SentenceTransformer
from train_helpers import assert_grads_close

from simcse_weince import CachedWeinceLoss, WeinceConfig, WeinceLoss
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.config import preset, resolve_length_chunks
from simcse_weince.text.data import PaddingCollator
from simcse_weince.text.fast_path import TrainingForward
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import forward_backward

BATCH = 24
CONFIG = WeinceConfig(quantile=0.3)  # a tail of a few points at this batch size


@pytest.fixture(scope="module")
def accelerator(one_thread):
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.fixture(scope="module")
def sentences(wiki_sentences):
    # random wiki sentences: lengths from a few tokens to the 32-token cap, so padding is substantial
    generator = torch.Generator().manual_seed(0)
    picks = torch.randperm(len(wiki_sentences), generator=generator)[:BATCH].tolist()
    return [wiki_sentences[i] for i in picks]


def _batch(model, sentences):
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    return collate([model.tokenizer(text, truncation=True, max_length=32) for text in sentences])


class EncoderInputs:
    """Records the (rows, width) of every encoder call: how many positions, padding included, it processed."""

    def __init__(self, encoder: torch.nn.Module):
        self.shapes: list[tuple[int, int]] = []
        self.handle = encoder.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(input_ids, dict):  # a sentence-transformers module gets the features dict
            input_ids = input_ids["input_ids"]
        self.shapes.append(tuple(input_ids.shape))

    @property
    def positions(self) -> int:
        return sum(rows * width for rows, width in self.shapes)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _assert_close(actual, expected, tolerance=1e-5):
    scale = expected.abs().max().item()
    assert scale > 0
    difference = (actual - expected).abs().max().item()
    assert difference <= tolerance * scale, f"{difference} (largest value {scale})"


@pytest.mark.parametrize("pooler", ["avg", "cls"])
@pytest.mark.parametrize("length_chunks", [2, 4, 7])
def test_length_sorted_chunks_give_the_padded_embeddings(minilm_path, sentences, one_thread, pooler, length_chunks):
    torch.manual_seed(0)  # the cls pooler's MLP head
    model = SimCSEModel.from_pretrained(minilm_path, pooler=pooler, dropout=0.0).train()
    batch = _batch(model, sentences)
    assert (batch["attention_mask"] == 0).any(), "the batch must hold padding for the test to mean anything"
    with torch.no_grad():
        with EncoderInputs(model.encoder) as padded_inputs:
            padded = model(**batch, num_views=2)
        model.training_forward = TrainingForward(length_chunks=length_chunks)  # the encoder's own forward per chunk
        with EncoderInputs(model.encoder) as chunked_inputs:
            chunked = model(**batch, num_views=2)
    for view, expected in zip(chunked, padded, strict=True):
        _assert_close(view, expected)
    # the same rows, fewer positions: each chunk is padded only to its own longest sentence
    assert len(chunked_inputs.shapes) == length_chunks
    assert sum(rows for rows, _ in chunked_inputs.shapes) == 2 * BATCH
    real_tokens = 2 * int(batch["attention_mask"].sum())
    assert real_tokens <= chunked_inputs.positions < padded_inputs.positions


def test_trainer_step_with_length_chunks_gives_the_padded_loss_and_gradients(minilm_path, sentences, accelerator):
    model = SimCSEModel.from_pretrained(minilm_path, pooler="avg", dropout=0.0).train()
    batch = _batch(model, sentences)
    objective = ContrastiveObjective("weince", 0.05, weince=CONFIG)

    def step(length_chunks, **options):
        model.training_forward = TrainingForward(length_chunks=length_chunks)
        model.zero_grad(set_to_none=True)
        loss, diagnostics = forward_backward(model, batch, objective, accelerator, **options)
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return loss.item(), diagnostics, grads

    expected_loss, expected_diagnostics, expected_grads = step(length_chunks=1)
    for options in ({"length_chunks": 4}, {"length_chunks": 3, "mini_batch_size": 10}):  # also under GradCache
        loss, diagnostics, grads = step(**options)
        assert loss == pytest.approx(expected_loss, rel=1e-5), options
        assert_grads_close(grads, expected_grads)
        for name, statistic in expected_diagnostics.items():
            assert diagnostics[name].item() == pytest.approx(statistic.item(), rel=1e-4, abs=1e-5), (options, name)


@pytest.mark.parametrize("amx", [True, False])
def test_length_chunks_are_validated_and_auto_follows_precision_and_cpu(monkeypatch, amx):
    # auto (issue 26, bench_train.py): chunks pay in fp32 everywhere and under bf16 on a CPU without AMX; on a CPU
    # with AMX tiles, and on an accelerator, one padded forward under bf16/fp16
    from simcse_weince import compat, precision

    monkeypatch.setattr(compat, "cpu_has_avx512_bf16", lambda: True)
    monkeypatch.setattr(compat, "cpu_has_amx_tiles", lambda: amx)
    assert precision.amx_tiles() is amx
    assert preset("cpu-demo").speed.length_chunks == "auto"
    chunks = resolve_length_chunks("auto", "no")
    assert chunks > 1 and resolve_length_chunks("auto", "no", "cuda") == chunks
    assert resolve_length_chunks("auto", "bf16") == (1 if amx else chunks)
    assert resolve_length_chunks("auto", "bf16", "cuda") == resolve_length_chunks("auto", "fp16", "cuda") == 1
    assert resolve_length_chunks(3, "bf16") == resolve_length_chunks(3, "bf16", "cuda") == 3  # explicit: kept
    with pytest.raises(ValueError, match="length_chunks must be >= 1"):
        preset("cpu-demo", length_chunks=0)
    with pytest.raises(ValueError, match="length_chunks must be an integer or 'auto'"):
        preset("cpu-demo", length_chunks="many")


def test_sentence_transformers_token_budget_gives_the_padded_loss_and_gradients(minilm_path, sentences, one_thread):
    """In the sentence-transformers losses the same effect comes from sentence-transformers' own GradCache token
    budget (CachedWeinceLoss(mini_batch_num_tokens=...)): mini-batches packed by real tokens, each trimmed to its
    own longest sentence. Same loss and gradients as the padded WeinceLoss, fewer positions encoded."""
    model = SentenceTransformer(minilm_path, device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    features = [model.preprocess(sentences), model.preprocess(sentences[::-1])]
    transformer = model[0]  # the Transformer module

    def loss_and_grads(loss_fn):
        model.zero_grad(set_to_none=True)
        with EncoderInputs(transformer) as inputs:
            loss = loss_fn([dict(f) for f in features])
            loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return loss.item(), grads, inputs

    expected_loss, expected_grads, padded_inputs = loss_and_grads(WeinceLoss(model, weince=CONFIG))
    loss, grads, budget_inputs = loss_and_grads(CachedWeinceLoss(model, weince=CONFIG, mini_batch_num_tokens=96))
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert_grads_close(grads, expected_grads)
    # GradCache encodes every sentence twice (without and with a graph): compare one pass with the padded forward
    assert budget_inputs.positions // 2 < padded_inputs.positions
