"""SimCLR pretraining with WEINCE or InfoNCE (NT-Xent) on Accelerate.

One loop, readable top to bottom: two augmented views per image, one forward pass over both views, the
projections gathered across processes (with gradient, so the negatives and WEINCE's tail statistics span the
global batch), the loss in float32, Adam. Mixed precision (``bf16``/``fp16``) and multi-GPU come from Accelerate
(``accelerate launch -m simcse_weince.cli vision train ...``). Checkpoints are Accelerate states (model, optimizer,
RNG, sampler, the extra terms' EMA) plus ``trainer_state.json``; ``resume`` continues at the saved step.

Defaults are the paper's: batch 256, Adam lr 3e-4, tau 0.5, 100 epochs, 64-dim projections.

Example::

    config = VisionTrainConfig(dataset="cifar10", backbone="resnet18", loss="weince", output_dir="runs/c10")
    result = train(config)
    result["checkpoint"]   # runs/c10/checkpoints/step_019500
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from simcse_weince.weince import WeinceConfig, infonce_loss, summarize_statistics, weince_loss

LOSSES = ("weince", "infonce")
MIXED_PRECISION = ("no", "fp16", "bf16")
TRAINER_STATE = "trainer_state.json"
CHECKPOINTS = "checkpoints"


@dataclass
class VisionTrainConfig:
    """Everything a pretraining run needs; saved with every checkpoint."""

    dataset: str = "cifar10"
    backbone: str = "resnet18"
    loss: str = "weince"  # "weince" or "infonce" (plain NT-Xent, the paper's baseline)
    output_dir: str = "runs/vision"
    data_dir: str | None = None
    download: bool | None = None  # None: download unless offline mode is on
    image_size: int | None = None  # None: the data set's native size
    stem: str = "auto"  # ResNet stem: auto (CIFAR stem up to 32 px), cifar, imagenet
    vit_layers: int | None = None  # ViT depth override (None: ViT-Small's 12)
    projection_dim: int = 64
    epochs: int = 100
    batch_size: int = 256  # global batch: split over processes, gathered back for the loss
    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    temperature: float = 0.5
    weince: WeinceConfig = field(default_factory=WeinceConfig)
    extra_terms: bool = False  # the authors' top-M terms (spec section 7); off by default
    max_steps: int | None = None  # stop early after this many optimizer steps
    train_size: int | None = None  # use a fixed random subset of the pretraining images
    mixed_precision: str = "no"
    num_workers: int = 0
    seed: int = 0
    save_every: int | None = None  # checkpoint every n steps; None: at the end of every epoch
    keep_checkpoints: int = 2  # older checkpoints are deleted
    log_every: int = 10

    def __post_init__(self) -> None:
        from simcse_weince.validation import check_field_types

        if isinstance(self.weince, dict):
            self.weince = WeinceConfig(**self.weince)
        check_field_types(self)  # epochs="10" -> TypeError naming the field
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        for name in ("epochs", "batch_size", "projection_dim", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(
                f"batch_size must be >= 2 (the other images of the batch are the negatives), got {self.batch_size}"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        for name in ("image_size", "vit_layers", "train_size", "save_every"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or None), got {getattr(self, name)}")
        # options that would be silently ignored by this combination are refused
        if self.vit_layers is not None and not self.backbone.startswith("vit"):
            raise ValueError(f"vit_layers applies to ViT backbones only, not {self.backbone!r}; leave it unset")
        if self.stem != "auto" and self.backbone.startswith("vit"):
            raise ValueError(f"stem applies to ResNet backbones only, not {self.backbone!r}; leave it at 'auto'")
        for name in ("weight_decay", "num_workers", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("temperature", "learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> VisionTrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


class ContrastiveObjective:
    """The training loss on the two views' projections: WEINCE or NT-Xent (simclr geometry), plus the
    optional top-M extra terms. Runs in float32 outside autocast.

    ``__call__(z1, z2, diagnostics=True)`` also returns WEINCE's per-step diagnostics (mean lambda, share of
    anchors with lambda > 0.5, rho_0, mean Delta-AIC, mean beta-hat); computing them costs a little, so the
    loop asks only on logging steps.
    """

    def __init__(self, loss: str, temperature: float, weince: WeinceConfig | None = None, extra_terms=None):
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
        self.loss = loss
        self.temperature = float(temperature)
        self.weince = weince or WeinceConfig()
        self.extra_terms = extra_terms

    def __call__(self, z1: torch.Tensor, z2: torch.Tensor, *, diagnostics: bool = False):
        z1, z2 = z1.float(), z2.float()
        logs: dict[str, float] = {}
        with torch.autocast(device_type=z1.device.type, enabled=False):
            if self.loss == "infonce":
                loss = infonce_loss(z1, z2, temperature=self.temperature, geometry="simclr")
            elif diagnostics:
                loss, stats = weince_loss(
                    z1,
                    z2,
                    temperature=self.temperature,
                    config=self.weince,
                    geometry="simclr",
                    return_stats=True,
                )
                logs = {name: float(value) for name, value in summarize_statistics(stats).items()}
            else:
                loss = weince_loss(z1, z2, temperature=self.temperature, config=self.weince, geometry="simclr")
            if self.extra_terms is not None:
                loss = loss + self.extra_terms(z1, z2, temperature=self.temperature)
                if diagnostics:
                    logs.update(self.extra_terms.last_diagnostics)
        return loss, logs


# ------------------------------------------------------------------------------------------ checkpoints


def checkpoint_dirs(output_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    folder = Path(output_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [path for path in folder.glob("step_*") if (path / TRAINER_STATE).is_file()]
    return sorted(found, key=lambda path: int(path.name.split("_")[1]))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (with ``trainer_state.json``), or a run folder (its latest checkpoint)."""
    path = Path(path)
    if (path / TRAINER_STATE).is_file():
        return path
    found = checkpoint_dirs(path)
    if not found:
        raise FileNotFoundError(f"no checkpoint at {path} (expected {TRAINER_STATE} or {CHECKPOINTS}/step_*/)")
    return found[-1]


