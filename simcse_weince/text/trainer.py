"""SimCSE with WEINCE (or InfoNCE) on 🤗 Accelerate: :func:`train`, and what its steps do.

Unsupervised (one sentence a line): every sentence is encoded twice in one forward pass over the doubled batch;
the two dropout masks make the positive pair, the other sentences of the (global) batch are the negatives (WEINCE's
``simcse`` geometry, :class:`~simcse_weince.losses.from_embeddings.ContrastiveObjective`). Supervised (pairs or
triplets, :mod:`simcse_weince.text.columns`): the columns are encoded in one forward pass; the second column is
the positive, a third is a hard negative of its row and an extra negative of every other row. STS-B dev is
scored every ``eval_steps`` and the best step is exported as a SentenceTransformer. The loop itself (run folder,
checkpoints, resume, logging, Ctrl-C, timings) is :func:`simcse_weince.training.loop.run_training`, shared with
the vision trainer; :class:`TextRecipe` is what this trainer gives it.

Example::

    from simcse_weince.text import preset, train

    config = preset("cpu-demo", output_dir="runs/demo", loss="infonce")
    results = train(config)  # a SentenceTransformer folder + results.json + README.md in runs/demo
    print(results["stsb_test_spearman"])

or from the shell: ``simcse-weince train --preset cpu-demo`` (``accelerate launch`` / ``torchrun`` for several
devices). Reference: Gao, Yao, Chen, "SimCSE", EMNLP 2021; Erol et al., "When Softmax Fails at the Top:
Extreme-Value Corrections for InfoNCE", ICML 2026 (arXiv 2606.00262).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from simcse_weince.encoder_checks import check_max_length
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.paths import resolve_data_dir
from simcse_weince.provenance import file_fingerprint
from simcse_weince.text.config import TrainConfig, resolve_eval_bf16, resolve_length_chunks
from simcse_weince.text.data import TokenizingCollator, load_training_data, resolve_train_file
from simcse_weince.text.fast_path import build_training_forward
from simcse_weince.text.gradcache import gradcache_forward_backward
from simcse_weince.text.model import VIEWS_CHECK_ROWS, SimCSEModel, check_views_differ, encode_columns
from simcse_weince.text.results import (
    DevSelection,
    TrainingRows,
    check_evaluation_data,
    export_results,
    not_applied_settings,
)
from simcse_weince.training.batches import StepBatchSampler
from simcse_weince.training.checkpoints import CHECKPOINTS
from simcse_weince.training.flops import encoder_dimensions, encoder_training_flops
from simcse_weince.training.loop import LoopOptions, TrainingRecipe, TrainingRun, run_training

logger = logging.getLogger(__name__)


def train(config: TrainConfig, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Train, evaluate and export; returns the results dict (also written to ``<output_dir>/results.json``).

    Args:
        config: a :class:`TrainConfig` (see :func:`~simcse_weince.text.config.preset`).
        resume: True / ``"latest"`` continues from the newest intact checkpoint in ``output_dir`` (a damaged
            newer one is named in a warning); a path resumes from that checkpoint, which must be intact. Data
            order, dropout masks and the schedule continue exactly.
        overwrite: replace an earlier run in ``output_dir``. Every input (config, data, model, tokenizer) is
            loaded first; the earlier run is then kept aside until the new run saves its first checkpoint or
            finishes, and put back if the new run fails before that.

    On processes other than the main one the returned dict is empty.
    """
    return run_training(config, TextRecipe(config), resume=resume, overwrite=overwrite)


