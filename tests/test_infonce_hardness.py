"""``infonce_loss(..., hardness_strength=α)`` is sentence-transformers' hard-negative weighting (Lan et al. 2025,
LLaVE): ``MultipleNegativesRankingLoss(hardness_mode="in_batch_negatives", hardness_strength=α)``, the peer a user
would pick instead of WEINCE. Checked on the same embeddings: loss and gradients, pairs and triplets."""

from __future__ import annotations

import pytest
import torch

from simcse_weince.weince import infonce_loss


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


def test_the_trainer_takes_it_for_infonce_only():
    from simcse_weince.text.config import preset
    from simcse_weince.training.objective import ContrastiveObjective

    anchors, positives = _embeddings(2)
    objective = ContrastiveObjective("infonce", 0.05, hardness_strength=9.0)
    loss, _ = objective(anchors, positives)
    assert loss.item() == infonce_loss(anchors, positives, temperature=0.05, hardness_strength=9.0).item()
    assert preset("cpu-cls", loss="infonce", hardness_strength=9.0).hardness_strength == 9.0
    with pytest.raises(ValueError, match="hardness_strength .* needs loss=infonce, not 'weince'"):
        preset("cpu-cls", loss="weince", hardness_strength=9.0)
    with pytest.raises(ValueError, match="hardness_strength must be >= 0"):
        preset("cpu-cls", loss="infonce", hardness_strength=-1.0)
