"""CachedWeinceLoss / CachedInfoNCELoss (GradCache): the loss and gradients of the uncached losses, any batch."""

from __future__ import annotations

import copy

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.gradcache import _create_minibatch
from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss
from sentence_transformers.util import cos_sim
from train_helpers import assert_grads_close, flat_parameters

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss
from simcse_weince.weince.loss import STATISTIC_KEYS, weince_loss

BATCH = 10
CONFIG = WeinceConfig(quantile=0.3)  # a tail of a few points even at batch 10


@pytest.fixture(scope="module")
def tiny_sentence_transformer(tiny_model, one_thread):
    return SentenceTransformer(tiny_model, device="cpu")


@pytest.fixture()
def model(tiny_sentence_transformer):
    model = copy.deepcopy(tiny_sentence_transformer)
    model.train()
    return model


def _dropout_off(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _columns(model, wiki_sentences, num_columns):
    return [model.preprocess(wiki_sentences[i * BATCH : (i + 1) * BATCH]) for i in range(num_columns)]


def _loss_and_grads(model, loss_fn, features, seed=0):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = loss_fn([dict(f) for f in features])
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("num_columns", [1, 2, 3])
@pytest.mark.parametrize("mini_batch_size", [5, 3])  # divides the batch of 10, does not
def test_cached_weince_equals_weince_with_dropout_off(model, wiki_sentences, num_columns, mini_batch_size):
    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, num_columns)
    expected_loss, expected_grads = _loss_and_grads(model, WeinceLoss(model, weince=CONFIG), features)
    cached = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=mini_batch_size)
    loss, grads = _loss_and_grads(model, cached, features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)
    assert set(cached.last_statistics) == set(STATISTIC_KEYS)


@pytest.mark.parametrize("num_columns", [1, 2])
def test_cached_infonce_equals_infonce_with_dropout_off(model, wiki_sentences, num_columns):
    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, num_columns)
    expected_loss, expected_grads = _loss_and_grads(model, InfoNCELoss(model), features)
    loss, grads = _loss_and_grads(model, CachedInfoNCELoss(model, mini_batch_size=4), features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)


def test_cached_infonce_equals_sentence_transformers_cached_mnrl(model, wiki_sentences):

    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, 3)
    mnrl = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=4)
    expected_loss, expected_grads = _loss_and_grads(model, lambda f: mnrl(f, None), features)
    loss, grads = _loss_and_grads(model, CachedInfoNCELoss(model, 20.0, mini_batch_size=4), features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)


