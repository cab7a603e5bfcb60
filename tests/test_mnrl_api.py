"""The four losses are MultipleNegativesRankingLoss / CachedMNRL at the edges of their API, as a user swapping the
class name meets them: a batch of one anchor, the positional arguments, options assigned after construction,
``get_config_dict`` and the model card's citations."""

from __future__ import annotations

import inspect
import random

import pytest
import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.model_card import get_losses
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import cos_sim, dot_score

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss

LAMBDA_ZERO = WeinceConfig(gate="aic", aic_margin=1e30)  # λ = 0 exactly
PLAIN = {InfoNCELoss: MultipleNegativesRankingLoss, WeinceLoss: MultipleNegativesRankingLoss}
CACHED = {CachedInfoNCELoss: CachedMultipleNegativesRankingLoss, CachedWeinceLoss: CachedMultipleNegativesRankingLoss}
OURS_AND_THEIRS = {**PLAIN, **CACHED}
NO_ENCODER = torch.nn.Sequential(torch.nn.Identity())  # where only the options and embeddings matter


@pytest.fixture(scope="module")
def model(tiny_model_one_layer, one_thread):
    model = SentenceTransformer(tiny_model_one_layer, device="cpu")
    for module in model.modules():  # the same embeddings for every loss compared
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def _options(loss_class) -> dict:
    return {"weince": LAMBDA_ZERO} if loss_class in (WeinceLoss, CachedWeinceLoss) else {}


# ----------------------------------------------------------------------------------------- a batch of one anchor


