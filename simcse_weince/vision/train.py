"""SimCLR pretraining with WEINCE or InfoNCE (NT-Xent) on 🤗 Accelerate: the loop, top to bottom.

Two augmented views per image, one forward pass over both views (they share BatchNorm statistics), the loss
on the projections (:class:`~simcse_weince.training.objective.ContrastiveObjective`, ``simclr`` geometry:
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
import time
from pathlib import Path

import torch

from simcse_weince.precision import precision_label
from simcse_weince.training.accelerator import make_accelerator
from simcse_weince.training.batches import StepBatchSampler
from simcse_weince.training.objective import ContrastiveObjective
from simcse_weince.training.runs import (
    CHECKPOINTS,
    CONFIG_FILE,
    TRAINER_STATE,
    RunFolder,
    latest_checkpoint,
    load_checkpoint,
    new_trainer_state,
    read_trainer_state,
)
from simcse_weince.training.timing import RunTimer
from simcse_weince.training.tracking import (
    InterruptFlag,
    check_finite,
    make_trackers,
    progress_postfix,
    start_trackers,
    stop_requested,
)
from simcse_weince.vision.config import VisionTrainConfig

logger = logging.getLogger(__name__)

__all__ = ["VisionTrainConfig", "ContrastiveObjective", "train", "build_model", "load_pretrained"]


def train(config: VisionTrainConfig, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Pretrain a SimCLR model; returns ``{"output_dir", "checkpoint", "step", "history"}`` and the times:
    ``wall_time_seconds`` (the whole call, set-up to the last checkpoint written, plus earlier sessions of a
    resumed run), ``setup_seconds``, ``train_seconds``, ``checkpoint_seconds`` (:mod:`simcse_weince.training.timing`).

    ``resume``: True / ``"latest"`` (the newest intact checkpoint in ``output_dir``) or a checkpoint folder. Model,
    optimizer, RNG and extra-term states are restored and training continues at the saved step, with the batches
    and augmentations of the uninterrupted run (mid-epoch too). ``overwrite`` replaces an earlier run in ``output_dir``.
    ``history`` holds the steps trained by this call (loss and, on logging steps, WEINCE's diagnostics).
    """
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from simcse_weince.vision.augment import TwoViews, simclr_augmentation
    from simcse_weince.vision.datasets import dataset_spec, load_image_dataset
    from simcse_weince.vision.extra_terms import TopMExtraTerms

    timer = RunTimer()
    config.validate()
    output_dir = Path(config.output_dir).expanduser()
    log_with, csv_tracker, _ = make_trackers(config.report_to, output_dir / "logs")
    accelerator, mixed_precision = make_accelerator(
        cpu=config.cpu,
        mixed_precision=config.mixed_precision,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        log_with=log_with,
        project_dir=output_dir,
    )
    if config.batch_size % accelerator.num_processes:
        raise ValueError(f"batch_size {config.batch_size} must divide over {accelerator.num_processes} processes")
    run = RunFolder(output_dir, resume, overwrite, accelerator)
    with run.restore_on_failure():
        # --- set-up: data (two SimCLR views per image; incomplete last batches dropped), model, optimizer ---------
        set_seed(config.seed)
        spec = dataset_spec(config.dataset)
        image_size = config.image_size or spec.image_size
        views = TwoViews(simclr_augmentation(image_size, mean=spec.mean, std=spec.std,
                                             crop_scale=(config.crop_scale_min, 1.0)))  # fmt: skip
        dataset = load_image_dataset(
            config.dataset, "pretrain", transform=views, data_dir=config.data_dir, image_size=image_size,
            download=config.download, limit=config.train_size, seed=config.seed,
        )  # fmt: skip
        if len(dataset) < config.batch_size:
            raise ValueError(f"{config.dataset} has {len(dataset)} images, fewer than one batch of {config.batch_size}")
        model = build_model(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        extra_terms = TopMExtraTerms() if config.extra_terms else None
        objective = ContrastiveObjective(
            config.loss, config.temperature, weince=config.weince, geometry="simclr", extra_terms=extra_terms
        )
        model, optimizer = accelerator.prepare(model, optimizer)
        if extra_terms is not None:
            extra_terms.to(accelerator.device)
            accelerator.register_for_checkpointing(extra_terms)  # its EMA beta_t is part of the state
        steps_per_epoch = len(dataset) // config.batch_size  # the incomplete last batch is dropped
        total_steps = min(config.num_epochs * steps_per_epoch, config.max_steps or math.inf)
        state = new_trainer_state(epoch=0)
        if run.checkpoint is not None:
            state = load_checkpoint(accelerator, run.checkpoint)
            logger.info("resumed from %s at step %d of %d", run.checkpoint, state["step"], total_steps)
            timer.restore(state)
        run.claim(config)
        start_step = state["step"]
        start_trackers(accelerator, csv_tracker, start_step, config.to_dict(), "simcse-weince-vision")

        # --- the loop ---------------------------------------------------------------------------------------------
        def save() -> Path:
            timer.save_into(state)
            with timer.part("checkpoint"):
                return run.save_checkpoint(state, config.save_total_limit)

        # each process loads its share of every global batch: (seed, step) -> images, so a resume needs no skipping
        sampler = _EpochBatches(
            len(dataset), config.batch_size, config.seed, start_step, total_steps,
            accelerator.process_index, accelerator.num_processes,
        )  # fmt: skip
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=config.num_workers, generator=torch.Generator())
        logger.info(
            "training %s on %s with %s: %d steps of %d images on %d process(es), %s, %s",
            config.backbone, config.dataset, config.loss, total_steps, config.batch_size, accelerator.num_processes,
            accelerator.device, precision_label(mixed_precision),
        )  # fmt: skip
        history, checkpoint, saved_step = [], run.checkpoint, start_step
        progress = tqdm(
            total=total_steps, initial=start_step, desc=f"{config.loss} {config.dataset}",
            disable=not accelerator.is_local_main_process, dynamic_ncols=True,
        )  # fmt: skip
        model.train()
        session_seconds = 0.0
        timer.add("setup", timer.since_start())
        with InterruptFlag() as interrupt:
            for step, ((view_1, view_2), _) in enumerate(loader, start=start_step + 1):
                step_start = time.perf_counter()
                log_now = step % config.logging_steps == 0 or step == total_steps
                with accelerator.autocast():  # one pass over both views: they share BatchNorm statistics
                    projections = model(torch.cat([view_1, view_2]).to(accelerator.device))
                loss, diagnostics = objective(*projections.float().chunk(2), diagnostics=log_now)
                optimizer.zero_grad(set_to_none=True)
                accelerator.backward(loss)
                optimizer.step()

                epoch = (step - 1) // steps_per_epoch
                entry = {"step": step, "epoch": epoch, "loss": float(loss.detach())}
                entry.update({name: float(value) for name, value in diagnostics.items()})
                session_seconds += time.perf_counter() - step_start
                state["train_seconds"] += time.perf_counter() - step_start
                state.update(step=step, epoch=epoch)
                check_finite(entry["loss"], step, run.checkpoints)
                state["history"].append(entry)
                history.append(entry)
                progress.update(1)
                speed = (step - start_step) * config.batch_size / session_seconds
                progress.set_postfix(progress_postfix(entry, speed, mixed_precision, unit="img"), refresh=False)
                if log_now:
                    accelerator.log({k: v for k, v in entry.items() if k not in ("step", "epoch")}, step=step)
                stop = stop_requested(accelerator, interrupt)
                due = step % config.save_steps == 0 if config.save_steps else step % steps_per_epoch == 0
                if stop or due:
                    checkpoint, saved_step = save(), step
                if stop:
                    progress.close()
                    logger.warning(
                        "%s: checkpoint saved to %s; continue with --resume", interrupt.describe(), checkpoint
                    )
                    accelerator.end_training()
                    raise interrupt.interruption()  # the CLI exits 130 (Ctrl-C) or 143 (SIGTERM)
        progress.close()
        if saved_step != state["step"] or checkpoint is None:  # the last step is always saved: eval reads it
            checkpoint = save()
        run.finish()
    accelerator.end_training()
    # the vision trainer evaluates and exports nothing (`vision eval` does)
    times = timer.report(state["train_seconds"], parts=("setup", "train", "checkpoint"))
    return {
        "output_dir": str(output_dir), "checkpoint": str(checkpoint), "step": state["step"], "history": history,
        **times,
    }  # fmt: skip


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


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder (with ``trainer_state.json``), or a run folder (its newest checkpoint)."""
    path = Path(path).expanduser()
    if (path / TRAINER_STATE).is_file():
        return path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint at {path} (expected {TRAINER_STATE} or {CHECKPOINTS}/step-*/)")
    return found


def load_pretrained(checkpoint: str | Path, device: str | torch.device = "cpu"):
    """The SimCLR model of a checkpoint (eval mode) and its :class:`VisionTrainConfig` (from the run folder)."""
    from safetensors.torch import load_file

    from simcse_weince.config import load_config
    from simcse_weince.vision.config import DEPRECATED_NAMES

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
        state = torch.load(checkpoint / "pytorch_model.bin", map_location="cpu", weights_only=True)
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
