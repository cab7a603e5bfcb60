"""Frozen-feature evaluation of a pretrained backbone: linear probe and kNN (the paper's protocol).

- **Linear probe**: multinomial logistic regression on standardised backbone features, trained in torch
  (Adam, 100 epochs). For every probe seed, a stratified 20% of the labelled training images is held out for
  selection (weight decay from a small grid, and the epoch); the selected classifier is scored on the test set.
  Reported: mean and 95% t-interval over the probe seeds.
- **kNN**: cosine similarity between L2-normalised test and training features; the k nearest training images
  vote with weights ``exp(s / 0.1)`` (Wu et al., 2018) for k in {1, 2, 5, 10, 20, 50}. Also *label recall@k*:
  the share of test images with at least one same-class image among their k nearest neighbours.

Example::

    results = evaluate_checkpoint("runs/c10")           # the run's latest checkpoint
    print(results_markdown(results))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from simcse_weince.paths import resolve_data_dir
from simcse_weince.training.checkpoints import read_trainer_state
from simcse_weince.vision.augment import evaluation_transform
from simcse_weince.vision.datasets import dataset_spec, load_image_dataset
from simcse_weince.vision.trainer import load_pretrained, resolve_checkpoint

KNN_KS = (1, 2, 5, 10, 20, 50)


# ------------------------------------------------------------------------------------------ statistics


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> dict:
    """Mean and two-sided t-interval of the mean: ``{"mean", "ci95_low", "ci95_high", "std", "values"}``.

    One value gives a zero-width interval.
    """
    from scipy import stats

    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_interval needs at least one value")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n) if n > 1 else 0.0
    return {"mean": mean, "ci95_low": mean - half, "ci95_high": mean + half, "std": std, "values": values}


def stratified_split(labels: torch.Tensor, fraction: float = 0.2, seed: int = 0):
    """Indices ``(train, validation)``: ``round(fraction * n_c)`` random items of every class c go to validation."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    generator = torch.Generator().manual_seed(seed)
    validation = []
    for label in labels.unique():
        members = (labels == label).nonzero().flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        validation.append(members[: round(fraction * len(members))])
    validation = torch.cat(validation).sort().values
    is_validation = torch.zeros(len(labels), dtype=torch.bool)
    is_validation[validation] = True
    return (~is_validation).nonzero().flatten(), validation


# --------------------------------------------------------------------------------------------- features


@torch.no_grad()
def extract_features(
    backbone: torch.nn.Module,
    dataset,
    *,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
    desc: str = "features",
):
    """Backbone features (float32, N x D, on CPU) and labels (N) of every item of ``dataset``."""
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    backbone.eval()
    features, labels = [], []
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    for images, targets in tqdm(loader, desc=desc, leave=False):
        features.append(backbone(images.to(device)).float().cpu())
        labels.append(torch.as_tensor(targets))
    return torch.cat(features), torch.cat(labels).long()


# ----------------------------------------------------------------------------------------------- kNN


def knn_evaluate(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    ks: Sequence[int] = KNN_KS,
    temperature: float = 0.1,
    num_classes: int | None = None,
    chunk_size: int = 1024,
) -> dict:
    """Weighted kNN accuracy and label recall@k: ``{"accuracy": {k: acc}, "recall": {k: rec}}``.

    Features are L2-normalised; neighbour j votes for its class with weight ``exp(s_j / temperature)``.
    Ties of the vote go to the lower class index. A k above the number of training items uses them all.
    """
    if len(train_features) != len(train_labels) or len(test_features) != len(test_labels):
        raise ValueError("features and labels must have the same length")
    if len(train_features) == 0 or len(test_features) == 0:
        raise ValueError("kNN needs at least one training and one test item")
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    num_classes = num_classes or int(max(train_labels.max(), test_labels.max())) + 1
    database = F.normalize(train_features.float(), dim=1)
    train_labels = train_labels.long()
    max_k = min(max(ks), len(database))
    correct = {k: 0 for k in ks}
    recalled = {k: 0 for k in ks}
    for start in range(0, len(test_features), chunk_size):
        queries = F.normalize(test_features[start : start + chunk_size].float(), dim=1)
        targets = test_labels[start : start + chunk_size].long()
        similarities, indices = (queries @ database.T).topk(max_k, dim=1)
        neighbour_labels = train_labels[indices]
        weights = (similarities / temperature).exp()
        for k in ks:
            k_used = min(k, max_k)
            votes = torch.zeros(len(queries), num_classes).scatter_add_(
                1, neighbour_labels[:, :k_used], weights[:, :k_used]
            )
            correct[k] += int((votes.argmax(dim=1) == targets).sum())
            recalled[k] += int((neighbour_labels[:, :k_used] == targets[:, None]).any(dim=1).sum())
    total = len(test_features)
    return {
        "accuracy": {k: correct[k] / total for k in ks},
        "recall": {k: recalled[k] / total for k in ks},
    }


