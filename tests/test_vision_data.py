"""Image data sets (digits, FakeData, ImageNet-32 batches, Tiny-ImageNet folders, offline errors) and augmentations."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")
from PIL import Image

from simcse_weince.vision.augment import TwoViews, evaluation_transform, simclr_augmentation
from simcse_weince.vision.datasets import DATASETS, load_image_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def test_digits_is_a_stratified_split_of_the_real_images():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    digits = sklearn_datasets.load_digits()
    train = load_image_dataset("digits", "train", image_size=8)
    test = load_image_dataset("digits", "test", image_size=8)
    assert len(train) + len(test) == 1797 and len(test) == pytest.approx(0.2 * 1797, abs=10)
    assert train.labels.tolist() == load_image_dataset("digits", "pretrain", image_size=8).labels.tolist()
    for label in range(10):  # every class is split 80/20
        share = (test.labels == label).sum() / (digits.target == label).sum()
        assert share == pytest.approx(0.2, abs=0.02)
    # at the native size the RGB image is the 8x8 digit scaled from 0..16 to 0..255
    image, label = test[0]
    pixels = np.asarray(image)
    assert pixels.shape == (8, 8, 3) and (pixels[..., 0] == pixels[..., 2]).all()
    matches = [
        i
        for i in np.flatnonzero(digits.target == label)
        if np.array_equal(np.round(digits.images[i] * 255 / 16).astype(np.uint8), pixels[..., 0])
    ]
    assert matches, "the test image is one of scikit-learn's digits"
    upscaled, _ = load_image_dataset("digits", "test", image_size=32)[0]
    assert upscaled.size == (32, 32) and upscaled.mode == "RGB"


def test_fake_data_splits_and_subset():
    train = load_image_dataset("fake", "train", image_size=16, fake_size=40)
    test = load_image_dataset("fake", "test", image_size=16, fake_size=40)
    assert (len(train), len(test)) == (40, 10)
    assert train[0][0].size == (16, 16)
    assert not np.array_equal(np.asarray(train[0][0]), np.asarray(test[0][0]))
    subset = load_image_dataset("fake", "train", image_size=16, fake_size=40, limit=8, seed=3)
    again = load_image_dataset("fake", "train", image_size=16, fake_size=40, limit=8, seed=3)
    assert len(subset) == 8 and subset.indices == again.indices


def test_cifar_offline_gives_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="cifar10 not found under .*offline"):
        load_image_dataset("cifar10", "train", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="stl10"):
        load_image_dataset("stl10", "pretrain", data_dir=tmp_path, download=False)


def _imagenet32_batch(path, images, labels, npz=False, protocol=None):
    data = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # channel-major rows, as distributed
    if npz:
        np.savez(path, data=data, labels=labels)
    else:
        with open(path, "wb") as handle:
            pickle.dump({"data": data, "labels": labels, "mean": data.mean(0)}, handle, protocol=protocol)


@pytest.mark.parametrize("npz, protocol", [(False, 2), (False, 4), (False, 5), (True, None)])
def test_imagenet32_pickle_batches(tmp_path, npz, protocol):
    # every pickle protocol numpy arrays are written in reads through the allow-list reader (safe_load.py)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    folder = tmp_path / "imagenet32" / "Imagenet32_train"
    folder.mkdir(parents=True)
    suffix = ".npz" if npz else ""
    _imagenet32_batch(folder / f"train_data_batch_1{suffix}", images[:3], [1, 2, 1000], npz, protocol)
    _imagenet32_batch(folder / f"train_data_batch_2{suffix}", images[3:4], [7], npz, protocol)
    (tmp_path / "imagenet32" / "val").mkdir()
    _imagenet32_batch(tmp_path / "imagenet32" / "val" / f"val_data{suffix}", images[4:], [5], npz, protocol)
    train = load_image_dataset("imagenet32", "pretrain", data_dir=tmp_path)
    test = load_image_dataset("imagenet32", "test", data_dir=tmp_path)
    assert (len(train), len(test)) == (4, 1)
    assert [train[i][1] for i in range(4)] == [0, 1, 999, 6]  # labels become 0-based
    assert np.array_equal(np.asarray(train[2][0]), images[2]) and np.array_equal(np.asarray(test[0][0]), images[4])


def _imagenet32_rows(count, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(count, 32, 32, 3), dtype=np.uint8)


def test_imagenet32_batches_whose_parts_disagree_are_refused_naming_the_file(tmp_path, capsys):
    from simcse_weince.cli import main

    # issue 54 case 5: 8 images with 4 labels, then 4 images with 8 labels: 12 of each once joined
    folder = tmp_path / "imagenet32" / "Imagenet32_train"
    folder.mkdir(parents=True)
    _imagenet32_batch(folder / "train_data_batch_1", _imagenet32_rows(8), [1, 2, 3, 4])
    _imagenet32_batch(folder / "train_data_batch_2", _imagenet32_rows(4), [5, 6, 7, 8, 9, 10, 11, 12])
    with pytest.raises(ValueError, match=r"batch .*train_data_batch_1: 8 images but 4 labels"):
        load_image_dataset("imagenet32", "pretrain", data_dir=tmp_path)
    # the same through the CLI: one line naming the file
    run = tmp_path / "run"
    command = ["vision", "train", "--dataset", "imagenet32", "--data-dir", str(tmp_path), "--output-dir", str(run)]
    assert main([*command, "--max-steps", "1", "--batch-size", "4"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "train_data_batch_1: 8 images but 4 labels" in errors[0], errors
    # each batch is checked: a well-formed first batch does not hide a bad second one
    _imagenet32_batch(folder / "train_data_batch_1", _imagenet32_rows(4), [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"train_data_batch_2: 4 images but 8 labels"):
        load_image_dataset("imagenet32", "train", data_dir=tmp_path)


@pytest.mark.parametrize(
    "labels, message",
    [
        ([1, 1001], r"label 1001 \(image 1; 1 in all\) is outside the 1000 classes"),
        ([0, 5], r"label 0 \(image 0; 1 in all\) is outside the 1000 classes"),
        ([1.0, 2.5], r"labels are float64, expected whole numbers"),
        ([[1], [2]], r"2 images but 2 labels"),  # a column of labels, not one per image
    ],
)
def test_imagenet32_labels_outside_the_classes_are_refused_when_read(tmp_path, labels, message):
    folder = tmp_path / "imagenet32" / "val"
    folder.mkdir(parents=True)
    _imagenet32_batch(folder / "val_data", _imagenet32_rows(2), labels)
    with pytest.raises(ValueError, match=r"ImageNet-32 batch .*val_data: " + message):
        load_image_dataset("imagenet32", "test", data_dir=tmp_path)


def test_imagenet32_batch_without_its_parts_is_named(tmp_path):
    folder = tmp_path / "imagenet32" / "val"
    folder.mkdir(parents=True)
    with open(folder / "val_data", "wb") as handle:
        pickle.dump({"data": np.zeros((2, 3072), dtype=np.uint8)}, handle)
    with pytest.raises(ValueError, match=r"val_data: expected a dict with 'data' and 'labels', found \['data'\]"):
        load_image_dataset("imagenet32", "test", data_dir=tmp_path)
    np.savez(folder / "val_data.npz", data=np.zeros((2, 3, 32, 32), dtype=np.uint8), labels=[1, 2])
    (folder / "val_data").unlink()
    with pytest.raises(ValueError, match=r"val_data.npz: 'data' is uint8 of shape \(2, 3, 32, 32\)"):
        load_image_dataset("imagenet32", "test", data_dir=tmp_path)


def test_imagenet32_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="ImageNet-32 .*image-net.org"):
        load_image_dataset("imagenet32", "train", data_dir=tmp_path)


def test_tiny_imagenet_folder_layout(tmp_path, monkeypatch):
    root = tmp_path / "tiny_imagenet" / "tiny-imagenet-200"
    for wnid, colour in (("n02", (0, 255, 0)), ("n01", (255, 0, 0))):
        (root / "train" / wnid / "images").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (64, 64), colour).save(root / "train" / wnid / "images" / f"{wnid}_{i}.JPEG")
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("ignored\n")
    (root / "val" / "images").mkdir(parents=True)
    Image.new("L", (64, 64), 128).save(root / "val" / "images" / "val_0.JPEG")  # grayscale -> RGB
    Image.new("RGB", (64, 64), (255, 0, 0)).save(root / "val" / "images" / "val_1.JPEG")
    (root / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn02\t0\t0\t1\t1\nval_1.JPEG\tn01\t0\t0\t1\t1\n")
    train = load_image_dataset("tiny_imagenet", "train", data_dir=tmp_path)
    test = load_image_dataset("tiny_imagenet", "test", data_dir=tmp_path)
    assert len(train) == 4 and [train[i][1] for i in range(4)] == [0, 0, 1, 1]  # sorted wnids: n01, n02
    assert np.asarray(train[0][0])[0, 0, 0] > 200  # n01 images are red
    assert [test[0][1], test[1][1]] == [1, 0]
    assert test[0][0].mode == "RGB"
    # the validation labels must name training classes and existing images, each error naming file and line
    annotations = root / "val" / "val_annotations.txt"
    annotations.write_text("val_0.JPEG\tn02\t0\t0\t1\t1\nval_1.JPEG\tn03\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match=r"val_annotations.txt, line 2: class 'n03' is not one of the 2 training"):
        load_image_dataset("tiny_imagenet", "test", data_dir=tmp_path)
    annotations.write_text("val_0.JPEG\tn02\t0\t0\t1\t1\nval_9.JPEG\tn01\t0\t0\t1\t1\n")
    with pytest.raises(FileNotFoundError, match=r"val_annotations.txt, line 2: image .*val_9.JPEG is missing"):
        load_image_dataset("tiny_imagenet", "test", data_dir=tmp_path)
    annotations.write_text("val_0.JPEG n02\n")
    with pytest.raises(ValueError, match=r"val_annotations.txt, line 1: expected an image name and a class"):
        load_image_dataset("tiny_imagenet", "test", data_dir=tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="Tiny-ImageNet.*offline"):
        load_image_dataset("tiny_imagenet", "train", data_dir=tmp_path / "empty")


def test_bad_dataset_arguments():
    with pytest.raises(ValueError, match="unknown dataset"):
        load_image_dataset("mnist", "train")
    with pytest.raises(ValueError, match="unknown split"):
        load_image_dataset("fake", "validation")
    assert {"cifar10", "cifar100", "stl10", "imagenet32", "tiny_imagenet", "fake", "digits"} == set(DATASETS)


def test_simclr_views_are_random_and_evaluation_is_not():
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    torch.manual_seed(0)
    view_1, view_2 = TwoViews(simclr_augmentation(16))(image)
    assert view_1.shape == view_2.shape == (3, 16, 16) and not torch.equal(view_1, view_2)
    plain = evaluation_transform(16, mean=(0.5,) * 3, std=(0.25,) * 3)
    first, second = plain(image), plain(image)
    assert first.shape == (3, 16, 16) and torch.equal(first, second)
    grey = evaluation_transform(32, mean=(0.5,) * 3, std=(0.25,) * 3)(Image.new("RGB", (32, 32), (128,) * 3))
    assert torch.allclose(grey, torch.full_like(grey, (128 / 255 - 0.5) / 0.25), atol=1e-5)
