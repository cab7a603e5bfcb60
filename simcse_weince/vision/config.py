"""The vision trainer's settings: :class:`VisionTrainConfig`. Importing this module does not import torch.

The run settings have the text trainer's names (``num_epochs``, ``save_steps``, ``logging_steps``,
``save_total_limit``, ``learning_rate``, ``mixed_precision``, ``report_to``); the names of earlier releases
(:data:`DEPRECATED_NAMES`) are still read from flags and files, with a warning, for one release.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from simcse_weince.precision import MIXED_PRECISION
from simcse_weince.settings import LOSSES, REPORT_TO, apply_overrides
from simcse_weince.validation import Domain, check_domains, check_field_types
from simcse_weince.weince.config import WeinceConfig

# Kept equal to datasets.DATASETS / backbones.BACKBONES (a test checks it): the config checks names without torch.
DATASET_CHOICES = ("cifar10", "cifar100", "stl10", "imagenet32", "tiny_imagenet", "fake", "digits")
BACKBONE_CHOICES = ("resnet18", "resnet50", "vit_small")
STEMS = ("auto", "cifar", "imagenet")
#: the allowed values of VisionTrainConfig's choice fields (named in the CLI help; checked by validate())
FIELD_CHOICES = {"dataset": DATASET_CHOICES, "backbone": BACKBONE_CHOICES, "stem": STEMS, "loss": LOSSES,
                 "mixed_precision": MIXED_PRECISION, "report_to": REPORT_TO}  # fmt: skip
#: setting names of earlier releases -> today's (deprecated; removed in the next release)
DEPRECATED_NAMES = {
    "epochs": "num_epochs",
    "save_every": "save_steps",
    "log_every": "logging_steps",
    "keep_checkpoints": "save_total_limit",
    "lr": "learning_rate",
}

#: the domain of each numeric setting of VisionTrainConfig (None, where a field allows it, is always allowed)
FIELD_DOMAINS = {
    "image_size": Domain(1, why="or None: the data set's native size"),
    "vit_layers": Domain(1, why="or None"),
    "projection_dim": Domain(1),
    "train_size": Domain(1, why="or None"),
    "crop_scale_min": Domain(0, 1, low_closed=False, why="a share of the area"),
    "temperature": Domain(0, low_closed=False),
    "batch_size": Domain(2, why="the other images of the batch are the negatives"),
    "learning_rate": Domain(0, low_closed=False),
    "weight_decay": Domain(0),
    "num_epochs": Domain(0, why="0: the untrained model"),
    "max_steps": Domain(1, why="or None"),
    "num_workers": Domain(0),
    "seed": Domain(0, 2**32, high_closed=False, shown="an integer in [0, 2**32)"),  # what numpy's RNG accepts
    "save_steps": Domain(1, why="or None"),
    "save_total_limit": Domain(1),
    "logging_steps": Domain(1),
}


@dataclass
class VisionTrainConfig:
    """Everything a SimCLR pretraining run depends on; saved as ``training_config.yaml`` in the run folder.

    Defaults are the paper's: batch 256, Adam lr 3e-4, τ 0.5, 100 epochs, 64-dim projections.
    """

    # data and model
    dataset: str = "cifar10"  # one of DATASET_CHOICES
    backbone: str = "resnet18"  # one of BACKBONE_CHOICES
    data_dir: str | None = None  # None: $SIMCSE_WEINCE_DATA_DIR, else ~/.cache/simcse_weince/data
    download: bool | None = None  # None: download unless offline mode is on
    image_size: int | None = None  # None: the data set's native size
    stem: str = "auto"  # ResNet stem: auto (CIFAR stem up to 32 px), cifar, imagenet
    vit_layers: int | None = None  # ViT depth override (None: ViT-Small's 12)
    projection_dim: int = 64
    train_size: int | None = None  # use a fixed random subset of the pretraining images
    crop_scale_min: float = 0.08  # RandomResizedCrop's smallest area share (SimCLR's 0.08; 0.5 is milder)
    # loss
    loss: str = "weince"  # weince | infonce (plain NT-Xent, the paper's baseline)
    temperature: float = 0.5
    weince: WeinceConfig = field(default_factory=WeinceConfig)
    extra_terms: bool = False  # the authors' top-M terms, off by default (docs/method.md#vision-the-top-m-extra-terms)
    # optimisation
    batch_size: int = 256  # global batch: split over processes, gathered back for the loss
    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    num_epochs: int = 100  # 0: no training, the run's checkpoint is the seed's initialised model
    max_steps: int | None = None  # stop after this many optimizer steps
    mixed_precision: str = "auto"  # auto (bf16 where native, else fp32) | no | fp16 | bf16
    cpu: bool = False  # force the CPU even when an accelerator is present
    num_workers: int = 0
    seed: int = 0
    # checkpoints and logging
    save_steps: int | None = None  # checkpoint every N steps; None: at the end of every epoch (and always at the end)
    save_total_limit: int = 2  # step checkpoints kept, >= 1
    logging_steps: int = 10
    report_to: tuple[str, ...] = ("csv", "tensorboard")
    output_dir: str = "runs/vision"

    def __post_init__(self) -> None:
        if isinstance(self.weince, dict):
            self.weince = WeinceConfig(**self.weince)
        if isinstance(self.report_to, list):  # anything else but a tuple: check_field_types names it
            self.report_to = tuple(self.report_to)
        self.validate()

    def validate(self) -> None:

        check_field_types(self)  # num_epochs="10" -> TypeError naming the field
        for name in ("loss", "dataset", "backbone", "stem", "mixed_precision"):
            choices = FIELD_CHOICES[name]
            if getattr(self, name) not in choices:
                raise ValueError(f"unknown {name} {getattr(self, name)!r}; expected one of {choices}")
        check_domains(self, FIELD_DOMAINS)
        # options that would be silently ignored by this combination are refused
        if self.vit_layers is not None and not self.backbone.startswith("vit"):
            raise ValueError(f"vit_layers applies to ViT backbones only, not {self.backbone!r}; leave it unset")
        if self.stem != "auto" and self.backbone.startswith("vit"):
            raise ValueError(f"stem applies to ResNet backbones only, not {self.backbone!r}; leave it at 'auto'")
        if not self.output_dir.strip():
            raise ValueError("output_dir is empty")
        unknown = [name for name in self.report_to if name not in REPORT_TO]
        if unknown:
            raise ValueError(f"unknown report_to {unknown}; supported: {', '.join(REPORT_TO)}")

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["report_to"] = list(self.report_to)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> VisionTrainConfig:
        """A config from saved settings, reading the names of earlier releases too."""

        return apply_overrides(cls(), dict(values), DEPRECATED_NAMES)
