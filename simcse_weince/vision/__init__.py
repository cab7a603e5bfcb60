"""Vision adapter: SimCLR pretraining with WEINCE or InfoNCE on torchvision backbones, linear probe and kNN.

Modules: :mod:`.backbones` (ResNet-18/50, ViT-Small, projection head), :mod:`.augment` (SimCLR views),
:mod:`.datasets` (CIFAR-10/100, STL-10, ImageNet-32, Tiny-ImageNet, FakeData, scikit-learn digits),
:mod:`.config` (its settings), :mod:`.train` (the Accelerate loop, on :mod:`simcse_weince.training`),
:mod:`.evaluate` (linear probe, kNN), :mod:`.extra_terms` (the authors' optional top-M terms), :mod:`.cli`
(``simcse-weince vision``). Needs the ``vision`` extra (torchvision).

Importing this package is light: the names below load their module on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SimCLRModel": "backbones",
    "build_backbone": "backbones",
    "ProjectionHead": "backbones",
    "simclr_augmentation": "augment",
    "evaluation_transform": "augment",
    "TwoViews": "augment",
    "load_image_dataset": "datasets",
    "DATASETS": "datasets",
    "VisionTrainConfig": "config",
    "train": "train",
    "load_pretrained": "train",
    "TopMExtraTerms": "extra_terms",
    "ExtraTermsConfig": "extra_terms",
    "LinearProbeConfig": "evaluate",
    "linear_probe": "evaluate",
    "knn_evaluate": "evaluate",
    "evaluate_checkpoint": "evaluate",
    "evaluate_model": "evaluate",
    "results_markdown": "evaluate",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value  # not the submodule of the same name that the import bound (see text/__init__.py)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