@pytest.mark.parametrize("num_columns", [1, 2, 3])
@pytest.mark.parametrize("mini_batch_size", [5, 3])
def test_dropout_is_replayed_and_gradients_match_chunked_reference(model, wiki_sentences, num_columns, mini_batch_size):
    """With dropout on, the backward pass re-embeds exactly (bitwise) what the first pass embedded, and the
    gradients equal those of embedding the same chunks, in the same order and from the same seed, with grad."""
    assert any(m.p > 0 for m in model.modules() if isinstance(m, torch.nn.Dropout)), "dropout must be on"
    features = _columns(model, wiki_sentences, num_columns)
    cached = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=mini_batch_size)
    first_pass, second_pass = [], []
    sink = first_pass
    embed_minibatch = cached.embed_minibatch

    def spy(**kwargs):
        reps, random_state = embed_minibatch(**kwargs)
        sink.append(reps.detach().clone())
        return reps, random_state

    cached.embed_minibatch = spy
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    loss = cached([dict(f) for f in features])
    sink = second_pass
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    num_chunks = -(-BATCH // mini_batch_size) * max(num_columns, 2)
    assert len(first_pass) == len(second_pass) == num_chunks
    for first, second in zip(first_pass, second_pass):
        assert torch.equal(first, second)
    # the two passes over a single column drew different masks: a real dropout positive
    if num_columns == 1:
        assert not torch.equal(torch.cat(first_pass[: num_chunks // 2]), torch.cat(first_pass[num_chunks // 2 :]))

    def reference(features):
        columns = features if len(features) > 1 else [features[0], features[0]]
        embeddings = []
        for column in columns:
            chunks = []
            for begin in range(0, BATCH, mini_batch_size):
                chunk = _create_minibatch(column, begin, begin + mini_batch_size)  # same slicing as the loss
                chunks.append(model(chunk)["sentence_embedding"])
            embeddings.append(torch.cat(chunks))
        return WeinceLoss(model, weince=CONFIG).compute_loss_from_embeddings(embeddings)

    expected_loss, expected_grads = _loss_and_grads(model, reference, features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)


def test_evaluation_mode_returns_the_loss_without_gradients(model, wiki_sentences):
    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, 2)
    with torch.no_grad():
        expected = WeinceLoss(model, weince=CONFIG)([dict(f) for f in features])
        loss = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=3)([dict(f) for f in features])
    assert not loss.requires_grad
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_token_budget_mini_batches_give_the_same_loss(model, wiki_sentences):
    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, 2)
    expected_loss, expected_grads = _loss_and_grads(model, WeinceLoss(model, weince=CONFIG), features)
    cached = CachedWeinceLoss(model, weince=CONFIG, mini_batch_num_tokens=60)
    loss, grads = _loss_and_grads(model, cached, features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)


def test_options_are_checked_and_reported(model):
    with pytest.raises(ValueError, match="mini_batch_size must be a positive integer"):
        CachedWeinceLoss(model, mini_batch_size=0)
    with pytest.raises(ValueError, match="mini_batch_num_tokens"):
        CachedWeinceLoss(model, mini_batch_num_tokens=-1)
    with pytest.raises(ValueError, match="temperature"):
        CachedWeinceLoss(model, temperature=0.0)
    with pytest.raises(TypeError):  # ours are keyword-only; CMNRL's bind positionally as in CMNRL
        CachedWeinceLoss(model, 20.0, cos_sim, 32, None, False, ("query_to_doc",), "joint", False, None, 0.0, CONFIG)
    with pytest.raises(ValueError, match="at least one text column"):
        CachedWeinceLoss(model)([])
    loss = CachedWeinceLoss(model, 10.0, weince=CONFIG, mini_batch_size=7, gather_across_devices=True)
    config = loss.get_config_dict()
    assert config["scale"] == 10.0 and config["mini_batch_size"] == 7 and config["quantile"] == 0.3
    assert config["gather_across_devices"] is True and config["mini_batch_num_tokens"] is None
    assert loss.last_statistics == {}
    assert "2101.06983" in loss.citation and "2606.00262" in loss.loss.citation  # the card cites both (get_losses)
    assert CachedInfoNCELoss(model).get_config_dict() == CachedMultipleNegativesRankingLoss(model).get_config_dict()


# ------------------------------------------------------------------------- training on the real MiniLM


def test_cached_weince_trains_in_sentence_transformer_trainer(fresh_minilm, wiki_sentences, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    dataset = Dataset.from_dict({"text": wiki_sentences[:48]})
    loss = CachedWeinceLoss(fresh_minilm, mini_batch_size=5)  # 16 per batch: chunks of 5, 5, 5, 1
    seen = []

    class Record(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(loss.last_statistics)

    before = flat_parameters(fresh_minilm)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, num_train_epochs=1, learning_rate=3e-5,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, seed=0, dataloader_drop_last=True,
    )  # fmt: skip
    trainer = SentenceTransformerTrainer(
        model=fresh_minilm, args=args, train_dataset=dataset, loss=loss, callbacks=[Record()]
    )
    result = trainer.train()
    assert result.global_step == 3
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(before, flat_parameters(fresh_minilm))
    assert len(seen) == 3 and all(set(diagnostics) == set(STATISTIC_KEYS) for diagnostics in seen)
    assert all(0.0 <= diagnostics["lambda_mean"] <= 1.0 for diagnostics in seen)


def test_cached_weince_trains_with_legacy_fit_on_pairs(fresh_minilm, wiki_sentences):
    from sentence_transformers import InputExample
    from torch.utils.data import DataLoader

    texts = wiki_sentences[200:232]
    examples = [InputExample(texts=[text, text.lower()]) for text in texts]
    loader = DataLoader(examples, batch_size=16, shuffle=False, drop_last=True)
    loss = CachedWeinceLoss(fresh_minilm, weince=WeinceConfig(beta=1.0), mini_batch_size=6)
    before = flat_parameters(fresh_minilm)
    fresh_minilm.fit(train_objectives=[(loader, loss)], epochs=1, show_progress_bar=False)
    assert not torch.equal(before, flat_parameters(fresh_minilm))
    assert set(loss.last_statistics) == set(STATISTIC_KEYS)


@pytest.mark.parametrize("num_columns", [1, 3])  # unsupervised SimCSE; triplets with a hard negative
def test_weince_hardness_in_the_sentence_transformers_losses(model, wiki_sentences, num_columns):
    """``WeinceLoss(hardness_strength=α)`` (ours, Study 2's `weince-hardness`) is the core's term on the model's
    embeddings, its GradCache form gives the same loss and gradients, and bad strengths are refused up front."""
    model = _dropout_off(model)
    features = _columns(model, wiki_sentences, num_columns)
    loss_fn = WeinceLoss(model, weince=CONFIG, hardness_mode="in_batch_negatives", hardness_strength=9.0)
    expected_loss, expected_grads = _loss_and_grads(model, loss_fn, features)
    with torch.no_grad():
        embeddings = [model(dict(f))["sentence_embedding"] for f in features]
    anchors, candidates = embeddings[0], torch.cat(embeddings[1:] if num_columns > 1 else embeddings)
    core = weince_loss(anchors, candidates, temperature=0.05, weince=CONFIG, hardness_strength=9.0)
    assert expected_loss.item() == pytest.approx(core.item(), rel=1e-5, abs=1e-6)
    plain = weince_loss(anchors, candidates, temperature=0.05, weince=CONFIG)
    assert abs(core.item() - plain.item()) > 1e-3  # the term changes the loss on these embeddings
    cached = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=3, hardness_mode="in_batch_negatives",
                              hardness_strength=9.0)  # fmt: skip
    loss, grads = _loss_and_grads(model, cached, features)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-5, abs=1e-6)
    assert_grads_close(grads, expected_grads)
    assert cached.get_config_dict()["hardness_strength"] == 9.0
    assert WeinceLoss(model).get_config_dict()["hardness_strength"] == 0.0  # off by default
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="hardness_strength must be a finite number >= 0"):
            WeinceLoss(model, hardness_strength=bad)
        with pytest.raises(ValueError, match="hardness_strength must be a finite number >= 0"):
            CachedWeinceLoss(model, hardness_strength=bad)
