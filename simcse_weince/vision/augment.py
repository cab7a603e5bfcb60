"""SimCLR augmentations (Chen et al., 2020, appendix A) and the plain transform used for evaluation.

Each training image is augmented twice, independently; the two views are the positive pair::

    views = TwoViews(simclr_augmentation(32))
    view_1, view_2 = views(pil_image)

Reference: T. Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations", ICML 2020.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Channel statistics are per data set (see datasets.DATASETS); this is the fallback.
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


def simclr_augmentation(
    image_size: int,
    *,
    mean: Sequence[float] = DEFAULT_MEAN,
    std: Sequence[float] = DEFAULT_STD,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    jitter_strength: float = 1.0,
):
    """Random resized crop, horizontal flip, colour jitter (0.8, 0.8, 0.8, 0.2) with p 0.8, grayscale with p 0.2.

    ``jitter_strength`` scales the jitter (SimCLR's ``s``; 1.0 reproduces 0.8/0.8/0.8/0.2). No Gaussian blur:
    the paper's small-image protocol (CIFAR, STL-10 at 96 px) leaves it out.
    """
    from torchvision import transforms

    jitter = transforms.ColorJitter(
        0.8 * jitter_strength, 0.8 * jitter_strength, 0.8 * jitter_strength, 0.2 * jitter_strength
    )
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size, scale=crop_scale, antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.RandomApply([jitter], p=0.8),
            transforms.RandomGrayscale(p=0.2),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


def evaluation_transform(image_size: int, *, mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD):
    """Resize to ``image_size`` (no crop, no randomness), to tensor, normalise: the frozen-feature transform."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.Resize((image_size, image_size), antialias=True),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )


class TwoViews:
    """Apply the same random transform twice to one image: ``(view_1, view_2)``, the positive pair."""

    def __init__(self, transform: Callable):
        self.transform = transform

    def __call__(self, image):
        return self.transform(image), self.transform(image)

    def __repr__(self) -> str:
        return f"TwoViews({self.transform!r})"
