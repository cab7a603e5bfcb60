"""What the text trainer reports: STS-B dev model selection during training, and at the end the export of the
best step as a SentenceTransformer, its scores, ``results.json`` and the model card."""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from simcse_weince.evaluation import evaluate_sts, format_sts_table, stsb_spearman
from simcse_weince.hub import write_export_listing, write_model_card
from simcse_weince.paths import hub_is_offline
from simcse_weince.precision import precision_label
from simcse_weince.provenance import versions
from simcse_weince.text.columns import COLUMN_ROLES
from simcse_weince.text.config import TrainConfig
from simcse_weince.training.checkpoints import reporting_write_failures
from simcse_weince.training.loop import TrainingRun
from simcse_weince.training.run_folder import record_run_files
from simcse_weince.training.timing import format_time_parts
from simcse_weince.training.tracking import summarize_lambda
from simcse_weince.weince.config import WeinceConfig

logger = logging.getLogger(__name__)


def not_applied_settings(config: TrainConfig, tensorboard_dropped: str | None) -> dict[str, str]:
    """Settings that cannot take effect in this run, with why (``results.json`` lists them)."""
    not_applied = {}
    if tensorboard_dropped:
        not_applied["report_to"] = tensorboard_dropped
    if config.loss == "infonce" and config.weince != WeinceConfig():
        changed = [name for name, value in config.weince.to_dict().items() if value != getattr(WeinceConfig(), name)]
        not_applied["weince"] = f"loss=infonce: the WEINCE settings {', '.join(changed)} have no effect"
        logger.warning("%s", not_applied["weince"])
    if config.hardness_mode is None and config.hardness_strength:
        not_applied["hardness_strength"] = (
            f"hardness_mode=none: hardness_strength={config.hardness_strength:g} has no effect"
        )
        logger.warning("%s", not_applied["hardness_strength"])
    if config.hardness_mode not in (None, "in_batch_negatives") and not config.hardness_strength:
        not_applied["hardness_mode"] = f"hardness_strength=0: hardness_mode={config.hardness_mode} has no effect"
        logger.warning("%s", not_applied["hardness_mode"])
    return not_applied


def check_evaluation_data(data_dir: Path) -> None:
    """Fail before training, not at the first evaluation, when STS-B is missing and cannot be downloaded."""
    if not (data_dir / "stsbenchmark").is_dir() and hub_is_offline():
        raise FileNotFoundError(
            f"STS-B is not in {data_dir / 'stsbenchmark'} and the Hub is offline; set --data-dir or "
            f"$SIMCSE_WEINCE_DATA_DIR to the folder holding the evaluation data"
        )


class DevSelection:
    """STS-B dev Spearman of the current weights (main process; evaluation pooler, no dropout; under bf16 autocast
    when ``eval_bf16``); the best step's encoder weights are kept in ``best_dir`` and exported at the end. Scores
    and the best step live in the trainer ``state``, so they survive a resume."""

    def __init__(
        self, accelerator, model, config: TrainConfig, data_dir: Path, state: dict, best_dir: Path,
        eval_bf16: bool = False,
    ):  # fmt: skip
        self.accelerator, self.model, self.config = accelerator, model, config
        self.data_dir, self.state, self.best_dir, self.eval_bf16 = data_dir, state, best_dir, eval_bf16

    def score(self) -> float | None:

        score = None
        if self.accelerator.is_main_process:

            def encoder(texts):
                with evaluation_autocast(self.eval_bf16, self.accelerator.device):
                    return self.model.encode(texts, batch_size=self.config.eval_batch_size)

            score = float(stsb_spearman(encoder, split="dev", data_dir=self.data_dir))
        self.accelerator.wait_for_everyone()
        return score

    def evaluate(self, step: int, write=print) -> None:
        """Score step ``step``, log it, and keep its weights when it is the best so far."""
        score = self.score()
        state = self.state
        if self.accelerator.is_main_process:
            state["evaluations"].append({"step": step, "stsb_dev_spearman": score})
            self.accelerator.log({"stsb_dev_spearman": score}, step=step)
            if state["best_stsb_dev_spearman"] is None or score > state["best_stsb_dev_spearman"]:
                state["best_stsb_dev_spearman"], state["best_step"] = score, step
                save_weights(self.model.evaluation_modules(), self.best_dir)
            write(
                f"step {step}: STS-B dev Spearman {score:.2f} (best {state['best_stsb_dev_spearman']:.2f} at step "
                f"{state['best_step']})"
            )
        self.accelerator.wait_for_everyone()

    def restore_best(self) -> None:
        """Load the best step's weights (when there was an evaluation) into the model."""
        if self.state["best_step"] is not None and (self.best_dir / "model.safetensors").is_file():
            load_weights(self.model.evaluation_modules(), self.best_dir)


