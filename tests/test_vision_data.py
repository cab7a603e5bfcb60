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
