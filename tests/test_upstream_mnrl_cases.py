"""sentence-transformers' own test cases of ``MultipleNegativesRankingLoss`` / ``CachedMultipleNegativesRankingLoss``,
run against our classes at λ = 0 (issue 53, item 3).

Upstream: https://github.com/huggingface/sentence-transformers at commit
cad211983f36ce458e9b3360f3e11b29fc54cbd8 (6.1.0.dev0, the newest snapshot available here; 6.3.0 is installed),
files ``tests/sentence_transformer/losses/test_gradcache.py`` (G), ``tests/sentence_transformer/losses/test_cmnrl.py``
(C) and ``tests/sentence_transformer/losses/test_cached_mnsrl.py`` (S). Each case below is written here for our
classes (not copied): the same configurations, batch shapes and assertions, with our loss in place of theirs --
``InfoNCELoss`` and ``WeinceLoss`` at λ = 0 (a config whose AIC gate is 0), and their GradCache versions -- and, where
the upstream case compares two of its classes, ours are also compared with theirs. Their fixture model
(``sentence-transformers-testing/stsb-bert-tiny-safetensors``, from the Hub) is replaced by a local tiny BERT
(offline); their Matryoshka dims (128, 64, 32) become (32, 16, 8) for its 32 dimensions.

Not run, because they test sentence-transformers' internals rather than the loss (RandContext, ``_minibatch_ranges``,
``_create_minibatch``, mixed-modality mini-batches, its module's imports), or a design that differs on purpose:
C ``test_cmnrl_gather_across_devices_offset`` (MNRL computes its local anchors' share of a gathered loss, ours the
global batch's on every process; the two-process test in ``test_mnrl_equivalence.py`` checks that the averages
agree). C ``test_cmnrl_hyperparameters_stay_assignable`` runs whole: InfoNCE takes the ``nn.Module`` similarity,
WEINCE refuses it at assignment (cosine only). The upstream files themselves run from a checkout: ``tests/upstream/``.
"""

from __future__ import annotations

