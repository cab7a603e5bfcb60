"""Image data sets of the paper's vision protocol, plus two small ones for tests and CPU benchmarks.

Every data set yields ``(image, label)`` with a PIL RGB image before ``transform``. Splits:

- ``"pretrain"``: the images SimCLR trains on (labels unused): the training split, or STL-10's ``unlabeled``;
- ``"train"``: the labelled images the linear probe and the kNN index are fitted on;
- ``"test"``: the held-out labelled images (Tiny-ImageNet and ImageNet-32: their validation sets).

| name | source | size | classes |
| --- | --- | --- | --- |
| ``cifar10``, ``cifar100`` | torchvision (downloads) | 32 | 10 / 100 |
| ``stl10`` | torchvision (downloads; ``unlabeled`` for pretraining) | 96 | 10 |
| ``imagenet32`` | downsampled-ImageNet pickle batches (manual download from image-net.org) | 32 | 1000 |
| ``tiny_imagenet`` | cs231n ``tiny-imagenet-200`` folder layout (downloads) | 64 | 200 |
| ``fake`` | torchvision ``FakeData`` (noise images, random labels; for plumbing tests) | any | 10 |
| ``digits`` | scikit-learn's 8x8 handwritten digits, upscaled (ships with scikit-learn) | any | 10 |

Files live under :func:`simcse_weince.paths.resolve_data_dir` (``--data-dir`` > ``$SIMCSE_WEINCE_DATA_DIR`` >
``~/.cache/simcse_weince/data``), one sub-folder per data set. Missing files are downloaded unless offline mode
is on (``HF_HUB_OFFLINE=1`` and friends), in which case a ``FileNotFoundError`` says what is missing where.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from simcse_weince.paths import hub_is_offline, resolve_data_dir
from simcse_weince.safe_load import load_pickle

SPLITS = ("pretrain", "train", "test")
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"


@dataclass(frozen=True)
class DatasetSpec:
    """What the training and evaluation code needs to know about a data set."""

    name: str
    image_size: int  # native side in pixels (the default training size)
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec("cifar10", 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
        DatasetSpec("cifar100", 32, 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
        DatasetSpec("stl10", 96, 10, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)),
        DatasetSpec("imagenet32", 32, 1000, (0.4811, 0.4575, 0.4078), (0.2605, 0.2533, 0.2683)),
        DatasetSpec("tiny_imagenet", 64, 200, (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)),
        DatasetSpec("fake", 32, 10, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
        DatasetSpec("digits", 32, 10, (0.27, 0.27, 0.27), (0.37, 0.37, 0.37)),
    )
}


def dataset_spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {tuple(DATASETS)}")
    return DATASETS[name]


def _offline_error(what: str, where: Path, hint: str = "") -> FileNotFoundError:
    return FileNotFoundError(
        f"{what} not found under {where} and downloads are off (offline mode: HF_HUB_OFFLINE / "
        f"HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE is set, or download=False). {hint}".rstrip()
    )


def _download_error(what: str, where: Path, error: Exception) -> FileNotFoundError:
    reason = getattr(error, "reason", None) or str(error).splitlines()[0] if str(error) else type(error).__name__
    return FileNotFoundError(
        f"{what} is not under {where} and downloading it failed ({reason}); check the network connection, put "
        "the files there, or pass --no-download / set HF_HUB_OFFLINE=1 to work offline"
    )


def _may_download(download: bool | None) -> bool:
    return (not hub_is_offline()) if download is None else bool(download)


# --------------------------------------------------------------------------------------- torchvision sets


def _torchvision_dataset(name: str, root: Path, split: str, transform, download: bool):
    from torchvision import datasets

    if name in ("cifar10", "cifar100"):
        cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
        kwargs = {"train": split != "test"}
    else:  # stl10: pretraining on the 100k unlabelled images, as the paper does
        cls = datasets.STL10
        kwargs = {"split": {"pretrain": "unlabeled", "train": "train", "test": "test"}[split]}
    try:
        return cls(root=str(root), transform=transform, download=False, **kwargs)
    except RuntimeError:  # torchvision: "Dataset not found or corrupted"
        if not download:
            raise _offline_error(
                name, root, f"Put torchvision's {cls.__name__} files there (or run once online)."
            ) from None
    root.mkdir(parents=True, exist_ok=True)
    try:
        return cls(root=str(root), transform=transform, download=True, **kwargs)
    except Exception as error:  # noqa: BLE001 - URLError, timeouts, HTTP errors, a bad archive
        raise _download_error(name, root, error) from error


# ----------------------------------------------------------------------------------------- ImageNet-32


class ImageNet32(Dataset):
    """Downsampled ImageNet 32x32 (Chrabaszcz et al., 2017) from its pickle batches.

    Layout (as unpacked from ``Imagenet32_train.zip`` / ``Imagenet32_val.zip``, pickle or ``.npz`` variant),
    anywhere below ``root``: ``train_data_batch_1`` ... ``train_data_batch_10`` and ``val_data``, each a dict
    with ``data`` (N x 3072 uint8, channel-major) and ``labels`` (1..1000). Labels are returned 0-based.
    The files need an image-net.org account, so they are never downloaded automatically.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        train: bool = True,
        transform: Callable | None = None,
        num_classes: int = 1000,
    ):
        root = Path(root)
        pattern = "train_data_batch_*" if train else "val_data*"
        files = sorted(root.rglob(pattern), key=lambda p: (len(p.name), p.name)) if root.is_dir() else []
        if not files:
            raise FileNotFoundError(
                f"ImageNet-32 {'training batches (train_data_batch_*)' if train else 'validation batch (val_data)'} "
                f"not found under {root}. Download the 32x32 downsampled ImageNet (pickle or npz) from "
                "https://image-net.org/download-images.php and unpack it there."
            )
        images, labels = [], []
        for path in files:
            batch_images, batch_labels = self._checked_batch(path, self._read_batch(path), num_classes)
            images.append(batch_images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(batch_labels - 1)
        self.images = np.concatenate(images)
        self.labels = np.concatenate(labels)
        self.transform = transform

    @staticmethod
    def _checked_batch(path: Path, batch, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """A batch's images (N x 3072 uint8) and 1-based labels (N), each batch checked on its own: batches are
        joined afterwards, so a batch with more images than labels next to one with fewer would otherwise pair
        images with other images' labels."""
        if not isinstance(batch, dict) or not {"data", "labels"} <= set(batch):
            found = sorted(map(str, batch)) if isinstance(batch, dict) else type(batch).__name__
            raise ValueError(f"ImageNet-32 batch {path}: expected a dict with 'data' and 'labels', found {found}")
        data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"])
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
            raise ValueError(
                f"ImageNet-32 batch {path}: 'data' is {data.dtype} of shape {data.shape}, expected uint8 rows of "
                f"{3 * 32 * 32} values (one 3x32x32 image per row)"
            )
        if labels.ndim != 1 or len(labels) != len(data):
            raise ValueError(
                f"ImageNet-32 batch {path}: {len(data)} images but {labels.size} labels; the two parts of a batch "
                "must have one label per image"
            )
        if labels.size and labels.dtype.kind not in "iu":
            raise ValueError(f"ImageNet-32 batch {path}: labels are {labels.dtype}, expected whole numbers")
        outside = np.flatnonzero((labels < 1) | (labels > num_classes))
        if outside.size:
            raise ValueError(
                f"ImageNet-32 batch {path}: label {labels[outside[0]]} (image {outside[0]}; {outside.size} in all) "
                f"is outside the {num_classes} classes (labels are 1..{num_classes})"
            )
        return data, labels.astype(np.int64)

    @staticmethod
    def _read_batch(path: Path) -> dict:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as batch:
                return {"data": batch["data"], "labels": batch["labels"]}
        # the format of these batches is a pickle: read by the allow-list reader (numpy arrays, lists, numbers),
        # so a crafted batch is refused before anything in it is built
        return load_pickle(path)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        from PIL import Image

        image = Image.fromarray(self.images[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


# --------------------------------------------------------------------------------------- Tiny-ImageNet


class TinyImageNet(Dataset):
    """Tiny-ImageNet-200 in its original folder layout (``tiny-imagenet-200/`` below ``root``).

    ``train/<wnid>/images/*.JPEG`` (500 per class) and ``val/images/*.JPEG`` labelled by
    ``val/val_annotations.txt`` (file, wnid, box). Classes are the sorted training wnids. The unlabelled
    ``test`` folder is not used: the validation set is the test split, as in the paper.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        train: bool = True,
        transform: Callable | None = None,
        download: bool = False,
        num_classes: int = 200,
    ):
        folder = Path(root) / "tiny-imagenet-200"
        if not (folder / "train").is_dir():
            if not download:
                raise _offline_error(
                    "Tiny-ImageNet (tiny-imagenet-200/train)",
                    Path(root),
                    f"Unpack {TINY_IMAGENET_URL} there.",
                )
            from torchvision.datasets.utils import download_and_extract_archive

            try:
                download_and_extract_archive(TINY_IMAGENET_URL, download_root=str(root))
            except Exception as error:  # noqa: BLE001 - URLError, timeouts, HTTP errors, a bad archive
                raise _download_error("tiny_imagenet", Path(root), error) from error
        self.classes = sorted(p.name for p in (folder / "train").iterdir() if p.is_dir())
        if len(self.classes) > num_classes:  # their indices would run past the classifier and the kNN votes
            raise ValueError(
                f"Tiny-ImageNet {folder / 'train'} holds {len(self.classes)} class folders, more than its "
                f"{num_classes} classes"
            )
        class_index = {wnid: i for i, wnid in enumerate(self.classes)}
        if train:
            self.samples = [
                (path, class_index[wnid])
                for wnid in self.classes
                for path in sorted((folder / "train" / wnid).rglob("*"))
                if path.suffix.lower() in (".jpeg", ".jpg", ".png")
            ]
        else:
            annotations = folder / "val" / "val_annotations.txt"
            if not annotations.is_file():
                raise FileNotFoundError(f"Tiny-ImageNet validation labels {annotations} are missing")
            self.samples = []
            for line_number, line in enumerate(annotations.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                fields = line.split("\t")
                where = f"Tiny-ImageNet validation labels {annotations}, line {line_number}"
                if len(fields) < 2:
                    raise ValueError(f"{where}: expected an image name and a class (tab-separated), got {line!r}")
                if fields[1] not in class_index:
                    raise ValueError(
                        f"{where}: class {fields[1]!r} is not one of the {len(self.classes)} training classes "
                        f"(the folders of {folder / 'train'})"
                    )
                image = folder / "val" / "images" / fields[0]
                if not image.is_file():
                    raise FileNotFoundError(f"{where}: image {image} is missing")
                self.samples.append((image, class_index[fields[1]]))
        if not self.samples:
            raise FileNotFoundError(f"no Tiny-ImageNet images under {folder}")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as image:
            image = image.convert("RGB")  # a few Tiny-ImageNet images are grayscale
        if self.transform is not None:
            image = self.transform(image)
        return image, label


# ------------------------------------------------------------------------------------------- digits


class Digits(Dataset):
    """scikit-learn's 1,797 handwritten digits (8x8, 17 grey levels), upscaled to ``image_size`` RGB images.

    A real, labelled image set that needs no download (it ships with scikit-learn). ``train`` / ``pretrain``
    and ``test`` are a fixed stratified 80/20 split (``split_seed``).
    """

    def __init__(
        self,
        split: str = "train",
        image_size: int = 32,
        transform: Callable | None = None,
        test_fraction: float = 0.2,
        split_seed: int = 0,
    ):
        try:
            from sklearn.datasets import load_digits
        except ImportError as error:  # scikit-learn is a dev dependency, not a core one
            raise RuntimeError("the 'digits' dataset needs scikit-learn: pip install scikit-learn") from error
        from PIL import Image

        digits = load_digits()
        test_mask = _stratified_mask(digits.target, test_fraction, split_seed)
        keep = test_mask if split == "test" else ~test_mask
        pixels = np.round(digits.images[keep] * (255.0 / 16.0)).astype(np.uint8)
        self.labels = digits.target[keep].astype(np.int64)
        self.images = [
            Image.fromarray(image, mode="L").resize((image_size, image_size), Image.BILINEAR).convert("RGB")
            for image in pixels
        ]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])


def _stratified_mask(labels: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask selecting round(fraction * n_c) items of every class c, at random (seeded)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), dtype=bool)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        mask[rng.permutation(members)[: round(fraction * len(members))]] = True
    return mask


# ------------------------------------------------------------------------------------------- entry point


def load_image_dataset(
    name: str,
    split: str,
    *,
    transform: Callable | None = None,
    data_dir: str | os.PathLike | None = None,
    image_size: int | None = None,
    download: bool | None = None,
    limit: int | None = None,
    seed: int = 0,
    fake_size: int = 512,
) -> Dataset:
    """One split of a data set, yielding ``(transform(image), label)``.

    Args:
        name: a key of :data:`DATASETS`.
        split: ``"pretrain"``, ``"train"`` or ``"test"``.
        transform: applied to the PIL image (e.g. ``TwoViews(simclr_augmentation(32))``).
        data_dir: root of the data folder (see :func:`simcse_weince.paths.resolve_data_dir`).
        image_size: side of generated images (``fake``, ``digits``); the file-backed sets keep their own size
            and are resized by the transform.
        download: ``None`` downloads when not offline; ``False`` never; ``True`` always allowed.
        limit: keep a fixed random subset of this many items (seeded by ``seed``), for quick runs.
        fake_size: number of ``fake`` images in the train/pretrain split (the test split has a quarter).
    """
    spec = dataset_spec(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    image_size = image_size or spec.image_size
    root = resolve_data_dir(data_dir) / name
    allow_download = _may_download(download)
    if name in ("cifar10", "cifar100", "stl10"):
        dataset = _torchvision_dataset(name, root, split, transform, allow_download)
    elif name == "imagenet32":
        dataset = ImageNet32(root, train=split != "test", transform=transform, num_classes=spec.num_classes)
    elif name == "tiny_imagenet":
        dataset = TinyImageNet(
            root, train=split != "test", transform=transform, download=allow_download, num_classes=spec.num_classes
        )
    elif name == "digits":
        dataset = Digits("test" if split == "test" else "train", image_size=image_size, transform=transform)
    else:  # fake: deterministic noise images; the test split uses other seeds than train/pretrain
        from torchvision.datasets import FakeData

        size = max(1, fake_size // 4) if split == "test" else fake_size
        dataset = FakeData(
            size=size,
            image_size=(3, image_size, image_size),
            num_classes=spec.num_classes,
            transform=transform,
            random_offset=10**6 if split == "test" else 0,
        )
    if limit is not None and limit < len(dataset):
        if limit < 1:
            raise ValueError(f"limit must be positive, got {limit}")
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
        dataset = Subset(dataset, order[:limit].tolist())
    return dataset
