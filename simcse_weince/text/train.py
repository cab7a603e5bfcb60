"""SimCSE with WEINCE (or InfoNCE) on 🤗 Accelerate: the training loop, top to bottom.

Unsupervised (one sentence a line): every sentence is encoded twice in one forward pass over the doubled batch;
the two dropout masks make the positive pair, the other sentences of the (global) batch are the negatives (WEINCE's
``simcse`` geometry, :class:`~simcse_weince.training.objective.ContrastiveObjective`). Supervised (pairs or
triplets, :mod:`simcse_weince.text.columns`): the columns are encoded in one forward pass; the second column is
the positive, a third is a hard negative of its row and an extra negative of every other row. STS-B dev is
scored every ``eval_steps`` and the best step is exported as a SentenceTransformer. Run folder, checkpoints,
resume, logging and Ctrl-C come from :mod:`simcse_weince.training`, shared with the vision trainer.

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

import logging
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from simcse_weince.paths import resolve_data_dir
from simcse_weince.precision import precision_label
from simcse_weince.text.config import TrainConfig, resolve_length_chunks
from simcse_weince.text.data import PaddingCollator, load_training_data, resolve_train_file, tokenize
from simcse_weince.text.results import DevSelection, check_evaluation_data, export_results, not_applied_settings
from simcse_weince.training.accelerator import make_accelerator
from simcse_weince.training.batches import StepBatchSampler
from simcse_weince.training.objective import ContrastiveObjective
from simcse_weince.training.runs import RunFolder, load_checkpoint, new_trainer_state
from simcse_weince.training.timing import RunTimer
from simcse_weince.training.tracking import (
    InterruptFlag,
    check_finite,
    make_trackers,
    progress_postfix,
    start_trackers,
    stop_requested,
)

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
    from accelerate.utils import DataLoaderConfiguration, set_seed
    from tqdm.auto import tqdm

    timer = RunTimer()  # wall_time_seconds: the whole run, set-up to the written card (training/timing.py)
    config.validate()
    output_dir = Path(config.output_dir).expanduser()
    log_with, csv_tracker, tensorboard_dropped = make_trackers(config.report_to, output_dir / "logs")
    # split_batches: our batch_size is global, so the scheduler steps once per optimizer update
    accelerator, mixed_precision = make_accelerator(
        cpu=config.cpu,
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        log_with=log_with,
        project_dir=output_dir,
    )
    not_applied = not_applied_settings(config, tensorboard_dropped)
    length_chunks = resolve_length_chunks(config.length_chunks, mixed_precision)  # auto: by the precision used
    run = RunFolder(output_dir, resume, overwrite, accelerator)
    with run.restore_on_failure():
        # --- set-up: data, model, optimizer, checkpoint; the folder is claimed only once all have loaded -----
        set_seed(config.seed)  # before the model: the MLP head's initialisation depends on it
        train_file, data_dir = resolve_train_file(config), resolve_data_dir(config.data_dir)
        if config.eval_steps or config.eval_before_training or config.final_evaluation:
            check_evaluation_data(data_dir)
        model, tokenized, columns, skipped = _load_model_and_data(config, train_file)
        accum = config.gradient_accumulation_steps
        total_steps = _total_steps(config, len(tokenized))
        optimizer, scheduler = _optimizer_and_schedule(model, config, total_steps)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        unwrapped = accelerator.unwrap_model(model)
        objective = ContrastiveObjective(
            config.loss, config.temperature, weince=config.weince, geometry="simcse",
            hardness_strength=config.hardness_strength,
        )  # fmt: skip
        state = new_trainer_state(
            best_step=None, best_stsb_dev_spearman=None, base_stsb_dev_spearman=None, evaluations=[]
        )
        if run.checkpoint is not None:
            state = load_checkpoint(accelerator, run.checkpoint)
            logger.info("resumed from %s at step %d of %d", run.checkpoint, state["step"], total_steps)
            timer.restore(state)
        run.claim(config)
        start_step = state["step"]
        sampler = StepBatchSampler(
            len(tokenized), config.batch_size, config.seed, start_step * accum, total_steps * accum,
            accelerator.process_index, accelerator.num_processes,
        )  # fmt: skip
        # a private generator: creating the loader must not draw from the global RNG (the dropout masks after a
        # resume would differ from an uninterrupted run)
        loader = torch.utils.data.DataLoader(
            tokenized, batch_sampler=sampler, collate_fn=PaddingCollator(unwrapped.tokenizer.pad_token_id),
            num_workers=config.num_workers, generator=torch.Generator(),
        )  # fmt: skip
        start_trackers(accelerator, csv_tracker, start_step, config.to_dict(), "simcse-weince")
        dev = DevSelection(accelerator, unwrapped, config, data_dir, state, run.checkpoints / "best")
        timer.add("setup", timer.since_start())
        if config.eval_before_training and start_step == 0:
            with timer.part("evaluation"):
                state["base_stsb_dev_spearman"] = dev.score()
            logger.info("STS-B dev Spearman before training: %s", _fmt(state["base_stsb_dev_spearman"]))

        # --- the loop -------------------------------------------------------------------------------------------
        logger.info(
            "training %s with %s on %s %s from %s: %d steps of %d x %d on %d process(es), %s, %s%s, "
            "%d length chunk(s)%s",
            config.model, config.loss, f"{len(tokenized):,}", _describe_rows(columns), train_file, total_steps,
            config.batch_size, accum,
            accelerator.num_processes, accelerator.device, precision_label(mixed_precision),
            " (mixed precision auto)" if config.mixed_precision == "auto" else "", length_chunks,
            f", encoded {config.mini_batch_size} at a time (GradCache)" if config.mini_batch_size else "",
        )  # fmt: skip
        is_main = accelerator.is_main_process
        progress = tqdm(total=total_steps, initial=start_step, disable=not is_main, desc="training", dynamic_ncols=True)
        micro_batches = iter(loader)
        model.train()
        session_seconds = 0.0
        with InterruptFlag() as interrupt:
            for step in range(start_step + 1, total_steps + 1):  # step = optimizer updates done after this one
                step_start = time.perf_counter()
                losses, diagnostics = [], []
                for _ in range(accum):
                    batch = {name: value.to(accelerator.device) for name, value in next(micro_batches).items()}
                    with accelerator.accumulate(model):
                        loss, logs = forward_backward(
                            model, batch, objective, accelerator, config.mini_batch_size, length_chunks,
                            num_columns=len(columns),
                        )  # fmt: skip
                        if accelerator.sync_gradients and config.max_grad_norm:
                            accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad(set_to_none=True)
                    losses.append(loss.detach())
                    diagnostics.append(logs)
                entry = _step_entry(step, losses, diagnostics, scheduler.get_last_lr()[0])  # one device sync
                session_seconds += time.perf_counter() - step_start
                state["train_seconds"] += time.perf_counter() - step_start
                state["step"] = step
                entry["train_seconds"] = state["train_seconds"]
                check_finite(entry["loss"], step, run.checkpoints)
                state["history"].append(entry)
                speed = (step - start_step) * config.batch_size * accum / session_seconds
                progress.update(1)
                progress.set_postfix(progress_postfix(entry, speed, mixed_precision), refresh=False)
                if step % config.logging_steps == 0:
                    accelerator.log({k: v for k, v in entry.items() if k not in ("step", "train_seconds")}, step=step)
                if config.eval_steps and (step % config.eval_steps == 0 or step == total_steps):
                    with timer.part("evaluation"):
                        dev.evaluate(step, progress.write)

                stop = stop_requested(accelerator, interrupt)
                if stop or (config.save_steps and step % config.save_steps == 0 and step < total_steps):
                    timer.save_into(state)
                    with timer.part("checkpoint"):
                        path = run.save_checkpoint(state, config.save_total_limit)
                    if stop:
                        progress.close()
                        logger.warning("%s: checkpoint saved to %s; continue with --resume", interrupt.describe(), path)
                        accelerator.end_training()
                        raise interrupt.interruption()  # the CLI exits 130 (Ctrl-C) or 143 (SIGTERM)
        progress.close()

        # --- export the best step as a SentenceTransformer, evaluate it, write results and the model card --------
        # the last step reaches a checkpoint first (a full disk during the export must not lose it; --resume then
        # only exports); it goes once the export is written, so a finished run keeps its periodic checkpoints only
        timer.save_into(state)
        with timer.part("checkpoint"):
            last = run.checkpoint if start_step == total_steps else run.save_checkpoint(state, limit=0)
        results = export_results(
            accelerator, unwrapped, config, state, dev,
            mixed_precision=mixed_precision, length_chunks=length_chunks, not_applied=not_applied,
            total_steps=total_steps, start_step=start_step, num_rows=len(tokenized), columns=columns,
            skipped=skipped, train_file=train_file, timer=timer, last_checkpoint=last,
        )  # fmt: skip
        run.finish(drop=last)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results


def encode_columns(model, batch: dict, num_columns: int = 1, length_chunks: int = 1) -> tuple:
    """The embeddings of a collated batch, one tensor per column, from one forward pass.

    One column is unsupervised SimCSE: every sentence twice, the two dropout masks make the positive pair. Pairs
    and triplets are stacked column by column (:class:`~simcse_weince.text.data.PaddingCollator`) and encoded
    together, as SimCSE encodes ``sent0``, ``sent1`` and ``hard_neg`` (dropout stays on for all of them)."""
    if num_columns == 1:
        return model(**batch, num_views=2, length_chunks=length_chunks)  # two dropout masks
    return model(**batch, length_chunks=length_chunks).chunk(num_columns)


def forward_backward(
    model, batch: dict, objective: ContrastiveObjective, accelerator, mini_batch_size=None, length_chunks: int = 1,
    num_columns: int = 1,
):  # fmt: skip
    """The loss of one contrastive batch and its gradients, accumulated into the model's ``.grad``.

    Without ``mini_batch_size``: one forward over the batch (:func:`encode_columns`: two dropout views of one
    column, or the stacked columns of pairs and triplets) and one backward. ``length_chunks`` > 1 encodes the rows
    of every forward in that many length-sorted chunks, each padded only to its own longest sentence
    (:meth:`SimCSEModel.forward`); the loss sees the same embeddings.

    With it, GradCache (Gao et al., 2021; the machinery of sentence-transformers' cached losses), so that only
    ``mini_batch_size`` rows' activations are alive at a time while the loss still sees the whole batch:

    1. every chunk of ``mini_batch_size`` rows is encoded (all its columns or views, one forward) without a
       graph, and the RNG state before each forward is kept (sentence-transformers' ``RandContext``);
    2. the loss of the whole batch is computed from those embeddings (gathered across processes as usual) and
       back-propagated up to them through ``accelerator.backward``, which applies the fp16 loss scale and the
       gradient-accumulation divisor to the cached embedding gradients;
    3. every chunk is encoded again with its RNG state replayed (the same dropout masks) and the cached
       gradients are back-propagated through it. DDP reduces once, after the last chunk.

    The global RNG ends where the first pass left it (the replays run in a forked RNG), so resuming from a
    checkpoint continues exactly.
    """
    if not mini_batch_size:
        views = encode_columns(model, batch, num_columns, length_chunks)
        loss, diagnostics = objective(*views)
        accelerator.backward(loss)
        return loss, diagnostics

    from sentence_transformers.base.losses.gradcache import RandContext

    from simcse_weince.text.model import trim_trailing_padding

    rows = batch["input_ids"].shape[0] // num_columns

    def row_slice(value: torch.Tensor, begin: int) -> torch.Tensor:  # rows begin.. of every column, column-major
        columns = value.view(num_columns, rows, *value.shape[1:])
        return columns[:, begin : begin + mini_batch_size].reshape(-1, *value.shape[1:])

    # each chunk drops the padding columns it does not need (the batch is padded to its longest sentence)
    chunks = [
        trim_trailing_padding({name: row_slice(value, begin) for name, value in batch.items()})
        for begin in range(0, rows, mini_batch_size)
    ]
    random_states, chunk_views = [], []
    with torch.no_grad():
        for chunk in chunks:
            random_states.append(RandContext(*chunk.values()))
            chunk_views.append(encode_columns(model, chunk, num_columns, length_chunks))
    views = [torch.cat(column).requires_grad_() for column in zip(*chunk_views)]
    loss, diagnostics = objective(*views)
    accelerator.backward(loss)

    sizes = [len(chunk_view[0]) for chunk_view in chunk_views]
    cached_gradients = list(zip(*(view.grad.split(sizes) for view in views)))  # per chunk, one per column
    for index, (chunk, random_state, gradients) in enumerate(zip(chunks, random_states, cached_gradients)):
        synchronize = nullcontext() if index == len(chunks) - 1 else accelerator.no_sync(model)
        with synchronize, random_state:
            embeddings = encode_columns(model, chunk, num_columns, length_chunks)
            # the surrogate's gradient w.r.t. the embeddings is the cached gradient; float32 keeps fp16/bf16
            # embeddings from rounding the products
            surrogate = sum(
                torch.dot(embedding.flatten().float(), gradient.flatten().float())
                for embedding, gradient in zip(embeddings, gradients)
            )
            surrogate.backward()
    return loss.detach(), diagnostics


def _load_model_and_data(config: TrainConfig, train_file: Path):
    """The model (SimCSE poolers), the tokenised training rows and their columns (in role order); every input is
    checked here."""
    from simcse_weince.text.model import SimCSEModel

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
    return model, tokenize(rows, model.tokenizer, config.max_length, columns), columns, skipped


def _total_steps(config: TrainConfig, num_sentences: int) -> int:
    batches_per_epoch = num_sentences // config.batch_size
    if batches_per_epoch == 0:
        raise ValueError(
            f"the training data hold {num_sentences} sentences, fewer than one batch of {config.batch_size}"
        )
    total_steps = config.max_steps or config.num_epochs * (batches_per_epoch // config.gradient_accumulation_steps)
    if total_steps < 1:
        raise ValueError(
            f"{num_sentences} sentences make {batches_per_epoch} batches of {config.batch_size}: not one update "
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


def _step_entry(step: int, losses: list, diagnostics: list[dict], learning_rate: float) -> dict:
    """The logged values of one optimizer step, averaged over its micro-batches, in one device synchronisation."""
    names = list(diagnostics[0])
    values = torch.stack(
        [torch.stack(losses).float().mean()]
        + [torch.stack([d[name] for d in diagnostics]).float().mean() for name in names]
    ).tolist()
    return {"step": step, "loss": values[0], "learning_rate": learning_rate, **dict(zip(names, values[1:]))}


def _describe_rows(columns: tuple[str, ...]) -> str:
    return {1: "sentences", 2: f"pairs ({','.join(columns)})"}.get(len(columns), f"triplets ({','.join(columns)})")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"
