"""Issue 53, item 4: the wrappers and samplers sentence-transformers users combine MNRL with keep working with our
losses: ``MatryoshkaLoss``, ``AdaptiveLayerLoss`` and ``Matryoshka2dLoss`` around the plain and the GradCache losses,
the ``no_duplicates`` batch sampler in ``SentenceTransformerTrainer``, and flattened (unpadded) inputs where the
model offers them."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)
from sentence_transformers.base.sampler import BatchSamplers
from sentence_transformers.sentence_transformer.losses import (
    AdaptiveLayerLoss,
    CachedMultipleNegativesRankingLoss,
    Matryoshka2dLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)
from train_helpers import flat_parameters

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss

LAMBDA_ZERO = WeinceConfig(gate="aic", aic_margin=1e30)  # λ = 0 exactly
BATCH = 6
SYMMETRIC = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}


@pytest.fixture()
def model(tiny_model, one_thread):
    model = SentenceTransformer(tiny_model, device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _run(model, loss_fn, columns):
    model.zero_grad(set_to_none=True)
    value = loss_fn([model.preprocess(column) for column in columns], None)
    value.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert grads and sum(g.abs().sum() for g in grads.values()) > 0
    return value.detach(), grads


def _assert_same(actual, expected, tolerance=1e-4):
    assert actual[0].item() == pytest.approx(expected[0].item(), rel=tolerance, abs=1e-6)
    assert set(actual[1]) == set(expected[1])
    scale = max(g.abs().max().item() for g in expected[1].values())
    for name, grad in actual[1].items():
        assert (grad - expected[1][name]).abs().max().item() <= tolerance * scale, name


def _columns(wiki_sentences, num_columns=3):
    return [wiki_sentences[c * BATCH : (c + 1) * BATCH] for c in range(num_columns)]


def test_matryoshka_around_plain_and_cached_weince(model, wiki_sentences):
    """WEINCE (λ from the batch, not forced) inside MatryoshkaLoss: the cached loss gives the plain loss's value and
    gradients (the dims' losses are WEINCE on truncated embeddings); at λ = 0 both equal MNRL's, symmetric options."""
    columns = _columns(wiki_sentences)
    config = WeinceConfig(quantile=0.3)

    def matryoshka(inner):
        return MatryoshkaLoss(model, inner, matryoshka_dims=[32, 16, 8])

    plain = _run(model, matryoshka(WeinceLoss(model, weince=config, **SYMMETRIC)), columns)
    cached = _run(model, matryoshka(CachedWeinceLoss(model, weince=config, mini_batch_size=4, **SYMMETRIC)), columns)
    _assert_same(cached, plain)
    reference = _run(model, matryoshka(MultipleNegativesRankingLoss(model, **SYMMETRIC)), columns)
    assert plain[0].item() != pytest.approx(reference[0].item(), rel=1e-4)  # λ > 0 here: WEINCE is not MNRL
    for ours in (
        WeinceLoss(model, weince=LAMBDA_ZERO, **SYMMETRIC),
        CachedInfoNCELoss(model, mini_batch_size=4, **SYMMETRIC),
    ):
        _assert_same(_run(model, matryoshka(ours), columns), reference)


@pytest.mark.parametrize("wrapper", ["adaptive_layer", "matryoshka_2d"])
def test_adaptive_layer_and_matryoshka_2d_around_our_losses(model, wiki_sentences, wrapper):
    """Around the plain losses at λ = 0 they equal the same wrapper around MNRL (every layer, every dim, so that
    nothing is sampled); around the GradCache losses sentence-transformers refuses to combine them, with the warning
    it gives for CachedMNRL."""
    columns = _columns(wiki_sentences, 2)

    def wrap(inner):
        if wrapper == "adaptive_layer":
            return AdaptiveLayerLoss(model, inner, n_layers_per_step=-1)
        return Matryoshka2dLoss(model, inner, matryoshka_dims=[32, 16], n_layers_per_step=-1, n_dims_per_step=-1)

    hardness = {"hardness_mode": "all_negatives", "hardness_strength": 5.0}
    reference = _run(model, wrap(MultipleNegativesRankingLoss(model, **hardness)), columns)
    for ours in (InfoNCELoss(model, **hardness), WeinceLoss(model, weince=LAMBDA_ZERO, **hardness)):
        _assert_same(_run(model, wrap(ours), columns), reference)

    def warnings_of(inner) -> list[str]:
        with pytest.warns(UserWarning) as record:
            wrap(inner)
        return [str(w.message).replace(type(inner).__name__, "<loss>") for w in record]

    expected = warnings_of(CachedMultipleNegativesRankingLoss(model))
    assert any("AdaptiveLayerLoss is not compatible" in message for message in expected)
    assert warnings_of(CachedWeinceLoss(model)) == warnings_of(CachedInfoNCELoss(model)) == expected


@pytest.mark.parametrize("cached", [False, True])
def test_no_duplicates_batch_sampler_trains_weince(model, wiki_sentences, tmp_path, cached):
    """``batch_sampler=no_duplicates`` (the sampler MNRL's docs recommend) with our loss in
    SentenceTransformerTrainer, on pairs with repeated anchors: training runs and moves the encoder."""
    anchors = [wiki_sentences[i % 12] for i in range(24)]  # every anchor twice: the sampler must separate them
    dataset = Dataset.from_dict({"anchor": anchors, "positive": wiki_sentences[100:124]})
    options = {"directions": ("query_to_doc", "doc_to_query"), "weince": WeinceConfig(quantile=0.3)}
    loss = CachedWeinceLoss(model, mini_batch_size=4, **options) if cached else WeinceLoss(model, **options)
    args = SentenceTransformerTrainingArguments(
        str(tmp_path), per_device_train_batch_size=8, max_steps=2, batch_sampler=BatchSamplers.NO_DUPLICATES,
        report_to=[], save_strategy="no", use_cpu=True, learning_rate=1e-3, logging_steps=1,
    )  # fmt: skip
    before = flat_parameters(model)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(before, flat_parameters(model))
    assert 0.0 <= loss.last_statistics["lambda_mean"] <= 1.0


def test_flattened_inputs_where_the_model_offers_them(model, wiki_sentences):
    """sentence-transformers flattens text inputs (no padding) only with flash attention's variable-length kernels;
    where the model can, our loss on flattened inputs equals MNRL's at λ = 0."""
    if not getattr(model[0], "can_flatten_inputs", False):
        pytest.skip("this model cannot take flattened inputs here (sentence-transformers needs flash attention)")
    columns = _columns(wiki_sentences, 2)
    _assert_same(_run(model, WeinceLoss(model, weince=LAMBDA_ZERO), columns),
                 _run(model, MultipleNegativesRankingLoss(model), columns))  # fmt: skip