class TextRecipe(TrainingRecipe):
    """Unsupervised (one column) or supervised (pairs, triplets) SimCSE as a :class:`TrainingRecipe` of
    :func:`~simcse_weince.training.loop.run_training`: STS-B dev selects the best step, which is exported as a
    SentenceTransformer. The last step is checkpointed before the export and dropped once it is written."""

    def __init__(self, config: TrainConfig):
        self.config = config

    def accelerator_options(self) -> dict:
        from accelerate.utils import DataLoaderConfiguration

        # split_batches: our batch_size is global, so the scheduler steps once per optimizer update
        return {
            "gradient_accumulation_steps": self.config.gradient_accumulation_steps,
            "dataloader_config": DataLoaderConfiguration(split_batches=True),
        }

    def check(self, run: TrainingRun) -> None:
        self.not_applied = not_applied_settings(self.config, run.tensorboard_dropped)
        device_type = run.accelerator.device.type
        # auto: by precision and CPU
        self.length_chunks = resolve_length_chunks(self.config.speed.length_chunks, run.mixed_precision, device_type)
        self.eval_bf16 = resolve_eval_bf16(self.config.eval_bf16, run.mixed_precision, device_type)

    def build(self, run: TrainingRun):
        config, accelerator = self.config, run.accelerator
        self.train_file, self.data_dir = resolve_train_file(config), resolve_data_dir(config.data_dir)
        self.data_fingerprint = file_fingerprint(self.train_file)  # checked on --resume (training/loop.py)
        if config.eval_steps or config.eval_before_training or config.final_evaluation:
            check_evaluation_data(self.data_dir)
        model, self.rows, self.columns, self.skipped = _load_model_and_data(config, self.train_file, accelerator)
        if config.hardness_mode == "hard_negatives" and len(self.columns) < 3:
            raise ValueError(
                f"hardness_mode hard_negatives weighs the hard-negative column, and {self.train_file} holds "
                f"{_describe_rows(self.columns)}, without one; use in_batch_negatives or all_negatives, or triplets"
            )
        model.to(accelerator.device)
        if len(self.columns) == 1:  # the encoder's own forward: a compiled training forward would compile twice
            _check_dropout_views(model, self.rows, self.columns, config)
        # the fast path checks itself on the device it will run on, before any step (no random draws)
        model.training_forward = build_training_forward(
            model.encoder, config.speed, length_chunks=self.length_chunks, mixed_precision=run.mixed_precision,
            max_length=config.max_length, device_type=accelerator.device.type,
        )  # fmt: skip
        total_steps = _total_steps(config, len(self.rows), self.columns)
        optimizer, scheduler = _optimizer_and_schedule(model, config, total_steps)
        self.model, self.optimizer, self.scheduler = accelerator.prepare(model, optimizer, scheduler)
        self.accelerator, self.unwrapped = accelerator, accelerator.unwrap_model(self.model)
        self.counts_flops = encoder_dimensions(model.encoder.config) is not None  # MFU: BERT-like encoders
        self.objective = ContrastiveObjective(
            config.loss, config.temperature, weince=config.weince, geometry="simcse",
            hardness_strength=config.hardness_strength, **config.contrastive_options(),
        )  # fmt: skip
        return self.model, total_steps

    def initial_state(self) -> dict:
        return {"best_step": None, "best_stsb_dev_spearman": None, "base_stsb_dev_spearman": None, "evaluations": [],
                "data_fingerprint": self.data_fingerprint}  # fmt: skip

    def options(self) -> LoopOptions:
        config = self.config
        return LoopOptions(
            project="simcse-weince", progress_desc="training", unit="sent",
            items_per_step=config.batch_size * config.gradient_accumulation_steps, logging_steps=config.logging_steps,
            save_steps=config.save_steps, save_total_limit=config.save_total_limit, keep_last_checkpoint=False,
            eval_steps=config.eval_steps, model_flops=self.counts_flops,
        )  # fmt: skip

    def batch_flops(self, attention_mask: torch.Tensor) -> int:
        """Model FLOPs of one micro-batch's forward and backward on its real tokens (training/flops.py): every row
        once per view (two dropout views of one column; stacked columns once); 0 for a non-BERT-like encoder."""
        if not self.counts_flops:
            return 0
        lengths = attention_mask.sum(dim=1).tolist() * (2 if len(self.columns) == 1 else 1)
        return encoder_training_flops(self.unwrapped.encoder.config, lengths, head=self.unwrapped.mlp is not None)

    def loader(self, run: TrainingRun):
        config, accum = self.config, self.config.gradient_accumulation_steps
        sampler = StepBatchSampler(
            len(self.rows), config.batch_size, config.seed, run.start_step * accum, run.total_steps * accum,
            run.accelerator.process_index, run.accelerator.num_processes,
        )  # fmt: skip
        # the rows are tokenised batch by batch as they are drawn (in num_workers processes ahead of the step, or
        # in this one). A private generator: creating the loader must not draw from the global RNG (the dropout
        # masks after a resume would differ from an uninterrupted run)
        collate = TokenizingCollator(self.unwrapped.tokenizer, config.max_length, self.columns)
        return torch.utils.data.DataLoader(
            self.rows, batch_sampler=sampler, collate_fn=collate, num_workers=config.num_workers,
            generator=torch.Generator(),
        )  # fmt: skip

    def before_training(self, run: TrainingRun) -> None:
        best_dir = run.output_dir / CHECKPOINTS / "best"
        self.dev = DevSelection(
            run.accelerator, self.unwrapped, self.config, self.data_dir, run.state, best_dir, self.eval_bf16
        )
        if self.config.eval_before_training and run.start_step == 0:
            with run.timer.part("evaluation"):
                run.state["base_stsb_dev_spearman"] = self.dev.score()
            logger.info("STS-B dev Spearman before training: %s", _fmt(run.state["base_stsb_dev_spearman"]))

    def describe(self, run: TrainingRun) -> str:
        config = self.config
        return (
            f"training {config.model} with {config.loss} on {len(self.rows):,} {_describe_rows(self.columns)} "
            f"from {self.train_file}: {run.total_steps} steps of {config.batch_size} x "
            f"{config.gradient_accumulation_steps}, {self.unwrapped.training_forward.describe()}"
            + (f", encoded {config.mini_batch_size} at a time (GradCache)," if config.mini_batch_size else "")
        )

    def train_step(self, step: int, batches, log_now: bool) -> dict:
        config, accelerator, model, optimizer = self.config, self.accelerator, self.model, self.optimizer
        losses, statistics, flops = [], [], 0
        for _ in range(config.gradient_accumulation_steps):
            batch = next(batches)
            flops += self.batch_flops(batch["attention_mask"])  # counted on the host copy: no device sync
            batch = {name: value.to(accelerator.device) for name, value in batch.items()}
            with accelerator.accumulate(model):
                loss, batch_statistics = forward_backward(
                    model, batch, self.objective, accelerator, config.mini_batch_size, num_columns=len(self.columns),
                )  # fmt: skip
                if accelerator.sync_gradients and config.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                self.scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            statistics.append(batch_statistics)
        entry = _step_entry(step, losses, statistics, self.scheduler.get_last_lr()[0])  # one device sync
        return {**entry, "model_flops": flops} if self.counts_flops else entry

    def evaluate(self, step: int, write) -> None:
        self.dev.evaluate(step, write)

    def export(self, run: TrainingRun) -> dict:
        data = TrainingRows(self.train_file, self.columns, len(self.rows), self.skipped)
        return export_results(run, self.unwrapped, self.dev, data, self.not_applied)


