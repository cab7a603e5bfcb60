"""Frozen-feature evaluation: kNN and label recall@k (known answers), the linear probe, intervals, splits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from simcse_weince.vision.evaluate import (
    LinearProbeConfig,
    knn_evaluate,
    linear_probe,
    mean_interval,
    stratified_split,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def _at_cosine(similarity: float) -> list[float]:
    """A 2-D unit vector whose cosine with the query (1, 0) is ``similarity``."""
    return [similarity, math.sqrt(1 - similarity**2)]


def test_knn_weighted_vote_known_answer():
    # one class-0 neighbour at cosine 0.99, two class-1 neighbours at 0.85, a far class-2 item
    train = torch.tensor([_at_cosine(0.99), _at_cosine(0.85), _at_cosine(0.85), [-1.0, 0.0]]) * 3.0
    labels = torch.tensor([0, 1, 1, 2])
    query = torch.tensor([[2.0, 0.0]])  # norms do not matter: features are L2-normalised
    # with T = 0.1: exp(9.9) = 19930 > 2 exp(8.5) = 9830, so class 0 wins at k = 3 (a majority vote would not)
    result = knn_evaluate(train, labels, query, torch.tensor([0]), ks=(1, 3, 4), temperature=0.1)
    assert result["accuracy"] == {1: 1.0, 3: 1.0, 4: 1.0}
    assert result["recall"] == {1: 1.0, 3: 1.0, 4: 1.0}
    # with T = 1: exp(0.99) = 2.69 < 2 exp(0.85) = 4.68: the two class-1 neighbours win
    result = knn_evaluate(train, labels, query, torch.tensor([0]), ks=(1, 3), temperature=1.0)
    assert result["accuracy"] == {1: 1.0, 3: 0.0}
    # recall@k for a class-1 query: its first same-class neighbour is 2nd
    result = knn_evaluate(train, labels, query, torch.tensor([1]), ks=(1, 2, 50), temperature=0.1)
    assert result["recall"] == {1: 0.0, 2: 1.0, 50: 1.0}  # k = 50 > 4 items: all of them
    assert result["accuracy"][1] == 0.0 and result["accuracy"][50] == 0.0


def test_knn_matches_a_brute_force_reference():
    generator = torch.Generator().manual_seed(0)
    train = torch.randn(60, 5, generator=generator)
    test = torch.randn(25, 5, generator=generator)
    train_labels = torch.randint(0, 4, (60,), generator=generator)
    test_labels = torch.randint(0, 4, (25,), generator=generator)
    ks = (1, 2, 5, 10, 20, 50)
    result = knn_evaluate(train, train_labels, test, test_labels, ks=ks, temperature=0.1, chunk_size=7)
    a = train.numpy() / np.linalg.norm(train.numpy(), axis=1, keepdims=True)
    q = test.numpy() / np.linalg.norm(test.numpy(), axis=1, keepdims=True)
    for k in ks:
        correct = recalled = 0
        for i in range(len(q)):
            sims = a @ q[i]
            nearest = np.argsort(-sims)[:k]
            votes = np.zeros(4)
            for j in nearest:
                votes[train_labels[j]] += np.exp(sims[j] / 0.1)
            correct += int(np.argmax(votes) == test_labels[i])
            recalled += int((train_labels.numpy()[nearest] == test_labels[i].item()).any())
        assert result["accuracy"][k] == pytest.approx(correct / len(q))
        assert result["recall"][k] == pytest.approx(recalled / len(q))


def test_knn_bad_input():
    with pytest.raises(ValueError, match="same length"):
        knn_evaluate(torch.randn(3, 2), torch.tensor([0, 1]), torch.randn(1, 2), torch.tensor([0]))
    with pytest.raises(ValueError, match="positive"):
        knn_evaluate(torch.randn(3, 2), torch.tensor([0, 1, 1]), torch.randn(1, 2), torch.tensor([0]), ks=(0,))


def test_mean_interval_known_answer():
    result = mean_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 1
    assert result["mean"] == 2.0 and result["std"] == pytest.approx(1.0)
    assert (result["ci95_low"], result["ci95_high"]) == pytest.approx((2.0 - half, 2.0 + half))
    single = mean_interval([0.7])
    assert single["ci95_low"] == single["ci95_high"] == 0.7
    with pytest.raises(ValueError):
        mean_interval([])


def test_stratified_split():
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    fit, validation = stratified_split(labels, 0.2, seed=1)
    assert sorted(torch.cat([fit, validation]).tolist()) == list(range(100))
    assert torch.bincount(labels[validation]).tolist() == [10, 6, 4]
    assert not torch.equal(validation, stratified_split(labels, 0.2, seed=2)[1])


def test_linear_probe_separable_clusters_and_random_labels():
    generator = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 16, generator=generator) * 3
    train_labels = torch.arange(150) % 3
    test_labels = torch.arange(60) % 3
    train = centres[train_labels] + torch.randn(150, 16, generator=generator)
    test = centres[test_labels] + torch.randn(60, 16, generator=generator)
    config = LinearProbeConfig(epochs=30, seeds=(0, 1), weight_decays=(0.0, 1e-3))
    result = linear_probe(train, train_labels, test, test_labels, config=config)
    assert result["mean"] >= 0.95 and len(result["values"]) == 2
    assert [entry["seed"] for entry in result["selected"]] == [0, 1]
    assert all(entry["weight_decay"] in (0.0, 1e-3) and 1 <= entry["epoch"] <= 30 for entry in result["selected"])
    shuffled = linear_probe(train, torch.randint(0, 3, (150,), generator=generator), test, test_labels, config=config)
    assert shuffled["mean"] < 0.6  # nothing to learn from random labels


def test_linear_probe_agrees_with_scikit_learn_on_digits():
    sklearn = pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    del sklearn
    digits = load_digits()
    features = torch.tensor(digits.data, dtype=torch.float32)
    labels = torch.tensor(digits.target)
    train, test = slice(0, 1400), slice(1400, None)
    ours = linear_probe(
        features[train],
        labels[train],
        features[test],
        labels[test],
        config=LinearProbeConfig(epochs=40, seeds=(0,)),
    )
    scaler = StandardScaler().fit(digits.data[train])
    reference = LogisticRegression(max_iter=2000).fit(scaler.transform(digits.data[train]), digits.target[train])
    expected = reference.score(scaler.transform(digits.data[test]), digits.target[test])
    assert ours["mean"] == pytest.approx(expected, abs=0.04)


def test_evaluation_refuses_labels_outside_the_classes_naming_the_split(tmp_path, monkeypatch):
    pytest.importorskip("torchvision")
    from torch.utils.data import TensorDataset

    from simcse_weince.vision import evaluate
    from simcse_weince.vision.backbones import SimCLRModel

    # a data source that is not one of the checked readers: its labels reach the evaluation unchecked
    def images_with_labels(dataset, split, **_):
        labels = torch.tensor([0, 1, 2, 3]) if split == "train" else torch.tensor([1, 10, 11])
        return TensorDataset(torch.rand(len(labels), 3, 8, 8), labels)

    monkeypatch.setattr(evaluate, "load_image_dataset", images_with_labels)
    model = SimCLRModel.build("resnet18", image_size=8, projection_dim=4).eval()
    with pytest.raises(ValueError, match=r"fake test split \(under .*fake\): label 10 of item 1 is outside its 10 cl"):
        evaluate.evaluate_model(model, "fake", image_size=8, data_dir=tmp_path, batch_size=4)