import copy
import warnings
from functools import partial

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import (
    AdaptiveLayerLoss,
    MatryoshkaLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import cos_sim

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss

LAMBDA_ZERO = WeinceConfig(gate="aic", aic_margin=1e30)  # λ = 0 exactly
ANCHORS = ["first anchor", "second anchor", "third anchor", "fourth anchor", "fifth anchor", "sixth", "seventh one"]
POSITIVES = ["first positive", "second positive", "third", "fourth positive", "fifth positive", "sixth p", "seven"]
VARIED_ANCHORS = [
    "a",
    "an anchor with quite a few more words in it than the others",
    "c and d",
    "final anchor",
    "e",
    "f g",
]
VARIED_POSITIVES = [
    "short",
    "a positive that also has a much longer surface form here",
    "p",
    "another text",
    "q r",
    "s",
]


def _ours(kind: str, cached: bool, model, **options):
    """Our substitute for MNRL (cached: CachedMNRL) with MNRL's options."""
    if kind == "infonce":
        return CachedInfoNCELoss(model, **options) if cached else InfoNCELoss(model, **options)
    return (
        CachedWeinceLoss(model, weince=LAMBDA_ZERO, **options)
        if cached
        else WeinceLoss(model, weince=LAMBDA_ZERO, **options)
    )


KINDS = ["infonce", "weince"]


@pytest.fixture()
def model(tiny_model, one_thread):
    return SentenceTransformer(tiny_model, device="cpu")


def _dropout_off(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    return model


def _gradients(model) -> dict:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_trained(grads: dict) -> None:
    assert grads and sum(grad.abs().sum() for grad in grads.values()) > 0


def _loss_and_grads(model, loss_fn, columns, scale: float = 1.0):
    model.zero_grad(set_to_none=True)
    value = loss_fn([model.preprocess(list(column)) for column in columns], None) * scale
    value.backward()
    return value.detach(), _gradients(model)


def _assert_same(actual, expected, rtol=1e-4, atol=1e-5):
    (loss, grads), (expected_loss, expected_grads) = actual, expected
    _assert_trained(grads)
    assert loss.item() == pytest.approx(expected_loss.item(), rel=rtol, abs=atol)
    assert set(grads) == set(expected_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=rtol, atol=atol, msg=name)


# ---------------------------------------------------------------------------------- G: test_gradcache.py


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", [
    {},
    {"scale": 50.0, "directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"},
    {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")},
    {"hardness_mode": "in_batch_negatives", "hardness_strength": 9.0},
    {"hardness_mode": "all_negatives", "hardness_strength": 5.0},
])  # fmt: skip
@pytest.mark.parametrize("mini_batch_size", [3, 50])
def test_g_cached_matches_plain(model, kind, config, mini_batch_size):
    """G ``test_cached_mnrl_matches_mnrl``; ours also against MNRL."""
    model = _dropout_off(model)
    columns = (ANCHORS, POSITIVES)
    cached = _loss_and_grads(model, _ours(kind, True, model, mini_batch_size=mini_batch_size, **config), columns)
    plain = _loss_and_grads(model, _ours(kind, False, model, **config), columns)
    _assert_same(cached, plain)
    _assert_same(plain, _loss_and_grads(model, MultipleNegativesRankingLoss(model, **config), columns))


@pytest.mark.parametrize("kind", KINDS)
def test_g_replays_dropout_in_the_backward_pass(model, kind):
    """G ``test_gradcache_replays_dropout_in_the_backward_pass``: dropout on, the backward re-embeds exactly."""
    model.train()
    assert any(module.p > 0 for module in model.modules() if isinstance(module, torch.nn.Dropout))
    loss = _ours(kind, True, model, mini_batch_size=3)
    forward_reps, backward_reps = [], []
    sink = forward_reps
    embed_minibatch = loss.embed_minibatch

    def spy(**kwargs):
        reps, random_state = embed_minibatch(**kwargs)
        sink.append(reps.detach().clone())
        return reps, random_state

    loss.embed_minibatch = spy
    value = loss([model.preprocess(ANCHORS), model.preprocess(POSITIVES)], None)
    sink = backward_reps
    value.backward()
    assert len(forward_reps) == len(backward_reps) == 6  # 2 columns x ceil(7 / 3)
    assert all(torch.equal(a, b) for a, b in zip(forward_reps, backward_reps))


@pytest.mark.parametrize("kind", KINDS)
def test_g_two_forwards_before_one_backward(model, kind):
    """G ``test_gradcache_two_forwards_before_one_backward``."""
    model = _dropout_off(model)
    first = [model.preprocess(ANCHORS[:4]), model.preprocess(POSITIVES[:4])]
    second = [model.preprocess(ANCHORS[3:]), model.preprocess(POSITIVES[3:])]
    model.zero_grad()
    shared = _ours(kind, True, model, mini_batch_size=2)
    (shared(first, None) + shared(second, None)).backward()
    shared_grads = _gradients(model)
    model.zero_grad()
    (
        _ours(kind, True, model, mini_batch_size=2)(first, None)
        + _ours(kind, True, model, mini_batch_size=2)(second, None)
    ).backward()
    reference = _gradients(model)
    _assert_trained(shared_grads)
    for name, grad in shared_grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("grad_accum_steps", [2, 4])
def test_g_scales_with_the_outer_backward(model, kind, grad_accum_steps):
    """G ``test_gradcache_scales_with_the_outer_backward``."""
    model = _dropout_off(model)
    columns = (ANCHORS[:6], POSITIVES[:6])
    _, unscaled = _loss_and_grads(model, _ours(kind, True, model, mini_batch_size=2), columns)
    _, scaled = _loss_and_grads(model, _ours(kind, True, model, mini_batch_size=2), columns, 1 / grad_accum_steps)
    _assert_trained(unscaled)
    _assert_trained(scaled)
    for name, grad in scaled.items():
        torch.testing.assert_close(grad, unscaled[name] / grad_accum_steps, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("training", [True, False])
def test_g_under_no_grad(model, kind, training):
    """G ``test_gradcache_under_no_grad``: the trainer's evaluation loss."""
    model = _dropout_off(model)
    model.train(training)
    features = [model.preprocess(ANCHORS[:6]), model.preprocess(POSITIVES[:6])]
    with torch.no_grad():
        cached = _ours(kind, True, model, mini_batch_size=2)(copy.deepcopy(features), None)
        plain = _ours(kind, False, model)(copy.deepcopy(features), None)
        reference = MultipleNegativesRankingLoss(model)(copy.deepcopy(features), None)
    assert cached.item() == pytest.approx(plain.item(), rel=1e-4, abs=1e-5)
    assert plain.item() == pytest.approx(reference.item(), rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_g_under_autocast(model, kind):
    """G ``test_gradcache_under_autocast``: bf16 embeddings from a Dense head; the loss stays finite and trains
    (ours computes the loss in float32, so unlike CachedMNRL its value is not bf16)."""
    from sentence_transformers.sentence_transformer.modules import Dense

    model.append(Dense(model.get_embedding_dimension(), 16, activation_function=torch.nn.Tanh()))
    model = _dropout_off(model)
    loss_fn = _ours(kind, True, model, mini_batch_size=2)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss_fn([model.preprocess(ANCHORS[:6]), model.preprocess(POSITIVES[:6])], None)
    assert torch.isfinite(value) and value.dtype == torch.float32
    value.backward()
    grads = _gradients(model)
    _assert_trained(grads)
    assert all(torch.isfinite(grad).all() for grad in grads.values())


@pytest.mark.parametrize("kind", KINDS)
def test_g_adaptive_layer_warns_for_gradient_cached_losses(model, kind):
    """G ``test_adaptive_layer_warns_for_gradient_cached_losses``: AdaptiveLayerLoss cannot wrap a GradCache loss
    and says so for ours as for CachedMNRL; the plain loss it takes without a warning."""
    loss = _ours(kind, True, model)
    with pytest.warns(UserWarning, match=f"AdaptiveLayerLoss is not compatible with {type(loss).__name__}"):
        AdaptiveLayerLoss(model, loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AdaptiveLayerLoss(model, _ours(kind, False, model))


# ------------------------------------------------------------------------------------ C: test_cmnrl.py


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("same_data, scaler, precision", [(True, 1.0, 1e-5), (False, 1.0, 1e-5), (True, 1000.0, 1e-3)])
def test_c_same_grad(model, kind, same_data, scaler, precision):
    """C ``test_cmnrl_same_grad``: (anchor, positive, negative) triplets; the cached loss (mini-batches of 2) has the
    plain loss's value and gradients on the same data, and not on other data."""
    model = _dropout_off(model)
    triplets = (
        ["aaa", "bbb", "ccc", "ddd", "eee"],
        ["aas", "bbs", "ccs", "dds", "ees"],
        ["xxx", "yyy", "zzz", "kkk", "fff"],
    )
    other = (["adsa", "czx", "dsada"], ["b", "fas", "xcz"], ["c", "yyy", "asdas"])
    plain = _loss_and_grads(model, _ours(kind, False, model), triplets if same_data else other, scaler)
    cached = _loss_and_grads(model, _ours(kind, True, model, mini_batch_size=2), triplets, scaler)
    close = [torch.allclose(cached[1][name], grad, precision, precision) for name, grad in plain[1].items()]
    if same_data:
        assert cached[0].item() == pytest.approx(plain[0].item(), rel=precision, abs=precision)
        assert all(close)
        _assert_same(
            plain, _loss_and_grads(model, MultipleNegativesRankingLoss(model), triplets, scaler), precision, precision
        )
    else:
        assert cached[0].item() != pytest.approx(plain[0].item(), rel=precision, abs=precision)
        assert not all(close)


@pytest.mark.parametrize("kind", KINDS)
def test_c_attributes_and_config(model, kind):
    """C ``test_cmnrl_attributes_and_config_back_compat``: MNRL's attributes and config keys, validation of
    ``scale``, and a ``partial`` similarity."""
    loss = _ours(kind, True, model, scale=42.0, mini_batch_size=4, directions=("query_to_doc", "doc_to_query"),
                 partition_mode="per_direction", hardness_mode="in_batch_negatives", hardness_strength=9.0)  # fmt: skip
    assert loss.scale == pytest.approx(42.0) and loss.temperature == pytest.approx(1 / 42.0)
    assert loss.directions == ("query_to_doc", "doc_to_query") and loss.partition_mode == "per_direction"
    assert loss.hardness_mode == "in_batch_negatives" and loss.hardness_strength == 9.0
    assert loss.gather_across_devices is False and loss.mini_batch_size == 4
    expected = {
        "similarity_fct": "cos_sim", "mini_batch_size": 4, "mini_batch_num_tokens": None,
        "gather_across_devices": False, "directions": ("query_to_doc", "doc_to_query"),
        "partition_mode": "per_direction", "hardness_mode": "in_batch_negatives", "hardness_strength": 9.0,
    }  # fmt: skip
    config = loss.get_config_dict()
    assert {key: config[key] for key in expected} == expected
    assert config["scale"] == pytest.approx(42.0)
    with pytest.raises(ValueError, match="Scale must be a positive value"):
        _ours(kind, True, model, scale=-1.0)
    assert "cos_sim" in _ours(kind, True, model, similarity_fct=partial(cos_sim)).get_config_dict()["similarity_fct"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mini_batch_size", [2, 3])
def test_c_matryoshka(model, kind, mini_batch_size):
    """C ``test_cmnrl_matryoshka``: ``MatryoshkaLoss`` around the cached loss equals it around the plain one (and,
    here, around MNRL)."""
    model = _dropout_off(model)
    columns = (ANCHORS[:6], POSITIVES[:6])

    def run(inner):
        return _loss_and_grads(model, MatryoshkaLoss(model, inner, matryoshka_dims=[32, 16, 8]), columns)

    cached = run(_ours(kind, True, model, mini_batch_size=mini_batch_size))
    plain = run(_ours(kind, False, model))
    _assert_same(cached, plain, 1e-4, 1e-4)
    _assert_same(plain, run(MultipleNegativesRankingLoss(model)), 1e-4, 1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_c_hyperparameters_stay_assignable(model, kind):
    """C ``test_cmnrl_hyperparameters_stay_assignable``: ``scale`` and an ``nn.Module`` similarity (InfoNCE; WEINCE
    refuses a non-cosine similarity at assignment, with the reason, and keeps its own)."""
    loss = _ours(kind, True, model, mini_batch_size=4)
    loss.scale = 5.0
    assert loss.scale == pytest.approx(5.0) and loss.loss.scale == pytest.approx(5.0)
    assert loss.temperature == pytest.approx(0.2)
    similarity = torch.nn.CosineSimilarity(dim=-1)
    if kind == "weince":
        with pytest.raises(ValueError, match="cosine similarity only"):
            loss.similarity_fct = similarity
        assert loss.similarity_fct is cos_sim
    else:
        loss.similarity_fct = similarity
        assert loss.similarity_fct is similarity and loss.loss.similarity_fct is similarity
    assert "similarity_fct" not in loss._modules, "the module must not shadow the property on the wrapper"
    loss.get_config_dict()  # must not raise for a __name__-less similarity


@pytest.mark.parametrize("kind", KINDS)
def test_c_token_budget_matches_plain(model, kind):
    """C ``test_cmnrl_token_budget_matches_mnrl``: ``mini_batch_num_tokens`` packs by tokens, same loss and grads."""
    model = _dropout_off(model)
    columns = (VARIED_ANCHORS, VARIED_POSITIVES)
    cached = _loss_and_grads(model, _ours(kind, True, model, mini_batch_num_tokens=16), columns)
    _assert_same(cached, _loss_and_grads(model, _ours(kind, False, model), columns))
    _assert_same(cached, _loss_and_grads(model, MultipleNegativesRankingLoss(model), columns))


# ------------------------------------------------------------------------------- S: test_cached_mnsrl.py


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("minibatching", [{"mini_batch_size": 2}, {"mini_batch_num_tokens": 16}])
def test_s_cached_symmetric_matches_symmetric(model, kind, minibatching):
    """S ``test_cached_symmetric_matches_symmetric`` with the symmetric loss spelled as MNRL's options (the
    deprecated MultipleNegativesSymmetricRankingLoss is those options)."""
    model = _dropout_off(model)
    symmetric = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}
    columns = (VARIED_ANCHORS, VARIED_POSITIVES)
    cached = _loss_and_grads(model, _ours(kind, True, model, **minibatching, **symmetric), columns)
    _assert_same(cached, _loss_and_grads(model, _ours(kind, False, model, **symmetric), columns))
    _assert_same(cached, _loss_and_grads(model, MultipleNegativesRankingLoss(model, **symmetric), columns))
