"""``simcse-weince vision train`` / ``eval`` end to end on real digits, and the CLI's errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torchvision")

from simcse_weince.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def test_train_then_eval_on_digits(tmp_path, capsys):
    run = tmp_path / "run"
    train_args = ["vision", "train", "--dataset", "digits", "--backbone", "resnet18", "--loss", "weince"]
    train_args += ["--num-epochs", "1", "--batch-size", "8", "--max-steps", "2", "--output-dir", str(run)]
    train_args += ["--seed", "3", "--image-size", "16", "--train-size", "64", "--beta", "1.0"]
    assert main(train_args) == 0
    assert "trained 2 steps" in capsys.readouterr().out
    # resuming the finished run from its latest checkpoint is a no-op
    assert main([*train_args, "--resume"]) == 0
    # without --resume an existing run is refused with a one-line error
    assert main(train_args) == 1
    assert "already holds a simcse-weince run; pass --resume" in capsys.readouterr().err

    eval_args = ["vision", "eval", str(run), "--train-size", "200", "--test-size", "100", "--probe-epochs", "5"]
    assert main([*eval_args, "--probe-seeds", "0", "1", "--knn-k", "1", "5", "20"]) == 0
    checkpoint = run / "checkpoints" / "step-0000002"
    results = json.loads((checkpoint / "results.json").read_text())
    assert results["step"] == 2 and (results["num_train"], results["num_test"]) == (200, 100)
    assert len(results["linear_accuracy"]["values"]) == 2
    assert results["linear_accuracy"]["ci95_low"] <= results["linear_accuracy"]["mean"]
    assert set(results["knn_accuracy"]) == set(results["recall_at_k"]) == {"1", "5", "20"}
    # label recall@k can only grow with k
    recall = results["recall_at_k"]
    assert recall["1"] <= recall["5"] <= recall["20"]
    # Two steps teach nothing measurable (untrained features already score 95-97% on digits), so no quality claim
    # here: the CLI's kNN@1 must equal scikit-learn's cosine 1-NN on the checkpoint's own features of the same
    # 200 / 100 images (the probe itself is checked against scikit-learn in test_vision_eval.py).
    knn_1, recall_1 = _sklearn_one_nn_accuracy(checkpoint, train_size=200, test_size=100)
    assert results["knn_accuracy"]["1"] == pytest.approx(knn_1, abs=1e-12)
    assert recall["1"] == pytest.approx(recall_1, abs=1e-12)
    table = (checkpoint / "results.md").read_text()
    assert "| k | kNN accuracy (%) | label recall@k (%) |" in table and table in capsys.readouterr().out


def _sklearn_one_nn_accuracy(checkpoint, *, train_size: int, test_size: int) -> tuple[float, float]:
    """Cosine 1-NN accuracy of a checkpoint's backbone features, by scikit-learn; twice (kNN@1 = recall@1)."""
    import torch
    from sklearn.neighbors import KNeighborsClassifier

    from simcse_weince.vision.augment import evaluation_transform
    from simcse_weince.vision.datasets import dataset_spec, load_image_dataset
    from simcse_weince.vision.trainer import load_pretrained

    model, config = load_pretrained(checkpoint)
    model.eval()
    spec = dataset_spec("digits")
    transform = evaluation_transform(config.image_size, mean=spec.mean, std=spec.std)
    features = {}
    for split, limit in (("train", train_size), ("test", test_size)):
        items = load_image_dataset("digits", split, transform=transform, image_size=config.image_size, limit=limit)
        images = torch.stack([items[i][0] for i in range(len(items))])
        with torch.no_grad():
            features[split] = (model.backbone(images).numpy(), [int(items[i][1]) for i in range(len(items))])
    classifier = KNeighborsClassifier(n_neighbors=1, metric="cosine").fit(*features["train"])
    accuracy = classifier.score(*features["test"])
    return accuracy, accuracy


def test_cli_errors(tmp_path, capsys):
    assert main(["vision", "eval", str(tmp_path / "missing")]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    assert main(["vision", "train", "--output-dir", str(tmp_path), "--dataset", "mnist"]) == 1
    assert "unknown dataset 'mnist'" in capsys.readouterr().err
    assert main(["vision"]) == 2


def test_choices_match_the_registries_and_help_is_light():
    from simcse_weince.vision import config
    from simcse_weince.vision.backbones import BACKBONES
    from simcse_weince.vision.datasets import DATASETS

    assert config.DATASET_CHOICES == tuple(DATASETS) and config.BACKBONE_CHOICES == BACKBONES
    code = (
        "import sys, simcse_weince.vision.cli; assert 'torchvision' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_help_of_every_command_answers_without_torch():
    """``simcse-weince --help`` and each sub-command's --help build every flag from the config dataclasses without
    importing torch (it takes seconds to import; the CLI answers in a fraction of one)."""
    code = (
        "import sys\n"
        "from simcse_weince.cli import build_parser\n"
        "parser = build_parser()\n"
        "parser.format_help()\n"
        "commands = next(a for a in parser._actions if a.__class__.__name__ == '_SubParsersAction').choices\n"
        "helps = [commands[name].format_help() for name in ('train', 'push', 'evaluate', 'diagnose', 'vision')]\n"
        "assert '--quantile' in helps[0] and '--num-epochs' in helps[0]\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
