"""The public names renamed by issue 55 (one name per meaning: the per-step λ numbers are "statistics", a
WeinceConfig is ``weince``) still work under their old names, with a FutureWarning that names the new one, and
give the same values; the loss options are validated once, into a frozen settings object."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from simcse_weince import CachedWeinceLoss, InfoNCELoss, WeinceConfig, WeinceLoss
from simcse_weince.losses.from_embeddings import ContrastiveSettings, contrastive_loss, loss_from_embeddings
from simcse_weince.weince.loss import weince_loss
from simcse_weince.weince.tail import mixing_weights, tail_statistics

CONFIG = WeinceConfig(beta=2.0, min_tail_points=3)


def _embeddings(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(12, 8, generator=generator) for _ in range(2)]


@pytest.mark.parametrize("loss_class", [WeinceLoss, InfoNCELoss])
def test_loss_classes_take_config_under_its_old_name(loss_class):
    with pytest.warns(FutureWarning, match="'config' is renamed to 'weince'"):
        old = loss_class(torch.nn.Identity(), config=CONFIG)
    assert old.weince is CONFIG and old.settings.weince is CONFIG
    with pytest.warns(FutureWarning, match="'config' is renamed to 'weince'"):
        assert old.config is CONFIG
    with pytest.raises(TypeError, match="give 'weince' only"):
        loss_class(torch.nn.Identity(), config=CONFIG, weince=CONFIG)


def test_last_diagnostics_reads_last_statistics_with_a_warning():
    loss = WeinceLoss(torch.nn.Identity(), weince=CONFIG)
    loss.compute_loss_from_embeddings(_embeddings())
    with pytest.warns(FutureWarning, match="'last_diagnostics' is renamed to 'last_statistics'"):
        old = loss.last_diagnostics
    assert old == loss.last_statistics and set(old) == {"lambda_mean", "lambda_above_half", "rho0",
                                                        "delta_aic_mean", "beta_hat_mean"}  # fmt: skip
    assert loss.last_batch.statistics.keys() == old.keys()  # the callback's public read


def test_cached_loss_forwards_the_renamed_attributes():
    with pytest.warns(FutureWarning, match="'config' is renamed to 'weince'"):
        cached = CachedWeinceLoss(torch.nn.Sequential(torch.nn.Identity()), config=CONFIG, mini_batch_size=4)
    assert cached.weince is CONFIG and cached.settings is cached.loss.settings
    cached.scale = 10.0  # assignable, as MNRL's; the wrapped loss's settings are validated again
    assert cached.loss.settings.temperature == pytest.approx(0.1)
    with pytest.raises(ValueError, match="temperature must be a positive number"):
        cached.temperature = -1.0


def test_core_functions_take_config_under_its_old_name():
    anchors, candidates = _embeddings(1)
    expected, stats = weince_loss(anchors, candidates, temperature=0.05, weince=CONFIG, return_stats=True)
    with pytest.warns(FutureWarning, match="weince_loss: 'config' is renamed to 'weince'"):
        old = weince_loss(anchors, candidates, temperature=0.05, config=CONFIG)
    assert torch.equal(old, expected)
    negatives = stats["logits"].new_tensor(torch.rand(12, 11).tolist()).double()
    with pytest.warns(FutureWarning, match="tail_statistics: 'config' is renamed"):
        old_tail = tail_statistics(negatives, config=CONFIG)
    new_tail = tail_statistics(negatives, CONFIG)
    assert torch.equal(old_tail.rho, new_tail.rho)
    with pytest.warns(FutureWarning, match="mixing_weights: 'config' is renamed"):
        old_weight, _ = mixing_weights(new_tail, config=CONFIG)
    assert torch.equal(old_weight, mixing_weights(new_tail, CONFIG)[0])
    with pytest.warns(FutureWarning, match="loss_from_embeddings: 'config' is renamed"):
        old_result = loss_from_embeddings([anchors, candidates], config=CONFIG)
    assert torch.equal(old_result.loss, expected)


def test_diagnostic_keys_is_the_old_name_of_statistic_keys():
    import simcse_weince.weince as core

    with pytest.warns(FutureWarning, match="'DIAGNOSTIC_KEYS' is renamed to 'STATISTIC_KEYS'"):
        old = core.DIAGNOSTIC_KEYS
    assert old == core.STATISTIC_KEYS


def test_settings_are_validated_once_and_frozen():
    settings = ContrastiveSettings(directions="query_to_doc", hardness_strength=2)
    assert settings.directions == ("query_to_doc",) and settings.hardness_strength == 2.0  # normalised once
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.loss = "infonce"
    with pytest.raises(ValueError, match="unknown loss"):
        dataclasses.replace(settings, loss="triplet")  # a changed copy is checked again
    with pytest.raises(ValueError, match="are for the simcse geometry"):
        ContrastiveSettings(geometry="simclr", partition_mode="per_direction")
    # the functional path and the settings path are one computation
    columns = _embeddings(2)
    direct = loss_from_embeddings(columns, weince=CONFIG, statistics=True)
    through = contrastive_loss(columns, ContrastiveSettings(weince=CONFIG), statistics=True)
    assert torch.equal(direct.loss, through.loss)
    assert all(torch.equal(direct.statistics[key], through.statistics[key]) for key in direct.statistics)