@dataclass(frozen=True)
class TrainingRows:
    """What the run was trained on, as ``results.json`` reports it."""

    train_file: Path
    columns: tuple[str, ...]  # the training file's columns, in role order
    num_rows: int  # sentences (one column), pairs or triplets
    skipped: int  # empty lines skipped


def export_results(run: TrainingRun, model, dev: DevSelection, data: TrainingRows, not_applied: dict) -> dict:
    """Export the best step as a SentenceTransformer, score the exported folder, write ``results.json`` and the
    model card (main process; the others return ``{}``).

    The model is written to ``.export.tmp`` and moved into ``output_dir`` once complete; a failed write (full
    disk) removes it and raises :class:`~simcse_weince.training.checkpoints.WriteError`, which names
    ``run.last_checkpoint`` (the last step's weights, saved before the export) to resume from.

    ``run.timer`` times the export and the final evaluation; ``wall_time_seconds`` is read right before the card
    and ``results.json`` are written (their own few milliseconds are the only part of the run it leaves out)."""

    config, accelerator, state, last_checkpoint = run.config, run.accelerator, run.state, run.last_checkpoint
    if not accelerator.is_main_process:
        return {}
    output_dir = run.output_dir
    forward = model.training_forward
    applied_config = config.to_dict()
    if "report_to" in not_applied:
        applied_config["report_to"] = [name for name in config.report_to if name != "tensorboard"]
    dev.restore_best()
    staging = output_dir / EXPORT_STAGING
    kept = f"the last step's weights are in {last_checkpoint}: " if last_checkpoint is not None else ""
    after = f"the partial export is removed; {kept}free space, then run the same command with --resume to export"
    record_run_files(output_dir, [EXPORT_STAGING])  # a partial export left by a kill is the run's, never pushed
    with run.timer.part("export"), reporting_write_failures(output_dir, staging, after):
        shutil.rmtree(staging, ignore_errors=True)
        model.save_sentence_transformer(staging)
        _move_into(staging, output_dir)
    results = {"stsb_dev_spearman": None, "stsb_test_spearman": None}
    if config.final_evaluation:
        with run.timer.part("final_evaluation"):
            results = final_evaluation(output_dir, config, dev.data_dir, accelerator.device, dev.eval_bf16)
    accum, train_seconds, total_steps = config.gradient_accumulation_steps, state["train_seconds"], run.total_steps
    columns, num_rows = data.columns, data.num_rows
    results.update(
        {
            "best_step": state["best_step"] or total_steps,
            "best_stsb_dev_spearman_during_training": state["best_stsb_dev_spearman"],
            "base_stsb_dev_spearman": state["base_stsb_dev_spearman"],
            "total_steps": total_steps,
            "resumed_from_step": run.start_step or None,
            "num_train_rows": num_rows,  # sentences (one column), pairs or triplets
            "num_train_sentences": num_rows * len(columns),
            "train_columns": column_roles(columns),  # each column of the training file and what it meant
            "evaluation_pooler": model.evaluation_pooler,
            "embedding_dimension": model.encoder.config.hidden_size,
            "skipped_empty_lines": data.skipped,
            "train_file": str(data.train_file),
            "num_processes": accelerator.num_processes,
            "device": str(accelerator.device),
            "mixed_precision": run.mixed_precision,  # the precision used (config.mixed_precision may say auto)
            # what the training forward applied (config.speed asks; auto, BERT only, its start-up check)
            "length_chunks": forward.length_chunks,
            "unpadded_layers": forward.unpadded_layers,
            "onednn_linear": forward.onednn_linear,
            "training_forward": forward.report,  # path: fast | fallback | stock, and why
            **run.timer.report(train_seconds),  # wall_time_seconds (the whole run up to here) and its parts
            "train_time_seconds": train_seconds,  # = train_seconds, the name of earlier releases
            "train_sentences_per_second": total_steps * config.batch_size * accum / max(train_seconds, 1e-9),
            **flop_utilisation(state.get("model_flops"), train_seconds, run.peak_flops, run.mixed_precision),
            "lambda_stats": summarize_lambda(state["history"]),
            "config": applied_config,
            "not_applied": not_applied,
            "evaluations": state["evaluations"],
            "history": state["history"],
            "versions": versions(),
        }
    )

    with reporting_write_failures(output_dir, staging, after):
        # results.json marks a finished run (compare reads it): the model card goes first
        record_run_files(output_dir, ["README.md"], kind="export")  # the model card
        write_model_card(output_dir, results)
        staging.mkdir()
        (staging / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        write_export_listing(output_dir, staging)  # every file push may upload, with its sha256
        _move_into(staging, output_dir)  # results.json: the exported model's scores and settings, pushed with it
    return results


EXPORT_STAGING = ".export.tmp"


def flop_utilisation(model_flops, train_seconds: float, peak_flops, mixed_precision: str) -> dict:
    """``results.json``'s FLOP figures (training/flops.py): the model FLOP/s of all the run's training steps (its
    earlier sessions too, when resumed), the device's matmul peak at the run's precision (the better of the
    measurements at start-up and after the last step), and their ratio (MFU); {} when the encoder's FLOPs are not
    counted (or a resumed run's earlier steps were not)."""
    if not model_flops or not peak_flops or train_seconds <= 0:
        return {}
    achieved = model_flops / train_seconds
    return {"model_flops_per_second": achieved, "peak_flops_per_second": peak_flops,
            "peak_precision": precision_label(mixed_precision), "mfu": achieved / peak_flops}  # fmt: skip


def column_roles(columns: tuple[str, ...]) -> dict[str, str]:
    """Each training column and its role: one column is unsupervised SimCSE (its dropout views are the pairs)."""

    if len(columns) == 1:
        return {columns[0]: "sentence (its two dropout views are the positive pair)"}
    return dict(zip(columns, COLUMN_ROLES))


def _move_into(staging: Path, output_dir: Path, kind: str = "export") -> None:
    """Move every entry of ``staging`` into ``output_dir`` (renames on one file system), then drop ``staging``;
    each is recorded first in the run's manifest as ``kind`` ("export": the model that ``push`` uploads)."""
    record_run_files(output_dir, sorted(entry.name for entry in staging.iterdir()), kind=kind)
    written = _written_by_the_export(output_dir)
    for entry in sorted(staging.iterdir()):
        target = output_dir / entry.name
        if target.is_dir() and not target.is_symlink():
            for path in sorted(target.rglob("*")):  # a file put in an export's folder is the user's: never removed
                if written is not None and not path.is_dir() and path.relative_to(output_dir).as_posix() not in written:
                    raise FileExistsError(
                        f"{path} was not written by the export of {output_dir}, and exporting again replaces "
                        f"{target}: move the file out of it, then run the same command with --resume to export"
                    )
            shutil.rmtree(target)
        os.replace(entry, target)
    staging.rmdir()


def _written_by_the_export(output_dir: Path) -> set[str] | None:
    """The files the folder's earlier export wrote (its export listing), or None without a listing."""
    from simcse_weince.hub import EXPORT_LISTING
    from simcse_weince.records import read_json

    path = output_dir / EXPORT_LISTING
    if not path.is_file():
        return None
    listing = read_json(path, "export listing")
    return set(listing.get("files", {})) if isinstance(listing, dict) else set()


def final_evaluation(output_dir: Path, config: TrainConfig, data_dir: Path, device, eval_bf16: bool = False) -> dict:
    """Scores of the exported folder itself, so ``SentenceTransformer(output_dir)`` reproduces them (under bf16
    autocast when ``eval_bf16``)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(output_dir), device=str(device))
    # The evaluation package's encoding (token-sorted batches of eval_batch_size, as the dev score during
    # training): what a user gets from the same call on the folder. STS-B dev/test: the original (raw text)
    # benchmark, sentence-transformers' protocol.
    options = {"data_dir": data_dir, "batch_size": config.eval_batch_size}
    with evaluation_autocast(eval_bf16, device):
        results = {
            "stsb_dev_spearman": float(stsb_spearman(model, split="dev", **options)),
            "stsb_test_spearman": float(stsb_spearman(model, split="test", **options)),
        }
        if config.final_tasks:  # SimCSE's table: SentEval's tokenised, lower-cased copies (its STS-B column differs)
            table = evaluate_sts(model, tasks=config.final_tasks, split="test", **options)
            results["sts_test"] = {key: value for key, value in table.items() if key != "details"}
            results["sts_table"] = format_sts_table(table)
    results["evaluation_precision"] = "bf16" if eval_bf16 else "fp32"
    return results


def evaluation_autocast(eval_bf16: bool, device):
    """bf16 autocast for evaluation when ``eval_bf16`` (resolved: :func:`~simcse_weince.text.config.resolve_eval_bf16`);
    otherwise fp32 (no autocast at all, even inside a bf16 training run)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=eval_bf16)