def forward_backward(
    model, batch: dict, objective: ContrastiveObjective, accelerator, mini_batch_size=None, num_columns: int = 1
):
    """The loss of one contrastive batch and its gradients, accumulated into the model's ``.grad``: one forward over
    the batch (:func:`~simcse_weince.text.model.encode_columns`: two dropout views of one column, or the stacked
    columns of pairs and triplets) and one backward; with ``mini_batch_size``, GradCache
    (:func:`~simcse_weince.text.gradcache.gradcache_forward_backward`: the same loss and gradients, only
    ``mini_batch_size`` rows' activations alive at a time). The model's training forward (length chunks, unpadded
    layers: :mod:`simcse_weince.text.fast_path`) applies to every forward. ``(loss, statistics)``."""
    if mini_batch_size:
        return gradcache_forward_backward(model, batch, objective, accelerator, mini_batch_size, num_columns)
    views = encode_columns(model, batch, num_columns)
    loss, statistics = objective(*views)
    accelerator.backward(loss)
    return loss, statistics


def _load_model_and_data(config: TrainConfig, train_file: Path, accelerator=None):
    """The model (SimCSE poolers), the training rows (text, tokenised batch by batch by the loader's
    :class:`~simcse_weince.text.data.TokenizingCollator`) and their columns (in role order); every input is checked
    here. The data are read and prepared once per machine: the local main process first, into the 🤗 datasets
    cache, which the machine's other processes then reuse."""
    with accelerator.local_main_process_first() if accelerator is not None else contextlib.nullcontext():
        rows, columns, skipped = load_training_data(train_file, config.max_train_samples)
    if skipped:
        logger.info("skipped %d empty lines (no visible character) in %s", skipped, train_file)
    model = SimCSEModel.from_pretrained(
        config.model, pooler=config.pooler, max_seq_length=config.eval_max_length, dropout=config.dropout,
        mlp_only_train=config.resolved_mlp_only_train(len(columns)),
    )  # fmt: skip
    positions = getattr(model.encoder.config, "max_position_embeddings", None)
    for name in ("max_length", "eval_max_length"):
        if positions and getattr(config, name) and getattr(config, name) > positions:
            raise ValueError(
                f"{name} {getattr(config, name)} exceeds the {positions} positions of {config.model}; "
                f"set --{name.replace('_', '-')} {positions} or less"
            )
    for name in ("max_length", "eval_max_length"):
        check_max_length(model.tokenizer, getattr(config, name), f"--{name.replace('_', '-')}", config.model)
    return model, rows, columns, skipped


