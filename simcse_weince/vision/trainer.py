"""SimCLR pretraining with WEINCE or InfoNCE (NT-Xent) on 🤗 Accelerate: the loop, top to bottom.

Two augmented views per image, one forward pass over both views (they share BatchNorm statistics), the loss
on the projections (:class:`~simcse_weince.losses.from_embeddings.ContrastiveObjective`, ``simclr`` geometry:
gathered across processes with gradient, in float32), Adam. The run folder, atomic checkpoints, exact resume,
``metrics.csv`` / TensorBoard, Ctrl-C and the stop on a non-finite loss come from :mod:`simcse_weince.training`,
shared with the text trainer. The last step is always checkpointed: ``simcse-weince vision eval`` reads it.

Example::

    config = VisionTrainConfig(dataset="cifar10", backbone="resnet18", loss="weince", output_dir="runs/c10")
    result = train(config)
    result["checkpoint"]   # runs/c10/checkpoints/step-0019500
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.safe_load import load_tensors
from simcse_weince.settings import CONFIG_FILE, load_config
from simcse_weince.training.batches import StepBatchSampler
from simcse_weince.training.checkpoints import CHECKPOINTS, TRAINER_STATE, list_checkpoints, read_trainer_state
from simcse_weince.training.loop import LoopOptions, TrainingRecipe, TrainingRun, run_training
from simcse_weince.vision.augment import TwoViews, simclr_augmentation
from simcse_weince.vision.backbones import SimCLRModel
from simcse_weince.vision.config import DEPRECATED_NAMES, VisionTrainConfig
from simcse_weince.vision.datasets import dataset_spec, load_image_dataset
from simcse_weince.vision.extra_terms import TopMExtraTerms

logger = logging.getLogger(__name__)

__all__ = ["VisionTrainConfig", "ContrastiveObjective", "train", "build_model", "load_pretrained"]


def train(config: VisionTrainConfig, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Pretrain a SimCLR model; returns ``{"output_dir", "checkpoint", "step", "history"}`` and the times:
    ``wall_time_seconds`` (the whole call, set-up to the last checkpoint written, plus earlier sessions of a
    resumed run), ``setup_seconds``, ``train_seconds``, ``checkpoint_seconds`` (:mod:`simcse_weince.training.timing`).

    ``resume``: True / ``"latest"`` (the newest intact checkpoint in ``output_dir``) or a checkpoint folder. Model,
    optimizer, RNG and extra-term states are restored and training continues at the saved step, with the batches
    and augmentations of the uninterrupted run (mid-epoch too). ``overwrite`` replaces an earlier run in ``output_dir``.
    ``history`` holds the steps trained by this call (loss and, on logging steps, WEINCE's λ statistics).
    """
    return run_training(config, VisionRecipe(config), resume=resume, overwrite=overwrite)


