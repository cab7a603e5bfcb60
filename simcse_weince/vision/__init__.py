"""Vision adapter: SimCLR pretraining with WEINCE or InfoNCE on torchvision backbones, linear probe and kNN.

Modules: :mod:`.backbones` (ResNet-18/50, ViT-Small, projection head), :mod:`.augment` (SimCLR views),
:mod:`.datasets` (CIFAR-10/100, STL-10, ImageNet-32, Tiny-ImageNet, FakeData, scikit-learn digits),
:mod:`.config` (its settings), :mod:`.trainer` (the Accelerate loop, on :mod:`simcse_weince.training`),
:mod:`.evaluate` (linear probe, kNN), :mod:`.extra_terms` (the authors' optional top-M terms), :mod:`.cells`
(``VISION_CELLS``: a cell of ``vision compare``), :mod:`.cli` (``simcse-weince vision``: ``train``, ``eval``,
``compare``). Needs the ``vision`` extra (torchvision).

Importing this package is light: the names below load their module on first use.
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

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
    "train": "trainer",
    "load_pretrained": "trainer",
    "TopMExtraTerms": "extra_terms",
    "ExtraTermsConfig": "extra_terms",
    "LinearProbeConfig": "evaluate",
    "linear_probe": "evaluate",
    "knn_evaluate": "evaluate",
    "evaluate_checkpoint": "evaluate",
    "evaluate_model": "evaluate",
    "results_markdown": "evaluate",
    "VISION_VARIANTS": "cells",
    "VISION_CELLS": "cells",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