def read_trainer_state(checkpoint: str | Path) -> dict:
    return json.loads((resolve_checkpoint(checkpoint) / TRAINER_STATE).read_text())


def _save_checkpoint(accelerator, config: VisionTrainConfig, global_step: int, epoch: int) -> Path:
    path = Path(config.output_dir) / CHECKPOINTS / f"step_{global_step:06d}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        state = {"global_step": global_step, "epoch": epoch, "config": config.to_dict()}
        (path / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        for old in checkpoint_dirs(config.output_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return path


# ------------------------------------------------------------------------------------------- the loop


def build_model(config: VisionTrainConfig):
    from simcse_weince.vision.backbones import SimCLRModel
    from simcse_weince.vision.datasets import dataset_spec

    image_size = config.image_size or dataset_spec(config.dataset).image_size
    return SimCLRModel.build(
        config.backbone,
        image_size,
        projection_dim=config.projection_dim,
        stem=config.stem,
        vit_layers=config.vit_layers,
    )


def train(config: VisionTrainConfig, *, resume: str | Path | None = None) -> dict:
    """Pretrain a SimCLR model; returns ``{"output_dir", "checkpoint", "global_step", "history"}``.

    ``resume``: a checkpoint folder or a run folder (its latest checkpoint). Model, optimizer, RNG and sampler
    states are restored and training continues at the saved step (mid-epoch too: the epoch's first batches are
    skipped). ``history`` holds the logged steps of this call (loss and, for WEINCE, its diagnostics).
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from simcse_weince.distributed import gather_with_grad
    from simcse_weince.vision.augment import TwoViews, simclr_augmentation
    from simcse_weince.vision.datasets import dataset_spec, load_image_dataset
    from simcse_weince.vision.extra_terms import TopMExtraTerms

    if AcceleratorState._shared_state.get("_mixed_precision", config.mixed_precision) != config.mixed_precision:
        # Accelerate keeps one state per process; a second run in the same process (a notebook, the tests)
        # may ask for another precision. The process group (PartialState) is kept.
        AcceleratorState._reset_state()
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
    )
    set_seed(config.seed)
    if config.batch_size % accelerator.num_processes:
        raise ValueError(f"batch_size {config.batch_size} must divide over {accelerator.num_processes} processes")
    output_dir = Path(config.output_dir)
    if resume is None and checkpoint_dirs(output_dir):
        raise FileExistsError(
            f"{output_dir} already holds checkpoints: resume from them (--resume) or choose another output dir"
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output directory {output_dir} is a file; choose another --output-dir")

    # Data: two SimCLR views of every image; incomplete last batches are dropped (equal shapes for the gather).
    spec = dataset_spec(config.dataset)
    image_size = config.image_size or spec.image_size
    dataset = load_image_dataset(
        config.dataset,
        "pretrain",
        transform=TwoViews(simclr_augmentation(image_size, mean=spec.mean, std=spec.std)),
        data_dir=config.data_dir,
        image_size=image_size,
        download=config.download,
        limit=config.train_size,
        seed=config.seed,
    )
    per_process_batch = config.batch_size // accelerator.num_processes
    loader = DataLoader(
        dataset, batch_size=per_process_batch, shuffle=True, drop_last=True, num_workers=config.num_workers
    )
    if len(loader) == 0:
        raise ValueError(f"{config.dataset} has {len(dataset)} images, fewer than one batch of {per_process_batch}")

    model = build_model(config)
    output_dir.mkdir(parents=True, exist_ok=True)  # the data and the model are good: only now is a folder made
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    extra_terms = TopMExtraTerms() if config.extra_terms else None
    objective = ContrastiveObjective(config.loss, config.temperature, config.weince, extra_terms)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if extra_terms is not None:
        extra_terms.to(accelerator.device)
        accelerator.register_for_checkpointing(extra_terms)  # its EMA beta_t is part of the state

    steps_per_epoch = len(loader)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)
    global_step, checkpoint, saved_step = 0, None, -1
    if resume is not None:
        checkpoint = resolve_checkpoint(resume)
        accelerator.load_state(str(checkpoint))
        global_step = saved_step = read_trainer_state(checkpoint)["global_step"]
        accelerator.print(f"resumed from {checkpoint} at step {global_step}")

    history: list[dict] = []
    log_file = output_dir / "log.jsonl"

    def save(epoch: int) -> None:
        nonlocal checkpoint, saved_step
        if saved_step != global_step:
            checkpoint, saved_step = _save_checkpoint(accelerator, config, global_step, epoch), global_step

    progress = tqdm(
        total=total_steps,
        initial=min(global_step, total_steps),
        desc=f"{config.loss} {config.dataset}",
        disable=not accelerator.is_local_main_process,
    )
    model.train()
    first_epoch, skip_batches = divmod(global_step, steps_per_epoch)
    for epoch in range(first_epoch, math.ceil(total_steps / steps_per_epoch)):
        if global_step >= total_steps:  # resumed from a run that had already reached max_steps
            break
        loader.set_epoch(epoch)  # the shuffle order depends on (seed, epoch) only: resumable
        batches = accelerator.skip_first_batches(loader, skip_batches) if skip_batches else loader
        skip_batches = 0
        for (view_1, view_2), _ in batches:
            with accelerator.autocast():
                projections = model(torch.cat([view_1, view_2]))  # one pass: both views share BN statistics
            z1, z2 = projections.float().chunk(2)
            z1, z2 = gather_with_grad(z1), gather_with_grad(z2)  # negatives from every process
            log_now = global_step % config.log_every == 0 or global_step + 1 == total_steps
            loss, diagnostics = objective(z1, z2, diagnostics=log_now)

            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            global_step += 1
            progress.update(1)

            if log_now:
                record = {"step": global_step, "epoch": epoch, "loss": float(loss.detach()), **diagnostics}
                history.append(record)
                postfix = {"loss": f"{record['loss']:.4f}"}
                if "lambda_mean" in diagnostics:
                    postfix["lambda"] = f"{diagnostics['lambda_mean']:.3f}"
                progress.set_postfix(postfix)
                if accelerator.is_main_process:
                    with log_file.open("a") as handle:
                        handle.write(json.dumps(record) + "\n")
            if config.save_every and global_step % config.save_every == 0:
                save(epoch)
            if global_step >= total_steps:
                break
        if config.save_every is None or global_step >= total_steps:
            save(epoch)
        if global_step >= total_steps:
            break
    progress.close()
    save(max(0, global_step - 1) // steps_per_epoch)
    accelerator.end_training()
    return {
        "output_dir": str(output_dir),
        "checkpoint": str(checkpoint),
        "global_step": global_step,
        "history": history,
    }


def load_pretrained(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """The SimCLR model of a checkpoint (eval mode) and its :class:`VisionTrainConfig`."""
    from safetensors.torch import load_file

    checkpoint = resolve_checkpoint(checkpoint)
    config = VisionTrainConfig.from_dict(read_trainer_state(checkpoint)["config"])
    model = build_model(config)
    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        state = load_file(str(weights), device="cpu")
    elif (checkpoint / "pytorch_model.bin").is_file():
        state = torch.load(checkpoint / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"no model weights (model.safetensors) in {checkpoint}")
    model.load_state_dict(state)
    return model.to(device).eval(), config