class VisionRecipe(TrainingRecipe):
    """SimCLR pretraining as a :class:`TrainingRecipe` of :func:`~simcse_weince.training.loop.run_training`: no
    evaluation during training (linear probe and kNN of the frozen features are ``vision eval``), and the last
    step's checkpoint is the result (``vision eval`` reads it)."""

    def __init__(self, config: VisionTrainConfig):
        self.config = config

    def accelerator_options(self) -> dict:
        from accelerate.utils import DataLoaderConfiguration

        return {"dataloader_config": DataLoaderConfiguration(use_seedable_sampler=True, data_seed=self.config.seed)}

    def check(self, run: TrainingRun) -> None:
        config, processes = self.config, run.accelerator.num_processes
        if config.batch_size % processes:
            raise ValueError(f"batch_size {config.batch_size} must divide over {processes} processes")

    def build(self, run: TrainingRun):

        config, accelerator = self.config, run.accelerator
        # data: two SimCLR views per image; incomplete last batches dropped
        spec = dataset_spec(config.dataset)
        image_size = config.image_size or spec.image_size
        views = TwoViews(simclr_augmentation(image_size, mean=spec.mean, std=spec.std,
                                             crop_scale=(config.crop_scale_min, 1.0)))  # fmt: skip
        self.dataset = load_image_dataset(
            config.dataset, "pretrain", transform=views, data_dir=config.data_dir, image_size=image_size,
            download=config.download, limit=config.train_size, seed=config.seed,
        )  # fmt: skip
        if len(self.dataset) < config.batch_size:
            raise ValueError(
                f"{config.dataset} has {len(self.dataset)} images, fewer than one batch of {config.batch_size}"
            )
        model = build_model(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        extra_terms = TopMExtraTerms() if config.extra_terms else None
        self.objective = ContrastiveObjective(
            config.loss, config.temperature, weince=config.weince, geometry="simclr", extra_terms=extra_terms
        )
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        if extra_terms is not None:
            extra_terms.to(accelerator.device)
            accelerator.register_for_checkpointing(extra_terms)  # its EMA beta_t is part of the state
        self.accelerator = accelerator
        self.steps_per_epoch = len(self.dataset) // config.batch_size  # the incomplete last batch is dropped
        return self.model, min(config.num_epochs * self.steps_per_epoch, config.max_steps or math.inf)

    def options(self) -> LoopOptions:
        config = self.config
        return LoopOptions(
            project="simcse-weince-vision", progress_desc=f"{config.loss} {config.dataset}", unit="img",
            items_per_step=config.batch_size, logging_steps=config.logging_steps,
            save_steps=config.save_steps or self.steps_per_epoch, save_total_limit=config.save_total_limit,
            keep_last_checkpoint=True,
        )  # fmt: skip

    def loader(self, run: TrainingRun):
        from torch.utils.data import DataLoader

        # each process loads its share of every global batch: (seed, step) -> images, so a resume needs no skipping
        sampler = _EpochBatches(
            len(self.dataset), self.config.batch_size, self.config.seed, run.start_step, run.total_steps,
            run.accelerator.process_index, run.accelerator.num_processes,
        )  # fmt: skip
        return DataLoader(
            self.dataset, batch_sampler=sampler, num_workers=self.config.num_workers, generator=torch.Generator()
        )

    def describe(self, run: TrainingRun) -> str:
        config = self.config
        return (
            f"training {config.backbone} on {config.dataset} with {config.loss}: {run.total_steps} steps of "
            f"{config.batch_size} images"
        )

    def train_step(self, step: int, batches, log_now: bool) -> dict:
        accelerator, optimizer = self.accelerator, self.optimizer
        (view_1, view_2), _ = next(batches)
        with accelerator.autocast():  # one pass over both views: they share BatchNorm statistics
            projections = self.model(torch.cat([view_1, view_2]).to(accelerator.device))
        loss, statistics = self.objective(*projections.chunk(2), statistics=log_now)  # cast to float32 there
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        optimizer.step()

        entry = {"step": step, "epoch": (step - 1) // self.steps_per_epoch, "loss": float(loss.detach())}
        entry.update({name: float(value) for name, value in statistics.items()})
        return entry

    def export(self, run: TrainingRun) -> dict:
        # the vision trainer evaluates and exports nothing (`vision eval` does)
        times = run.timer.report(run.state["train_seconds"], parts=("setup", "train", "checkpoint"))
        return {
            "output_dir": str(run.output_dir), "checkpoint": str(run.last_checkpoint), "step": run.state["step"],
            "history": run.history, **times,
        }  # fmt: skip


def build_model(config: VisionTrainConfig):

    image_size = config.image_size or dataset_spec(config.dataset).image_size
    return SimCLRModel.build(
        config.backbone,
        image_size,
        projection_dim=config.projection_dim,
        stem=config.stem,
        vit_layers=config.vit_layers,
    )


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (with ``trainer_state.json``), or a run folder (its newest checkpoint)."""
    path = Path(path).expanduser()
    if (path / TRAINER_STATE).is_file():
        return path
    found = next(iter(list_checkpoints(path)), None)
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path} (expected {TRAINER_STATE} or {CHECKPOINTS}/step-*/)")
    return found


def load_pretrained(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """The SimCLR model of a checkpoint (eval mode) and its :class:`VisionTrainConfig` (from the run folder)."""
    from safetensors.torch import load_file

    checkpoint = resolve_checkpoint(checkpoint)
    saved = checkpoint.parent.parent / CONFIG_FILE
    if saved.is_file():
        config = load_config(VisionTrainConfig, saved, DEPRECATED_NAMES)
    else:  # a checkpoint of an earlier release carries its config in the trainer state
        config = VisionTrainConfig.from_dict(read_trainer_state(checkpoint)["config"])
    model = build_model(config)
    weights = checkpoint / "model.safetensors"
    if weights.is_file():
        state = load_file(str(weights), device="cpu")
    elif (checkpoint / "pytorch_model.bin").is_file():
        state = load_tensors(checkpoint / "pytorch_model.bin")
    else:
        raise FileNotFoundError(f"no model weights (model.safetensors) in {checkpoint}")
    model.load_state_dict(state)
    return model.to(device).eval(), config


class _EpochBatches(StepBatchSampler):
    """:class:`StepBatchSampler` that also draws one number from the global RNG as an epoch starts, right before
    its first batch is loaded. torch's DataLoader draws its workers' base seed so when an epoch's iterator starts;
    earlier releases iterated one DataLoader per epoch, and the augmentations (drawn from the global RNG after
    it) of the same seed stay those of earlier releases. The draw is part of the step sequence, so a resumed run
    makes it exactly where the uninterrupted run did."""

    def __iter__(self):
        for index, batch in enumerate(super().__iter__(), start=self.start_batch):
            if index % self.batches_per_epoch == 0:
                torch.empty((), dtype=torch.int64).random_()
            yield batch
