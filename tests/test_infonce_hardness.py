"""``infonce_loss(..., hardness_strength=α)`` is sentence-transformers' hard-negative weighting (Lan et al. 2025,
LLaVE): ``MultipleNegativesRankingLoss(hardness_mode="in_batch_negatives", hardness_strength=α)``, the peer a user
would pick instead of WEINCE. Checked on the same embeddings: loss and gradients, pairs and triplets.
``weince_loss(..., hardness_strength=α)`` (ours, Study 2) adds the same term to WEINCE's logits: at λ = 0 it is the
InfoNCE form, and otherwise it is the readable reference's (``weince/reference.py``)."""

from __future__ import annotations

import pytest
import torch

from simcse_weince.weince.loss import infonce_loss, weince_loss
from simcse_weince.weince.reference import reference_weince_loss


@pytest.fixture(scope="module")
def mnrl_hardness(minilm_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(minilm_path, device="cpu")
    return MultipleNegativesRankingLoss(model, scale=20.0, hardness_mode="in_batch_negatives", hardness_strength=9.0)


def _embeddings(columns: int, rows: int = 12, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    # a clustered batch (in-batch cosines ~0.6-0.8): the hardness term has close negatives to weigh
    base = torch.randn(1, 32, generator=generator) + 0.6 * torch.randn(rows, 32, generator=generator)
    return [(base + 0.4 * torch.randn(rows, 32, generator=generator)).requires_grad_() for _ in range(columns)]


@pytest.mark.parametrize("columns", [2, 3, 4])  # pairs, triplets, two hard negatives per anchor
def test_hardness_weighting_equals_sentence_transformers(mnrl_hardness, columns):
    embeddings = _embeddings(columns)
    expected = mnrl_hardness.compute_loss_from_embeddings(embeddings, None)
    expected_grads = torch.autograd.grad(expected, embeddings)
    ours = infonce_loss(embeddings[0], torch.cat(embeddings[1:]), temperature=0.05, hardness_strength=9.0)
    grads = torch.autograd.grad(ours, embeddings)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-6)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
    # and the weighting matters: plain InfoNCE is a different loss on these embeddings
    plain = infonce_loss(embeddings[0], torch.cat(embeddings[1:]), temperature=0.05)
    assert ours.item() > plain.item() + 0.5  # close in-batch negatives get heavier


def test_zero_strength_is_plain_infonce_and_bad_strengths_are_refused():
    anchors, positives = _embeddings(2)
    assert torch.equal(
        infonce_loss(anchors, positives, temperature=0.05, hardness_strength=0.0),
        infonce_loss(anchors, positives, temperature=0.05),
    )
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="hardness_strength must be a finite number >= 0"):
            infonce_loss(anchors, positives, temperature=0.05, hardness_strength=bad)


def test_simclr_geometry_weighs_every_negative_and_never_the_positive():
    anchors, positives = _embeddings(2, rows=6)
    loss = infonce_loss(anchors, positives, temperature=0.5, geometry="simclr", hardness_strength=4.0)
    # by hand: 2N x 2N cosines, self excluded, positive at i +- N, every other entry a negative
    views = torch.nn.functional.normalize(torch.cat([anchors, positives]), dim=1).double()
    sims = views @ views.T
    n = anchors.shape[0]
    positive = torch.cat([torch.arange(n, 2 * n), torch.arange(n)])
    negative = torch.ones_like(sims, dtype=torch.bool)
    negative[torch.arange(2 * n), torch.arange(2 * n)] = False
    negative[torch.arange(2 * n), positive] = False
    logits = sims / 0.5 + 4.0 * sims * negative
    logits = logits.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    expected = torch.nn.functional.cross_entropy(logits, positive)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_the_trainer_takes_it_for_both_losses():
    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.text.config import preset

    anchors, positives = _embeddings(2)
    objective = ContrastiveObjective("infonce", 0.05, hardness_mode="in_batch_negatives", hardness_strength=9.0)
    loss, _ = objective(anchors, positives)
    assert loss.item() == infonce_loss(anchors, positives, temperature=0.05, hardness_strength=9.0).item()
    weince_objective = ContrastiveObjective("weince", 0.05, hardness_mode="in_batch_negatives", hardness_strength=9.0)
    loss, logs = weince_objective(anchors, positives)
    assert loss.item() == weince_loss(anchors, positives, temperature=0.05, hardness_strength=9.0).item()
    assert loss.item() != weince_loss(anchors, positives, temperature=0.05).item()
    assert "lambda_mean" in logs
    assert preset("cpu-cls", loss="infonce", hardness_strength=9.0).hardness_strength == 9.0
    assert preset("cpu-cls", loss="weince", hardness_strength=9.0).hardness_strength == 9.0  # Study 2's variant
    with pytest.raises(ValueError, match="hardness_strength must be >= 0"):
        preset("cpu-cls", loss="infonce", hardness_strength=-1.0)