def save_weights(module: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    save_model(module, str(folder / "model.safetensors.tmp"))
    os.replace(folder / "model.safetensors.tmp", folder / "model.safetensors")  # a kill mid-save keeps the old one


def load_weights(module: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import load_model

    load_model(module, str(folder / "model.safetensors"), device=str(next(module.parameters()).device))


def format_summary(results: dict, output_dir: Path) -> str:
    """The lines the CLI prints at the end of a run."""

    def fmt(value) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    lines = [
        f"STS-B dev Spearman: {fmt(results['stsb_dev_spearman'])}   STS-B test Spearman: "
        f"{fmt(results['stsb_test_spearman'])}   (best step {results['best_step']} of {results['total_steps']})"
    ]
    if results.get("sts_table"):
        lines.append(results["sts_table"])
    utilisation = (
        f", {results['model_flops_per_second'] / 1e9:.0f} GFLOP/s = {100 * results['mfu']:.0f}% of this device's "
        f"{results['peak_precision']} matmul peak ({results['peak_flops_per_second'] / 1e9:.0f} GFLOP/s)"
        if results.get("mfu") else ""
    )  # fmt: skip
    lines.append(
        f"wall time {format_time_parts(results)}; training {results['train_sentences_per_second']:.1f} "
        f"sentences/s{utilisation} ({describe_training_forward(results.get('training_forward'))}); model, "
        f"results.json and README.md in {output_dir}"
    )
    return "\n".join(lines)


def describe_training_forward(report: dict | None) -> str:
    """Which training forward ran, in a few words (``results.json``'s ``training_forward``)."""
    if not report:
        return "stock forward"
    parts = [f"{report['length_chunks']} length chunk(s)"]
    if report.get("unpadded_layers"):
        parts.append("unpadded layers" + (" by oneDNN" if report.get("onednn_linear") else ""))
    if report.get("compile"):
        parts.append("compiled")
    label = {"fast": "fast forward", "fallback": "fallback forward", "stock": "stock forward"}[report["path"]]
    why = f"; the fast one failed its check: {report['reason']}" if report.get("reason") else ""
    return f"{label}: {', '.join(parts)}{why}"
