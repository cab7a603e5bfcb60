"""Backbones: output shapes at 32/64/96 px, the CIFAR vs standard ResNet stem, ViT-Small's shape, the head."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchvision")

from simcse_weince.vision.backbones import SimCLRModel, build_backbone, vit_patch_size

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors


def _forward(model: SimCLRModel, image_size: int):
    """Features, projections and the spatial size of the ResNet's last feature map (before pooling)."""
    seen = {}
    hook = model.backbone.layer4.register_forward_hook(lambda m, i, output: seen.update(shape=output.shape))
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, image_size, image_size))
        projections = model.projection(features)
    hook.remove()
    return features, projections, tuple(seen["shape"][2:])


@pytest.mark.parametrize("name, feature_dim", [("resnet18", 512), ("resnet50", 2048)])
def test_resnet_shapes_and_stem(name, feature_dim):
    # CIFAR stem at 32 px: 3x3 stride-1 conv, no max-pool -> a 4x4 map at layer4
    model = SimCLRModel.build(name, 32).eval()
    conv1 = model.backbone.conv1
    assert (conv1.kernel_size, conv1.stride) == ((3, 3), (1, 1))
    assert isinstance(model.backbone.maxpool, torch.nn.Identity)
    features, projections, final_map = _forward(model, 32)
    assert (features.shape, projections.shape, final_map) == ((2, feature_dim), (2, 64), (4, 4))
    # standard stem at 64/96 px: 7x7 stride-2 conv and max-pool -> /32 overall (same architecture for both)
    model = SimCLRModel.build(name, 64).eval()
    conv1 = model.backbone.conv1
    assert (conv1.kernel_size, conv1.stride) == ((7, 7), (2, 2))
    assert isinstance(model.backbone.maxpool, torch.nn.MaxPool2d)
    for image_size in (64, 96):
        features, projections, final_map = _forward(model, image_size)
        assert (features.shape, projections.shape) == ((2, feature_dim), (2, 64))
        assert final_map == (image_size // 32,) * 2


def test_stem_can_be_forced():
    model = SimCLRModel(*build_backbone("resnet18", 32, stem="imagenet")).eval()
    assert model.backbone.conv1.kernel_size == (7, 7)
    assert _forward(model, 32)[2] == (1, 1)
    model = SimCLRModel(*build_backbone("resnet18", 64, stem="cifar")).eval()
    assert _forward(model, 64)[2] == (8, 8)


@pytest.mark.parametrize("image_size, patch", [(32, 4), (64, 8), (96, 12)])
def test_vit_small_shapes(image_size, patch):
    assert vit_patch_size(image_size) == patch
    model = SimCLRModel.build("vit_small", image_size).eval()
    vit = model.backbone
    assert (vit.hidden_dim, vit.patch_size, len(vit.encoder.layers), vit.mlp_dim) == (384, patch, 12, 1536)
    assert vit.encoder.layers[0].self_attention.num_heads == 6
    assert vit.seq_length == (image_size // patch) ** 2 + 1  # 8x8 patches + class token
    with torch.no_grad():
        features = model.features(torch.randn(2, 3, image_size, image_size))
        assert (features.shape, model.projection(features).shape) == ((2, 384), (2, 64))


def test_vit_reduced_depth_and_projection_head():
    model = SimCLRModel.build("vit_small", 16, vit_layers=1, projection_dim=8)
    assert len(model.backbone.encoder.layers) == 1
    linear_1, relu, linear_2 = model.projection
    assert (linear_1.in_features, linear_1.out_features, linear_2.out_features) == (384, 384, 8)
    assert isinstance(relu, torch.nn.ReLU)
    assert vit_patch_size(224) == 16  # the paper's ViT-S/16 at full resolution


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "resnet34", "image_size": 32}, "unknown backbone"),
        ({"name": "resnet18", "image_size": 32, "stem": "tiny"}, "unknown stem"),
        ({"name": "vit_small", "image_size": 33}, "not a multiple"),
        ({"name": "resnet18", "image_size": 2}, "image_size"),
    ],
)
def test_bad_backbone_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_backbone(**kwargs)