def _check_dropout_views(model: SimCSEModel, rows, columns: tuple[str, ...], config: TrainConfig) -> None:
    """Unsupervised SimCSE: the two dropout views of a few training sentences must differ (one forward without
    gradients). ``--dropout 0`` asks for identical views: it is warned about, not refused
    (the equivalence checks of the distributed and GradCache paths run that way)."""
    if config.dropout == 0.0:
        logger.warning(
            "--dropout 0: the two views of every sentence are the same, so unsupervised SimCSE's positives are the "
            "sentences themselves and the loss teaches little; SimCSE uses 0.1"
        )
        return
    sample = [rows[index] for index in range(min(VIEWS_CHECK_ROWS, len(rows)))]
    check_views_differ(model, TokenizingCollator(model.tokenizer, config.max_length, columns)(sample), config.model)


def _total_steps(config: TrainConfig, num_rows: int, columns: tuple[str, ...]) -> int:
    what = _describe_rows(columns)  # a row is a sentence, or a pair or triplet of a table: say which
    batches_per_epoch = num_rows // config.batch_size
    if batches_per_epoch == 0:
        raise ValueError(f"the training data hold {num_rows} {what}, fewer than one batch of {config.batch_size}")
    total_steps = config.max_steps or config.num_epochs * (batches_per_epoch // config.gradient_accumulation_steps)
    if total_steps < 1:
        raise ValueError(
            f"{num_rows} {what} make {batches_per_epoch} batches of {config.batch_size}: not one update "
            f"with gradient_accumulation_steps={config.gradient_accumulation_steps}"
        )
    return total_steps


def _optimizer_and_schedule(model, config: TrainConfig, total_steps: int):
    """AdamW without weight decay on biases and LayerNorms (the HF Trainer's rule) and the LR schedule."""
    from transformers import get_scheduler

    def no_decay(name: str) -> bool:
        return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name

    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not no_decay(n)], "weight_decay": config.weight_decay},
        {"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
    ]
    try:  # the fused kernel (one pass over all tensors) is what the HF Trainer uses by default
        optimizer = torch.optim.AdamW(groups, lr=config.learning_rate, fused=True)
    except (RuntimeError, ValueError):
        optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    return optimizer, get_scheduler(config.lr_scheduler, optimizer, config.warmup_steps, total_steps)


def _step_entry(step: int, losses: list, statistics: list[dict], learning_rate: float) -> dict:
    """The logged values of one optimizer step, averaged over its micro-batches, in one device synchronisation."""
    names = list(statistics[0])
    values = torch.stack(
        [torch.stack(losses).float().mean()]
        + [torch.stack([batch[name] for batch in statistics]).float().mean() for name in names]
    ).tolist()
    return {"step": step, "loss": values[0], "learning_rate": learning_rate, **dict(zip(names, values[1:]))}


def _describe_rows(columns: tuple[str, ...]) -> str:
    return {1: "sentences", 2: f"pairs ({','.join(columns)})"}.get(len(columns), f"triplets ({','.join(columns)})")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"