# ---- WEINCE with the same term (ours, not the paper's: Study 2's weince-hardness)


@pytest.mark.parametrize("geometry,columns", [("simcse", 2), ("simcse", 3), ("simcse", 4), ("simclr", 2)])
def test_weince_hardness_at_zero_lambda_is_infonce_hardness(geometry, columns):
    embeddings = _embeddings(columns)
    anchors, candidates = embeddings[0], torch.cat(embeddings[1:])
    tau = 0.05 if geometry == "simcse" else 0.5
    ours = weince_loss(anchors, candidates, temperature=tau, geometry=geometry, mixing_weight=0.0,
                       hardness_strength=9.0)  # fmt: skip
    expected = infonce_loss(anchors, candidates, temperature=tau, geometry=geometry, hardness_strength=9.0)
    assert ours.item() == pytest.approx(expected.item(), abs=1e-5)
    for grad, expected_grad in zip(torch.autograd.grad(ours, embeddings), torch.autograd.grad(expected, embeddings)):
        torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("geometry,columns", [("simcse", 2), ("simcse", 3), ("simclr", 2)])
def test_weince_hardness_equals_autograd_through_the_definition(geometry, columns):
    """The closed-form backward with the hardness term against the readable reference (autograd through the
    definition: weince/reference.py), in float64; the tail statistics and λ do not see the term."""
    embeddings = [e.detach().double().requires_grad_() for e in _embeddings(columns, rows=40)]
    anchors, candidates = embeddings[0], torch.cat(embeddings[1:])
    tau, alpha = (0.05 if geometry == "simcse" else 0.5), 9.0
    loss, stats = weince_loss(anchors, candidates, temperature=tau, geometry=geometry, hardness_strength=alpha,
                              return_stats=True)  # fmt: skip
    assert float(stats["mixing_weight"].max()) > 0.5  # λ is on for some anchors: the WEINCE logit is exercised
    _, plain_stats = weince_loss(anchors, candidates, temperature=tau, geometry=geometry, return_stats=True)
    torch.testing.assert_close(stats["mixing_weight"], plain_stats["mixing_weight"])
    expected, expected_stats = reference_weince_loss(anchors, candidates, temperature=tau, geometry=geometry,
                                                     hardness_strength=alpha)  # fmt: skip
    assert loss.item() == pytest.approx(expected.item(), abs=1e-9)
    torch.testing.assert_close(stats["logits"], expected_stats["logits"], atol=1e-9, rtol=1e-9)
    for grad, expected_grad in zip(torch.autograd.grad(loss, embeddings), torch.autograd.grad(expected, embeddings)):
        torch.testing.assert_close(grad, expected_grad, atol=1e-9, rtol=1e-7)
    # and the term matters: the plain WEINCE loss is a different number
    assert loss.item() > weince_loss(anchors, candidates, temperature=tau, geometry=geometry).item() + 0.1


def test_weince_refuses_bad_strengths():
    anchors, positives = _embeddings(2)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="hardness_strength must be a finite number >= 0"):
            weince_loss(anchors, positives, temperature=0.05, hardness_strength=bad)