# -------------------------------------------------------------------------------------- linear probe


@dataclass
class LinearProbeConfig:
    """Logistic-regression probe: Adam with a cosine schedule for ``epochs`` epochs; weight decay and epoch
    chosen on the validation split."""

    epochs: int = 100
    batch_size: int = 256
    learning_rate: float = 1e-2
    weight_decays: tuple[float, ...] = (0.0, 1e-4, 1e-3)
    validation_fraction: float = 0.2
    seeds: tuple[int, ...] = field(default=(0, 1, 2))

    def to_dict(self) -> dict:
        return asdict(self)


def _accuracy(classifier: torch.nn.Linear, features: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((classifier(features).argmax(dim=1) == labels).float().mean())


def train_logistic_regression(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    *,
    validation: tuple[torch.Tensor, torch.Tensor],
    weight_decay: float = 0.0,
    epochs: int = 100,
    batch_size: int = 256,
    learning_rate: float = 1e-2,
    seed: int = 0,
) -> tuple[torch.nn.Linear, float, int]:
    """Train a softmax classifier; returns the weights of its best validation epoch, that accuracy, the epoch.

    Zero initialisation (the problem is convex); the seed sets the mini-batch order.
    Mini-batches of ``batch_size``; the learning rate decays to 0 on a cosine over the epochs.
    """
    classifier = torch.nn.Linear(features.shape[1], num_classes)
    torch.nn.init.zeros_(classifier.weight)
    torch.nn.init.zeros_(classifier.bias)
    optimizer = torch.optim.Adam(classifier.parameters(), lr=learning_rate, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    generator = torch.Generator().manual_seed(seed)
    best = (-1.0, 0, None)
    for epoch in range(1, epochs + 1):
        for batch in torch.randperm(len(features), generator=generator).split(batch_size):
            loss = F.cross_entropy(classifier(features[batch]), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        schedule.step()
        accuracy = _accuracy(classifier, *validation)
        if accuracy > best[0]:
            best = (accuracy, epoch, {k: v.clone() for k, v in classifier.state_dict().items()})
    classifier.load_state_dict(best[2])
    return classifier, best[0], best[1]


def linear_probe(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    *,
    config: LinearProbeConfig | None = None,
    num_classes: int | None = None,
) -> dict:
    """Linear-probe test accuracy over several probe seeds: :func:`mean_interval` plus ``"selected"``
    (per seed: weight decay, epoch and validation accuracy of the chosen classifier)."""
    config = config or LinearProbeConfig()
    if not config.seeds:
        raise ValueError("the linear probe needs at least one seed")
    num_classes = num_classes or int(max(train_labels.max(), test_labels.max())) + 1
    train_features, test_features = train_features.float(), test_features.float()
    train_labels, test_labels = train_labels.long(), test_labels.long()
    accuracies, selected = [], []
    for seed in config.seeds:
        fit_index, validation_index = stratified_split(train_labels, config.validation_fraction, seed)
        # standardise with the statistics of the images the probe is fitted on
        mean = train_features[fit_index].mean(dim=0)
        std = train_features[fit_index].std(dim=0).clamp_min(1e-6)

        standardised = (train_features - mean) / std
        fit = (standardised[fit_index], train_labels[fit_index])
        validation = (standardised[validation_index], train_labels[validation_index])
        best = None
        for weight_decay in config.weight_decays:
            classifier, validation_accuracy, epoch = train_logistic_regression(
                *fit,
                num_classes,
                validation=validation,
                weight_decay=weight_decay,
                epochs=config.epochs,
                batch_size=config.batch_size,
                learning_rate=config.learning_rate,
                seed=seed,
            )
            if best is None or validation_accuracy > best[1]:
                best = (classifier, validation_accuracy, epoch, weight_decay)
        accuracies.append(_accuracy(best[0], (test_features - mean) / std, test_labels))
        selected.append({"seed": seed, "weight_decay": best[3], "epoch": best[2], "validation_accuracy": best[1]})
    return {**mean_interval(accuracies), "selected": selected}


# ----------------------------------------------------------------------------------------- checkpoints


def evaluate_model(
    model,
    dataset: str,
    *,
    image_size: int,
    data_dir: str | None = None,
    download: bool | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    batch_size: int = 256,
    probe: LinearProbeConfig | None = None,
    ks: Sequence[int] = KNN_KS,
    knn_temperature: float = 0.1,
    device: str | torch.device = "cpu",
) -> dict:
    """Linear probe and kNN of ``model.backbone`` (frozen) on a labelled data set's train/test splits.

    ``train_size`` / ``test_size`` keep fixed random subsets. Returns a JSON-ready dict with
    ``linear_accuracy`` (mean, ci95_low, ci95_high, std, values, selected), ``knn_accuracy`` and ``recall_at_k``
    (keyed by k as strings) and the settings.
    """

    spec = dataset_spec(dataset)
    transform = evaluation_transform(image_size, mean=spec.mean, std=spec.std)
    # both splits read (and their files checked) before any feature is computed
    images = {
        split: load_image_dataset(
            dataset,
            split,
            transform=transform,
            data_dir=data_dir,
            image_size=image_size,
            download=download,
            limit=limit,
            seed=0,
        )
        for split, limit in (("train", train_size), ("test", test_size))
    }
    splits = {}
    for split in images:
        splits[split] = extract_features(
            model.backbone, images[split], batch_size=batch_size, device=device, desc=f"{split} features"
        )
        labels = splits[split][1]
        outside = ((labels < 0) | (labels >= spec.num_classes)).nonzero().flatten()
        if len(outside):  # the readers check their files; this catches any other source before an IndexError
            raise ValueError(
                f"{dataset} {split} split (under {resolve_data_dir(data_dir) / dataset}): label "
                f"{int(labels[outside[0]])} of item {int(outside[0])} is outside its {spec.num_classes} classes"
            )
    (train_x, train_y), (test_x, test_y) = splits["train"], splits["test"]
    probe = probe or LinearProbeConfig()
    linear = linear_probe(train_x, train_y, test_x, test_y, config=probe, num_classes=spec.num_classes)
    knn = knn_evaluate(
        train_x, train_y, test_x, test_y, ks=ks, temperature=knn_temperature, num_classes=spec.num_classes
    )
    return {
        "dataset": dataset,
        "image_size": image_size,
        "num_train": len(train_y),
        "num_test": len(test_y),
        "feature_dim": int(train_x.shape[1]),
        "linear_accuracy": linear,
        "knn_accuracy": {str(k): v for k, v in knn["accuracy"].items()},
        "recall_at_k": {str(k): v for k, v in knn["recall"].items()},
        "knn_temperature": knn_temperature,
        "probe": probe.to_dict(),
    }


def evaluate_checkpoint(
    checkpoint: str | Path,
    *,
    dataset: str | None = None,
    data_dir: str | None = None,
    device: str | torch.device = "cpu",
    **evaluation,
) -> dict:
    """:func:`evaluate_model` for a pretraining checkpoint (a checkpoint folder or a run folder).

    ``dataset`` defaults to the pretraining one, images are evaluated at the pretraining size; the other keyword
    arguments go to :func:`evaluate_model`. Adds ``checkpoint``, ``backbone``, ``loss``, ``pretraining_dataset``
    and ``step`` to its results.
    """

    checkpoint = resolve_checkpoint(checkpoint)
    model, config = load_pretrained(checkpoint, device=device)
    image_size = config.image_size or dataset_spec(config.dataset).image_size
    results = evaluate_model(
        model,
        dataset or config.dataset,
        image_size=image_size,
        data_dir=data_dir or config.data_dir,
        device=device,
        **evaluation,
    )
    return {
        "checkpoint": str(checkpoint),
        "backbone": config.backbone,
        "loss": config.loss,
        "pretraining_dataset": config.dataset,
        "step": read_trainer_state(checkpoint)["step"],
        **results,
    }


def results_markdown(results: dict) -> str:
    """A markdown summary of :func:`evaluate_checkpoint`'s results: one row per k, linear probe on top."""
    linear = results["linear_accuracy"]
    lines = [
        (
            f"**{results['loss']}**, {results['backbone']} on {results['dataset']} "
            f"(step {results['step']}, {results['num_train']} train / {results['num_test']} test images)"
        ),
        "",
        (
            f"Linear probe: {100 * linear['mean']:.2f}% "
            f"(95% interval {100 * linear['ci95_low']:.2f}-{100 * linear['ci95_high']:.2f}, "
            f"{len(linear['values'])} probe seeds)"
        ),
        "",
        "| k | kNN accuracy (%) | label recall@k (%) |",
        "| ---: | ---: | ---: |",
    ]
    for k, accuracy in results["knn_accuracy"].items():
        lines.append(f"| {k} | {100 * accuracy:.2f} | {100 * results['recall_at_k'][k]:.2f} |")
    return "\n".join(lines) + "\n"
