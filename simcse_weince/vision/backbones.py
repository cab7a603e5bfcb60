"""Backbones and the SimCLR model: a torchvision encoder plus a small projection head.

- ResNet-18 / ResNet-50 (torchvision, random init). For small images (<= 32 px) the *CIFAR stem* replaces the
  7x7/stride-2 convolution and the max-pool by one 3x3/stride-1 convolution, so a 32-px image keeps a 4x4 map
  before the pooling; 64/96-px images use the standard ImageNet stem.
- ViT-Small (torchvision's ``VisionTransformer`` with width 384, depth 12, 6 heads, MLP 1536). The paper's
  ViT-S/16 is sized for 224 px; for small images the patch size is adapted so that every image gives an 8x8 grid
  of patches (32 px -> 4, 64 px -> 8, 96 px -> 12).
- Projection head (SimCLR): Linear -> ReLU -> Linear to 64 dimensions. The loss sees the projections; the
  evaluations (linear probe, kNN) use the backbone features before the head.

Example::

    model = SimCLRModel.build("resnet18", image_size=32)
    projections = model(images)            # B x 64
    features = model.features(images)      # B x 512
"""

from __future__ import annotations

import torch
from torch import nn

BACKBONES = ("resnet18", "resnet50", "vit_small")
STEMS = ("auto", "cifar", "imagenet")

# ViT-Small as in DeiT-S / the paper: width 384, depth 12, 6 heads, MLP ratio 4.
VIT_SMALL = {"hidden_dim": 384, "num_layers": 12, "num_heads": 6, "mlp_dim": 1536}


def vit_patch_size(image_size: int) -> int:
    """Patch size giving an 8x8 grid of patches (16 at 128 px and above, as in ViT-S/16)."""
    if image_size >= 128:
        patch = 16
    else:
        patch = max(1, image_size // 8)
    if image_size % patch:
        raise ValueError(f"image size {image_size} is not a multiple of the ViT patch size {patch}")
    return patch


def _resnet(name: str, image_size: int, stem: str) -> tuple[nn.Module, int]:
    from torchvision.models import resnet18, resnet50

    model = {"resnet18": resnet18, "resnet50": resnet50}[name](weights=None)
    if stem == "auto":
        stem = "cifar" if image_size <= 32 else "imagenet"
    if stem == "cifar":
        # Small images: a 7x7/2 conv plus max-pool would shrink 32 px to 8 px before the first block.
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    feature_dim = model.fc.in_features
    model.fc = nn.Identity()
    return model, feature_dim


def _vit_small(image_size: int, num_layers: int | None) -> tuple[nn.Module, int]:
    from torchvision.models import VisionTransformer

    settings = dict(VIT_SMALL)
    if num_layers is not None:
        settings["num_layers"] = num_layers  # reduced depth for tests and quick experiments
    model = VisionTransformer(image_size=image_size, patch_size=vit_patch_size(image_size), **settings)
    model.heads = nn.Identity()  # the class-token output (384 dims) is the feature
    return model, settings["hidden_dim"]


def build_backbone(
    name: str, image_size: int, *, stem: str = "auto", vit_layers: int | None = None
) -> tuple[nn.Module, int]:
    """A randomly initialised torchvision backbone without classifier, and its feature dimension.

    Args:
        name: ``"resnet18"``, ``"resnet50"`` or ``"vit_small"``.
        image_size: side of the (square) input images in pixels.
        stem: ResNet stem: ``"auto"`` (CIFAR stem up to 32 px, standard above), ``"cifar"`` or ``"imagenet"``.
        vit_layers: override the ViT depth (12); ``None`` keeps ViT-Small.
    """
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; expected one of {BACKBONES}")
    if stem not in STEMS:
        raise ValueError(f"unknown stem {stem!r}; expected one of {STEMS}")
    if int(image_size) != image_size or image_size < 4:
        raise ValueError(f"image_size must be an integer >= 4, got {image_size}")
    if name == "vit_small":
        return _vit_small(int(image_size), vit_layers)
    return _resnet(name, int(image_size), stem)


class ProjectionHead(nn.Sequential):
    """SimCLR projection head: Linear -> ReLU -> Linear (hidden width = input width by default)."""

    def __init__(self, input_dim: int, output_dim: int = 64, hidden_dim: int | None = None):
        hidden_dim = hidden_dim or input_dim
        super().__init__(nn.Linear(input_dim, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, output_dim))


class SimCLRModel(nn.Module):
    """Backbone + projection head. ``forward`` returns projections, ``features`` the backbone output."""

    def __init__(self, backbone: nn.Module, feature_dim: int, projection_dim: int = 64):
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim
        self.projection = ProjectionHead(feature_dim, projection_dim)

    @classmethod
    def build(
        cls,
        backbone: str,
        image_size: int,
        *,
        projection_dim: int = 64,
        stem: str = "auto",
        vit_layers: int | None = None,
    ) -> SimCLRModel:
        module, feature_dim = build_backbone(backbone, image_size, stem=stem, vit_layers=vit_layers)
        return cls(module, feature_dim, projection_dim)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.projection(self.backbone(images))