@pytest.mark.parametrize("num_columns", [2, 3, 4])  # pairs, triplets, two hard negatives
@pytest.mark.parametrize("loss_class", list(OURS_AND_THEIRS), ids=lambda cls: cls.__name__)
def test_a_batch_of_one_anchor_gives_mnrls_value(model, loss_class, num_columns):
    """MNRL returns 0 for one pair and a real loss for one tuple; ours the same, at the default options and with
    every direction (λ = 0 for that batch whatever the config: its tail is too small; no statistics)."""
    texts = ["a cat sits on the mat", "a feline rests on a rug", "stock markets fell sharply", "rain is expected"]
    features = [model.preprocess([text]) for text in texts[:num_columns]]
    options = {"mini_batch_size": 1} if loss_class in CACHED else {}
    for extra in ({}, {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")}):
        expected = OURS_AND_THEIRS[loss_class](model, **options, **extra)(features, None)
        loss = loss_class(model, **options, **extra)  # the paper's config: λ = 0 comes from the batch of one
        value = loss(features, None)
        assert value.item() == pytest.approx(expected.item(), abs=1e-6)
        if not extra:
            assert (value.item() == 0.0) == (num_columns == 2)
        assert loss.last_statistics == {}


def test_an_epoch_ending_in_a_batch_of_one_trains_with_drop_last_false(model, tmp_path):
    """33 pairs at batch 16 (the trainer's default ``dataloader_drop_last=False``): the third step holds one pair;
    it trains (MNRL's value, 0) instead of stopping the run, for the plain and the cached loss."""
    rows = [f"sentence number {index} about topic {index % 5}" for index in range(66)]
    dataset = Dataset.from_dict({"anchor": rows[:33], "positive": rows[33:]})
    for loss_class in (WeinceLoss, CachedWeinceLoss):
        options = {"mini_batch_size": 8} if loss_class in CACHED else {}
        args = SentenceTransformerTrainingArguments(
            str(tmp_path / loss_class.__name__), per_device_train_batch_size=16, num_train_epochs=1, logging_steps=1,
            report_to="none", dataloader_drop_last=False, use_cpu=True, save_strategy="no", seed=0,
        )  # fmt: skip
        loss = loss_class(model, **options)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len(losses) == 3 and losses[-1] == 0.0 and min(losses[:2]) > 0.0


# ------------------------------------------------------------------------------------------ positional arguments


@pytest.mark.parametrize("loss_class", list(OURS_AND_THEIRS), ids=lambda cls: cls.__name__)
def test_positional_arguments_follow_mnrl_and_ours_are_keyword_only(loss_class):
    theirs = inspect.signature(OURS_AND_THEIRS[loss_class]).parameters
    ours = inspect.signature(loss_class).parameters
    positional = [name for name, parameter in ours.items() if parameter.kind is parameter.POSITIONAL_OR_KEYWORD]
    assert positional == list(theirs)
    assert all(
        ours[name].kind in (ours[name].KEYWORD_ONLY, ours[name].VAR_KEYWORD) for name in ours if name not in theirs
    )
    # the defaults are MNRL's (scale: 20 when neither scale nor temperature is given)
    assert (
        loss_class(NO_ENCODER).get_config_dict().items()
        >= OURS_AND_THEIRS[loss_class](NO_ENCODER).get_config_dict().items()
    )
    values = {"scale": 7.0, "similarity_fct": cos_sim, "gather_across_devices": True,
              "directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction",
              "hardness_mode": "all_negatives", "hardness_strength": 3.0, "mini_batch_size": 5,
              "mini_batch_num_tokens": 64, "show_progress_bar": True}  # fmt: skip
    arguments = [values[name] for name in positional[1:]]
    loss, reference = loss_class(NO_ENCODER, *arguments), OURS_AND_THEIRS[loss_class](NO_ENCODER, *arguments)
    assert loss.get_config_dict().items() >= reference.get_config_dict().items()
    assert loss.scale == 7.0 and loss.temperature == pytest.approx(1 / 7)


# ----------------------------------------------------------------------------- options assigned after construction

VALID = {
    "scale": [5.0, 20.0, 33.0],
    "directions": [("query_to_doc",), ("query_to_doc", "doc_to_query"), ("query_to_doc", "query_to_query")],
    "partition_mode": ["joint", "per_direction"],
    "hardness_mode": [None, "in_batch_negatives", "hard_negatives", "all_negatives"],
    "hardness_strength": [0.0, 2.0, 9.0],
    "gather_across_devices": [False, True],
}
INVALID = {
    "scale": [0.0, -1.0],
    "directions": [(), ("doc_to_query",), ("sideways",)],
    "partition_mode": ["both"],
    "hardness_mode": ["hard"],
    "hardness_strength": [-1.0, float("nan")],
}


class DotSimilarity(torch.nn.Module):
    """A similarity given as a module (MNRL takes any callable)."""

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return first @ second.T


def _refusal(function, *args, **kwargs) -> str | None:
    """The message of the ValueError ``function(*args, **kwargs)`` raises; None when it raises none."""
    try:
        function(*args, **kwargs)
    except ValueError as error:
        return str(error)
    return None


@pytest.mark.parametrize("loss_class", list(PLAIN), ids=lambda cls: cls.__name__)
def test_a_random_sequence_of_assignments_is_checked_and_effective(loss_class):
    """After every assignment the loss equals MNRL with the same assignments (and a loss built with the options so
    far); an invalid value is refused with construction's message and changes nothing."""
    generator = torch.Generator().manual_seed(0)
    columns = [torch.randn(6, 8, generator=generator, dtype=torch.float64) for _ in range(3)]
    ours, mnrl, current = loss_class(NO_ENCODER, **_options(loss_class)), MultipleNegativesRankingLoss(NO_ENCODER), {}
    similarities = [cos_sim] if loss_class is WeinceLoss else [cos_sim, dot_score, DotSimilarity()]
    draw = random.Random(0)
    for _ in range(60):
        name = draw.choice([*VALID, "similarity_fct"])
        if name in INVALID and draw.random() < 0.3:
            value = draw.choice(INVALID[name])
            message = _refusal(setattr, ours, name, value)
            assert message is not None and message == _refusal(loss_class, NO_ENCODER, **{**current, name: value})
            continue
        value = draw.choice(similarities if name == "similarity_fct" else VALID[name])
        candidate = {**current, name: value}
        if _refusal(MultipleNegativesRankingLoss, NO_ENCODER, **candidate) is not None:
            assert _refusal(setattr, ours, name, value) is not None  # an invalid combination, as MNRL's
            continue
        setattr(ours, name, value)
        mnrl._modules.pop(name, None)  # MNRL's own attribute: a function after a module would be refused
        setattr(mnrl, name, value)
        current = candidate
        assert getattr(ours, name) == value or getattr(ours, name) is value
        expected = mnrl.compute_loss_from_embeddings(columns, None)
        assert torch.allclose(ours.compute_loss_from_embeddings(columns), expected, atol=1e-12), current
        fresh = loss_class(NO_ENCODER, **_options(loss_class), **current)
        assert torch.equal(fresh.compute_loss_from_embeddings(columns), ours.compute_loss_from_embeddings(columns))
        assert ours.get_config_dict().items() >= mnrl.get_config_dict().items()
    assert len(current) == len(VALID) + 1  # every option was assigned at least once


@pytest.mark.parametrize("loss_class", list(CACHED), ids=lambda cls: cls.__name__)
def test_the_cached_losses_forward_every_assignment(loss_class):
    loss = loss_class(NO_ENCODER, mini_batch_size=4)
    assignments = {"scale": 10.0, "directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction",
                   "hardness_mode": "in_batch_negatives", "hardness_strength": 4.0, "gather_across_devices": True,
                   "mini_batch_size": 2, "mini_batch_num_tokens": 128}  # fmt: skip
    for name, value in assignments.items():
        setattr(loss, name, value)
    assert loss.get_config_dict().items() >= assignments.items()
    assert (loss.loss.settings.directions, loss.loss.settings.hardness_strength) == (
        ("query_to_doc", "doc_to_query"),
        4.0,
    )
    for name, value in (("mini_batch_size", 0), ("partition_mode", "both"), ("scale", -2.0)):
        with pytest.raises(ValueError, match=name.split("_")[0]):
            setattr(loss, name, value)
    similarity = DotSimilarity()
    if loss_class is CachedWeinceLoss:
        with pytest.raises(ValueError, match="cosine similarity only.*shortfall logit"):
            loss.similarity_fct = similarity
    else:
        loss.similarity_fct = similarity
        assert loss.similarity_fct is similarity and loss.loss.similarity_fct is similarity
        assert loss.get_config_dict()["similarity_fct"] == "DotSimilarity"
    assert "similarity_fct" not in loss._modules


def test_weince_refuses_a_non_cosine_similarity_at_assignment_and_statistics_need_cosine():
    loss = WeinceLoss(NO_ENCODER)
    with pytest.raises(ValueError, match="WeinceLoss takes cosine similarity only.*use InfoNCELoss"):
        loss.similarity_fct = dot_score
    assert loss.similarity_fct is cos_sim and loss.settings.similarity_fct is None
    tracked = InfoNCELoss(NO_ENCODER, track_statistics=True)
    with pytest.raises(ValueError, match="cosine"):
        tracked.similarity_fct = dot_score
    tracked.track_statistics = False
    tracked.similarity_fct = dot_score
    with pytest.raises(ValueError, match="track_statistics"):
        tracked.track_statistics = True


# ------------------------------------------------------------------------------------ the config and the citations


def test_config_dict_and_citations_follow_mnrl():
    recipes = {  # MNRL 6.3's choice of citation: the recipe's paper
        "1807.03748": {},
        "2308.03281": {"directions": ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")},
        "2310.19923": {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"},
    }
    for arxiv, options in recipes.items():
        mnrl = MultipleNegativesRankingLoss(NO_ENCODER, **options)
        assert arxiv in mnrl.citation
        for loss_class, own in ((WeinceLoss, "2606.00262"), (InfoNCELoss, "gao2021simcse")):
            loss = loss_class(NO_ENCODER, **options)
            assert loss.citation.startswith(mnrl.citation) and own in loss.citation
            config = loss.get_config_dict()
            assert config.items() >= mnrl.get_config_dict().items() and config["hardness_mode"] is None
        # the card gathers the citations of the loss and of the losses inside it: each paper once
        cached = CachedWeinceLoss(NO_ENCODER, **options)
        cited = "".join(getattr(inner, "citation", "") for inner in get_losses(cached))
        for paper in ("2606.00262", arxiv, "2101.06983"):  # WEINCE, the recipe, GradCache
            assert cited.count(f"eprint={{{paper}}}") == 1, paper
