"""Unsupervised SimCSE with WEINCE (or InfoNCE) on 🤗 Accelerate: the training loop, top to bottom.

Every sentence is encoded twice in one forward pass over the doubled batch; the two dropout masks make the
positive pair, the other sentences of the (global) batch are the negatives. Anchors are the first views,
candidates the second (WEINCE's ``simcse`` geometry). With several processes the embeddings of both views are
gathered with their gradient, so the negatives and WEINCE's tail statistics span the global batch and every
process computes the same loss.

Example::

    from simcse_weince.train import TrainConfig, preset, train

    config = preset("cpu-demo", output_dir="runs/demo", loss="infonce")
    results = train(config)  # a SentenceTransformer folder + results.json + README.md in runs/demo
    print(results["stsb_test_spearman"])

or from the shell: ``simcse-weince train --preset cpu-demo`` (``accelerate launch`` / ``torchrun`` for several
devices). Reference: Gao, Yao, Chen, "SimCSE", EMNLP 2021; Erol et al., "When Softmax Fails at the Top:
Extreme-Value Corrections for InfoNCE", ICML 2026 (arXiv 2606.00262).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import sys
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from simcse_weince.distributed import gather_with_grad
from simcse_weince.paths import hub_is_offline, resolve_data_dir
from simcse_weince.precision import MIXED_PRECISION, precision_label, resolve_mixed_precision
from simcse_weince.validation import check_utf8_text_file
from simcse_weince.weince import WeinceConfig, infonce_loss, summarize_statistics, weince_loss

logger = logging.getLogger(__name__)

LOSSES = ("weince", "infonce")
#: the transformers.get_scheduler names that work from (warmup, total steps) alone and step without a metric
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt")  # fmt: skip
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
CONFIG_FILE = "training_config.yaml"  # the resolved config; its presence marks a folder as one of our runs
CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"  # sizes and sha256 of a checkpoint's files, checked on --resume
PREVIOUS_RUN_SUFFIX = ".previous-run"  # .<output_dir>.previous-run: the run --overwrite replaces, until replaced
#: the statistics of the WEINCE mixing weight logged every step (same names as WeinceLoss.last_diagnostics)
LAMBDA_STATISTICS = ("lambda_mean", "lambda_above_half", "rho0", "delta_aic_mean", "beta_hat_mean")
#: SimCSE's corpus, fetched from the Hub when it is not in the data directory and the Hub is reachable
HUB_TRAIN_FILES = {"wiki1m_for_simcse.txt": ("princeton-nlp/datasets-for-simcse", "wiki1m_for_simcse.txt")}
# Files cut from the head of a downloadable one: the cpu-demo's 11,914 sentences.
HEAD_TRAIN_FILES = {"wiki1m_head.txt": ("wiki1m_for_simcse.txt", 11914)}


# ------------------------------------------------------------------------------------------- the config


@dataclass
class TrainConfig:
    """Everything a run depends on. The defaults are SimCSE's unsupervised BERT-base recipe (preset ``paper``).

    Batch semantics: ``batch_size`` sentences form one contrastive batch (each sentence's negatives are the
    other ``batch_size - 1``), whatever the number of processes: each process encodes ``batch_size /
    num_processes`` of them and the embeddings are gathered. Gradient accumulation sums the gradients of
    ``gradient_accumulation_steps`` such batches (negatives stay within a batch). ``mini_batch_size`` bounds
    memory without losing negatives: each process encodes its share ``mini_batch_size`` sentences at a time
    (GradCache, see :func:`forward_backward`), with the same loss and gradients.
    """

    # model
    model: str = "bert-base-uncased"  # hub id, local folder, or bundled:all-MiniLM-L6-v2
    pooler: str = "cls"  # cls (MLP in training only; cls_before_pooler at evaluation), cls_before_pooler, avg
    dropout: float | None = None  # hidden and attention dropout; None keeps the model's (0.1 for BERT)
    # data
    train_file: str = "wiki1m_for_simcse.txt"  # a path, or a file name inside the data directory
    data_dir: str | None = None  # None: $SIMCSE_WEINCE_DATA_DIR, else ~/.cache/simcse_weince/data
    max_train_samples: int | None = None  # use only the first N sentences
    max_length: int = 32  # tokens per training sentence
    # loss
    loss: str = "weince"  # weince | infonce
    temperature: float = 0.05
    weince: WeinceConfig = field(default_factory=WeinceConfig)
    # optimisation
    batch_size: int = 64
    mini_batch_size: int | None = None  # GradCache: encode the batch this many sentences at a time (None: at once)
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3e-5
    lr_scheduler: str = "linear"  # one of LR_SCHEDULERS (transformers.get_scheduler names)
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0  # SimCSE trains with the HF Trainer, which clips at 1.0
    num_epochs: int = 1
    max_steps: int | None = None  # optimizer updates; overrides num_epochs (may span several epochs)
    mixed_precision: str = "auto"  # auto (bf16 where native, else fp32) | no | fp16 | bf16; see precision.py
    length_chunks: int = 4  # encode each batch in this many length-sorted chunks (less padding); 1: one forward
    cpu: bool = False  # force the CPU even when an accelerator is present
    seed: int = 42
    # evaluation (STS-B dev every eval_steps, the best step is kept; then STS-B test and the 7-task table)
    eval_steps: int = 125  # 0: no evaluation during training (the last step is exported)
    eval_before_training: bool = False  # also score the untrained model (reported, never selected)
    eval_batch_size: int = 128
    eval_max_length: int | None = None  # None: the base model's max_seq_length (<= 512)
    eval_bf16: bool = False  # evaluate under bf16 autocast (faster; the default fp32 keeps SentEval's digits)
    final_tasks: tuple[str, ...] = STS_TASKS  # test-split table after training; () or none for STS-B only
    final_evaluation: bool = True  # False: no scores at the end (benchmarks, quick experiments)
    # checkpoints and logging
    save_steps: int = 250  # 0: no checkpoints (Ctrl-C still saves one)
    save_total_limit: int = 1  # step checkpoints kept, >= 1 (the best model is kept separately)
    logging_steps: int = 1
    report_to: tuple[str, ...] = ("csv", "tensorboard")
    num_workers: int = 0  # DataLoader workers (tokenisation happens once, up front)
    output_dir: str = "runs/simcse-weince"

    def __post_init__(self) -> None:
        if isinstance(self.weince, dict):
            self.weince = WeinceConfig(**self.weince)
        self.final_tasks = tuple(self.final_tasks)
        self.report_to = tuple(self.report_to)
        self.validate()

    def validate(self) -> None:
        from simcse_weince.modeling import POOLERS
        from simcse_weince.validation import check_field_types

        check_field_types(self)  # batch_size="32" -> TypeError naming the field, not a failed comparison
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.pooler not in POOLERS:
            raise ValueError(f"unknown pooler {self.pooler!r}; expected one of {POOLERS}")
        if self.batch_size < 2:
            raise ValueError(
                f"batch_size must be >= 2 (each sentence needs at least one in-batch negative), got {self.batch_size}"
            )
        for name in (
            "gradient_accumulation_steps",
            "num_epochs",
            "max_length",
            "eval_batch_size",
            "logging_steps",
            "length_chunks",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.save_total_limit < 1:  # 0 would keep no checkpoint to resume from; there is save_steps=0 for that
            raise ValueError(
                f"save_total_limit must be >= 1 (the step checkpoints kept; --save-steps 0 saves none), "
                f"got {self.save_total_limit}"
            )
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"unknown lr_scheduler {self.lr_scheduler!r}; expected one of {LR_SCHEDULERS}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 (or None: no clipping), got {self.max_grad_norm}")
        if self.eval_max_length is not None and self.eval_max_length < 1:
            raise ValueError(f"eval_max_length must be >= 1 (or None: the model's), got {self.eval_max_length}")
        for name in ("model", "train_file", "output_dir"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} is empty")
        for name in ("eval_steps", "save_steps", "warmup_steps", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size must be >= 1 (or None: no GradCache), got {self.mini_batch_size}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 (or None for num_epochs), got {self.max_steps}")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"max_train_samples must be >= 1, got {self.max_train_samples}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mixed_precision not in MIXED_PRECISION:
            choices = ", ".join(MIXED_PRECISION)
            raise ValueError(f"mixed_precision must be one of {choices}, got {self.mixed_precision!r}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        unknown = [task for task in self.final_tasks if task not in STS_TASKS]
        if unknown:
            raise ValueError(f"unknown final_tasks {unknown}; choose among {STS_TASKS}")
        unknown = [name for name in self.report_to if name not in ("csv", "tensorboard")]
        if unknown:
            raise ValueError(f"unknown report_to {unknown}; supported: csv, tensorboard")

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["final_tasks"] = list(self.final_tasks)
        values["report_to"] = list(self.report_to)
        return values


#: presets are overrides of the defaults (which are SimCSE's paper recipe)
PRESETS: dict[str, dict] = {
    "paper": {},
    "cpu-demo": {
        "model": "bundled:all-MiniLM-L6-v2",
        "pooler": "avg",  # the model was trained with mean pooling
        "train_file": "wiki1m_head.txt",  # 11,914 sentences: one epoch is 186 steps of 64
        "eval_steps": 62,  # three checkpoints to choose from, ~10 s each on 2 cores
        "eval_before_training": True,  # show where training started
        "save_steps": 62,
        "output_dir": "runs/cpu-demo",
    },
}
# The same data and model trained and evaluated SimCSE's way: [CLS] + MLP head in training, [CLS] without it at
# evaluation. MiniLM was trained with mean pooling, so its [CLS] vector starts lower (STS-B dev 79.7) and
# contrastive training has room to move it, which mean pooling (dev 86.7, loss ~1e-3 from step 1) has not.
PRESETS["cpu-cls"] = {**PRESETS["cpu-demo"], "pooler": "cls", "output_dir": "runs/cpu-cls"}


def _field_types(cls) -> dict:
    return typing.get_type_hints(cls)


def convert_value(value, hint, name: str = "value"):
    """Turn ``value`` (a CLI string or a YAML/JSON value) into the type ``hint`` of a config field."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        for option in [arg for arg in args if arg is not type(None)]:
            try:
                return convert_value(value, option, name)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{name}: cannot read {value!r} as {hint}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise ValueError(f"{name} must be one of {args}, got {value!r}")
    if origin is tuple:
        if isinstance(value, str) and value.strip().lower() in ("none", "null"):
            return ()
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return tuple(convert_value(item, args[0], name) for item in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if hint is float:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r}")
        return value
    return value


def flatten_overrides(values: dict, prefix: str = "") -> dict:
    """``{"weince": {"quantile": 0.3}}`` -> ``{"weince.quantile": 0.3}`` (config files may nest or use dots)."""
    flat = {}
    for key, value in values.items():
        key = str(key).replace("-", "_")
        if key == "weince" and isinstance(value, dict):
            flat.update(flatten_overrides(value, prefix="weince."))
        else:
            flat[prefix + key] = value
    return flat


def apply_overrides(config: TrainConfig, overrides: dict) -> TrainConfig:
    """A new config with ``overrides`` (flat, ``weince.<field>`` for the loss) applied and type-checked."""
    train_types, weince_types = _field_types(TrainConfig), _field_types(WeinceConfig)
    train_values = {name: value for name, value in dataclasses.asdict(config).items() if name != "weince"}
    weince_values = dataclasses.asdict(config.weince)
    for key, value in flatten_overrides(overrides).items():
        if key.startswith("weince."):
            name = key.removeprefix("weince.")
            if name not in weince_types:
                raise ValueError(f"unknown WEINCE setting {name!r}; known: {', '.join(weince_types)}")
            weince_values[name] = convert_value(value, weince_types[name], key)
        elif key in train_types and key != "weince":
            train_values[key] = convert_value(value, train_types[key], key)
        elif key in weince_types:  # the short form: quantile = weince.quantile
            weince_values[key] = convert_value(value, weince_types[key], key)
        else:
            raise ValueError(f"unknown config setting {key!r}; known: {', '.join(train_types)}")
    return TrainConfig(**train_values, weince=WeinceConfig(**weince_values))


def read_config_file(path: str | os.PathLike) -> dict:
    """Flat overrides from a YAML or JSON file (keys are TrainConfig fields, WEINCE fields under ``weince``)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"config file {path} is not UTF-8 text (invalid byte at offset {error.start}); save it as UTF-8"
        ) from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        values = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"config file {path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"config file {path} is not valid YAML: {problem}{where}; fix the file") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of settings, got {type(values).__name__}")  # noqa: TRY004
    return flatten_overrides(values)


def preset(name: str = "paper", **overrides) -> TrainConfig:
    """The config of a preset (``paper``, ``cpu-demo``) with keyword overrides (``weince={"quantile": .3}`` too)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {tuple(PRESETS)}")
    return apply_overrides(TrainConfig(), {**PRESETS[name], **overrides})


def save_config(config: TrainConfig, path: Path) -> None:
    import yaml

    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False), encoding="utf-8")


def load_config(path: Path) -> TrainConfig:
    return apply_overrides(TrainConfig(), read_config_file(path))


# --------------------------------------------------------------------------------------------- the data


def resolve_train_file(config: TrainConfig) -> Path:
    """The training text file: a path as given, else a name in the data directory (downloaded when online)."""
    data_dir = resolve_data_dir(config.data_dir)
    given = Path(config.train_file).expanduser()
    candidates = [given] if given.is_absolute() else [given, data_dir / given]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if config.train_file in HEAD_TRAIN_FILES and not hub_is_offline():
        source_name, num_lines = HEAD_TRAIN_FILES[config.train_file]
        source = _download_train_file(source_name, data_dir)
        head = data_dir / config.train_file
        with open(source, encoding="utf-8") as full, open(head.with_suffix(".tmp"), "w", encoding="utf-8") as out:
            for _, line in zip(range(num_lines), full):
                out.write(line)
        head.with_suffix(".tmp").replace(head)
        return head
    if config.train_file in HUB_TRAIN_FILES and not hub_is_offline():
        return _download_train_file(config.train_file, data_dir)
    tried = " or ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(
        f"training file not found: {tried} (set --train-file, or --data-dir / ${'SIMCSE_WEINCE_DATA_DIR'})"
    )


def _download_train_file(name: str, data_dir: Path) -> Path:
    from huggingface_hub import hf_hub_download

    repo_id, filename = HUB_TRAIN_FILES[name]
    print(f"downloading {filename} from the Hub dataset {repo_id} into {data_dir} ...", file=sys.stderr)
    try:
        return Path(hf_hub_download(repo_id, filename, repo_type="dataset", local_dir=data_dir))
    except Exception as error:  # network, auth, disk: say what we tried
        raise FileNotFoundError(
            f"training file {name!r} is not in {data_dir} and downloading it from {repo_id} failed: {error}"
        ) from error


def load_sentences(path: Path, max_train_samples: int | None = None):
    """One sentence per line, through 🤗 datasets; empty lines are dropped and counted.

    Returns ``(dataset with a "text" column, number of empty lines skipped)``.
    """
    from datasets import load_dataset

    if not path.is_file():
        raise FileNotFoundError(f"training file {path} not found")
    if path.stat().st_size == 0:
        raise ValueError(f"training file {path} is empty; give a text file with one sentence per line")
    check_utf8_text_file(path, "training file")  # one line naming the byte, not a traceback from datasets
    dataset = load_dataset("text", data_files=str(path), split="train")
    sentences = dataset.filter(lambda batch: [bool(text.strip()) for text in batch["text"]], batched=True)
    skipped = len(dataset) - len(sentences)
    if len(sentences) == 0:
        raise ValueError(f"training file {path} holds no sentences ({skipped} empty lines)")
    if max_train_samples is not None:
        sentences = sentences.select(range(min(max_train_samples, len(sentences))))
    return sentences, skipped


def tokenize(sentences, tokenizer, max_length: int):
    """Token ids of every sentence (truncated, unpadded), computed once before training."""
    return sentences.map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=max_length),
        batched=True,
        remove_columns=["text"],
        desc="tokenizing",
    )


class StepBatchSampler(torch.utils.data.Sampler):
    """Batches as a pure function of (seed, batch index): exact resumption needs no sampler state.

    Epoch ``e`` visits the sentences in the order ``randperm(n, seed + e)``, in consecutive batches of
    ``batch_size`` (the incomplete last batch is dropped). Iteration starts at ``start_batch`` and stops after
    ``num_batches``; each process takes its ``batch_size / num_processes`` share of every global batch, so the
    global data order does not depend on the number of processes.
    """

    def __init__(self, num_examples, batch_size, seed, start_batch, num_batches, process_index=0, num_processes=1):
        if num_examples < batch_size:
            raise ValueError(f"the training data hold {num_examples} sentences, fewer than one batch of {batch_size}")
        if batch_size % num_processes:
            raise ValueError(f"batch_size {batch_size} must be divisible by the number of processes {num_processes}")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.start_batch, self.num_batches = start_batch, num_batches
        self.local_size = batch_size // num_processes
        self.local_offset = process_index * self.local_size
        self.batches_per_epoch = num_examples // batch_size

    def global_batch(self, index: int) -> list[int]:
        epoch, position = divmod(index, self.batches_per_epoch)
        order = torch.randperm(self.num_examples, generator=torch.Generator().manual_seed(self.seed + epoch))
        return order[position * self.batch_size : (position + 1) * self.batch_size].tolist()

    def __iter__(self):
        cached_epoch, order = None, None
        for index in range(self.start_batch, self.num_batches):
            epoch, position = divmod(index, self.batches_per_epoch)
            if epoch != cached_epoch:  # one permutation per epoch
                cached_epoch = epoch
                order = torch.randperm(self.num_examples, generator=torch.Generator().manual_seed(self.seed + epoch))
            start = position * self.batch_size + self.local_offset
            yield order[start : start + self.local_size].tolist()

    def __len__(self):
        return self.num_batches - self.start_batch


class PaddingCollator:
    """Pads token ids to the longest sentence of the batch (dynamic padding, like SimCSE)."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        from torch.nn.utils.rnn import pad_sequence

        batch = {}
        for name in features[0]:
            padding = self.pad_token_id if name == "input_ids" else 0
            batch[name] = pad_sequence(
                [torch.tensor(feature[name]) for feature in features], batch_first=True, padding_value=padding
            )
        return batch


# --------------------------------------------------------------------------------------------- the loss


class ContrastiveObjective:
    """The unsupervised SimCSE loss on two dropout views, chosen by name (``weince`` or ``infonce``).

    Anchors are the first views, candidates the second (geometry ``simcse``: sentence i's positive is its own
    second view, the other sentences' second views are its negatives). With several processes both views are
    gathered with their gradient first, so every process computes the loss of the global batch.

    Returns ``(loss, diagnostics)``; for WEINCE the diagnostics are the detached λ statistics
    (:data:`LAMBDA_STATISTICS`) as 0-d tensors, for InfoNCE an empty dict.
    """

    def __init__(
        self,
        loss: str = "weince",
        temperature: float = 0.05,
        config: WeinceConfig | None = None,
        gather: bool = True,
    ):
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
        self.loss, self.temperature, self.gather = loss, temperature, gather
        self.config = config or WeinceConfig()

    def __call__(self, first_view: torch.Tensor, second_view: torch.Tensor):
        if self.gather:
            first_view, second_view = gather_with_grad(first_view), gather_with_grad(second_view)
        if self.loss == "infonce":
            return infonce_loss(first_view, second_view, temperature=self.temperature, geometry="simcse"), {}
        loss, stats = weince_loss(
            first_view,
            second_view,
            temperature=self.temperature,
            config=self.config,
            geometry="simcse",
            return_stats=True,
        )
        return loss, summarize_statistics(stats)


def forward_backward(
    model, batch: dict, objective: ContrastiveObjective, accelerator, mini_batch_size=None, length_chunks: int = 1
):
    """The loss of one contrastive batch and its gradients, accumulated into the model's ``.grad``.

    Without ``mini_batch_size``: one forward over the doubled batch (two dropout views) and one backward.
    ``length_chunks`` > 1 encodes the rows of every forward in that many length-sorted chunks, each padded only
    to its own longest sentence (:meth:`SimCSEModel.forward`); the loss sees the same embeddings.

    With it, GradCache (Gao et al., 2021; the machinery of sentence-transformers' cached losses), so that only
    ``mini_batch_size`` sentences' activations are alive at a time while the loss still sees the whole batch:

    1. every chunk of ``mini_batch_size`` sentences is encoded (both views, one forward) without a graph, and
       the RNG state before each forward is kept (sentence-transformers' ``RandContext``);
    2. the loss of the whole batch is computed from those embeddings (gathered across processes as usual) and
       back-propagated up to them through ``accelerator.backward``, which applies the fp16 loss scale and the
       gradient-accumulation divisor to the cached embedding gradients;
    3. every chunk is encoded again with its RNG state replayed (the same dropout masks) and the cached
       gradients are back-propagated through it. DDP reduces once, after the last chunk.

    The global RNG ends where the first pass left it (the replays run in a forked RNG), so resuming from a
    checkpoint continues exactly.
    """
    if not mini_batch_size:
        first_view, second_view = model(**batch, num_views=2, length_chunks=length_chunks)  # two dropout masks
        loss, diagnostics = objective(first_view, second_view)
        accelerator.backward(loss)
        return loss, diagnostics

    from contextlib import nullcontext

    from sentence_transformers.base.losses.gradcache import RandContext

    from simcse_weince.modeling import trim_trailing_padding

    rows = batch["input_ids"].shape[0]
    # each chunk drops the padding columns it does not need (the batch is padded to its longest sentence)
    chunks = [
        trim_trailing_padding({name: value[begin : begin + mini_batch_size] for name, value in batch.items()})
        for begin in range(0, rows, mini_batch_size)
    ]

    random_states, first_chunks, second_chunks = [], [], []
    with torch.no_grad():
        for chunk in chunks:
            random_states.append(RandContext(*chunk.values()))
            first, second = model(**chunk, num_views=2, length_chunks=length_chunks)
            first_chunks.append(first)
            second_chunks.append(second)
    first_view = torch.cat(first_chunks).requires_grad_()
    second_view = torch.cat(second_chunks).requires_grad_()
    loss, diagnostics = objective(first_view, second_view)
    accelerator.backward(loss)

    sizes = [len(first) for first in first_chunks]
    cached_gradients = zip(first_view.grad.split(sizes), second_view.grad.split(sizes))
    for index, (chunk, random_state, (first_grad, second_grad)) in enumerate(
        zip(chunks, random_states, cached_gradients)
    ):
        synchronize = nullcontext() if index == len(chunks) - 1 else accelerator.no_sync(model)
        with synchronize, random_state:
            first, second = model(**chunk, num_views=2, length_chunks=length_chunks)
            # the surrogate's gradient w.r.t. the embeddings is the cached gradient; float32 keeps fp16/bf16
            # embeddings from rounding the products
            surrogate = torch.dot(first.flatten().float(), first_grad.flatten().float()) + torch.dot(
                second.flatten().float(), second_grad.flatten().float()
            )
            surrogate.backward()
    return loss.detach(), diagnostics


# ------------------------------------------------------------------------------------ logging, checkpoints


def make_csv_tracker(logging_dir: Path):
    """An Accelerate tracker appending ``step,name,value`` rows to ``<logging_dir>/metrics.csv`` (long format:
    any metric at any step; ``pandas.read_csv(...).pivot(index="step", columns="name")`` makes it wide).

    Set ``tracker.start_step`` before ``init_trackers``: rows past it (written by a run killed after its last
    checkpoint) are dropped on resume. Only the main process writes.
    """
    from accelerate import PartialState
    from accelerate.tracking import GeneralTracker

    class CSVTracker(GeneralTracker):
        name = "csv"
        requires_logging_directory = True
        main_process_only = True

        def __init__(self):
            super().__init__()
            self.path = Path(logging_dir) / "metrics.csv"
            self.start_step = 0
            self.file = self.writer = None

        def start(self):
            if not PartialState().is_main_process:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            rows = []
            if self.path.is_file():
                with self.path.open(newline="") as handle:
                    rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= self.start_step]
            self.file = self.path.open("w", newline="")
            self.writer = csv.writer(self.file)
            self.writer.writerow(["step", "name", "value"])
            self.writer.writerows([row["step"], row["name"], row["value"]] for row in rows)
            self.file.flush()

        @property
        def tracker(self):
            return self.writer

        def store_init_configuration(self, values: dict):
            pass  # the resolved config is written to training_config.yaml

        def log(self, values: dict, step: int | None = None, **kwargs):
            if self.file is not None:
                self.writer.writerows([step, name, value] for name, value in values.items())
                self.file.flush()

        def finish(self):
            if self.file is not None:
                self.file.close()
                self.file = None

    return CSVTracker()


def previous_run_dir(output_dir: Path) -> Path:
    """Where ``--overwrite`` keeps the earlier run until the new one has saved its first checkpoint (a sibling,
    so the move is a rename on the same file system)."""
    return output_dir.with_name(f".{output_dir.name}{PREVIOUS_RUN_SUFFIX}")


def prepare_output_dir(output_dir: Path, resume, overwrite: bool, is_main: bool) -> Path | None:
    """Check the output directory; return the (verified) checkpoint to resume from (None for a fresh start).

    Touches nothing: the folder is claimed by :func:`claim_output_dir` once every input has loaded. Even with
    ``overwrite`` only a folder holding one of our runs (marked by its training_config.yaml) or an empty folder
    may be replaced.
    """
    has_run = (output_dir / CONFIG_FILE).is_file()
    non_empty = output_dir.is_dir() and any(output_dir.iterdir())
    if output_dir.exists() and not output_dir.is_dir():
        raise FileExistsError(f"output directory {output_dir} is a file; choose another --output-dir")
    previous = previous_run_dir(output_dir)
    if previous.exists():
        raise FileExistsError(
            f"{previous} holds the earlier run of {output_dir}, kept aside by an --overwrite start that stopped "
            f"before its first checkpoint; restore it (rm -rf {output_dir} && mv {previous} {output_dir}) or "
            f"delete it, then start again"
        )
    if resume:
        if not has_run:
            raise FileNotFoundError(f"--resume: {output_dir} holds no simcse-weince run ({CONFIG_FILE} is missing)")
        if resume is True or resume == "latest":
            checkpoint = newest_intact_checkpoint(output_dir)
            if checkpoint is None and is_main:
                print(
                    f"--resume: no checkpoint in {output_dir / CHECKPOINTS} yet; starting from step 0",
                    file=sys.stderr,
                )
            return checkpoint
        checkpoint = Path(resume).expanduser()
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"--resume: checkpoint folder {checkpoint} not found")
        problems = verify_checkpoint(checkpoint)
        if problems:
            intact = next((path for path in list_checkpoints(output_dir) if not verify_checkpoint(path)), None)
            hint = (
                f"the newest intact checkpoint is {intact}: resume from it with --resume {intact}"
                if intact is not None
                else f"no intact checkpoint is left in {output_dir / CHECKPOINTS}: start again with --overwrite"
            )
            raise ValueError(f"--resume: checkpoint {checkpoint} is damaged: {problems[0]}; {hint}")
        return checkpoint
    if non_empty and not overwrite:
        what = "a simcse-weince run" if has_run else "files"
        raise FileExistsError(
            f"output directory {output_dir} already holds {what}; pass --resume to continue it, --overwrite to "
            f"replace it, or choose another --output-dir"
        )
    if non_empty and not has_run:
        raise FileExistsError(
            f"output directory {output_dir} holds files that are not a simcse-weince run; refusing to delete them "
            f"even with --overwrite: choose another --output-dir"
        )
    return None


def claim_output_dir(output_dir: Path, resume) -> Path | None:
    """Make the output folder the new run's (main process, once every input has loaded and the resume
    checkpoint is in memory). An earlier run replaced with ``--overwrite`` is moved aside, not deleted; it is
    returned, and deleted by the first :func:`save_checkpoint` or at the end of training. A start that fails
    before then puts it back (:func:`restore_previous_run`)."""
    previous = None
    if not resume and output_dir.is_dir() and any(output_dir.iterdir()):
        previous = previous_run_dir(output_dir)
        os.replace(output_dir, previous)
    output_dir.mkdir(parents=True, exist_ok=True)
    return previous


def release_previous_run(output_dir: Path) -> None:
    """The new run has started (a checkpoint or the export exists): the run it replaced can go."""
    shutil.rmtree(previous_run_dir(output_dir), ignore_errors=True)


def restore_previous_run(output_dir: Path) -> bool:
    """Put back the run that a failed ``--overwrite`` start moved aside; True when there was one."""
    previous = previous_run_dir(output_dir)
    if not previous.is_dir():
        return False
    shutil.rmtree(output_dir, ignore_errors=True)
    os.replace(previous, output_dir)
    return True


def list_checkpoints(output_dir: Path) -> list[Path]:
    """The step checkpoints of a run, newest first (finished ones only: a save in progress ends in .tmp)."""
    return sorted((output_dir / CHECKPOINTS).glob("step-*[0-9]"), reverse=True)


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = [path for path in list_checkpoints(output_dir) if (path / "trainer_state.json").is_file()]
    return checkpoints[0] if checkpoints else None


def newest_intact_checkpoint(output_dir: Path) -> Path | None:
    """The newest checkpoint whose files pass :func:`verify_checkpoint`; damaged newer ones are named in a
    warning. Raises ValueError when there are checkpoints and none is intact."""
    damaged = []
    for checkpoint in list_checkpoints(output_dir):
        problems = verify_checkpoint(checkpoint)
        if not problems:
            for path, problem in damaged:
                logger.warning(
                    "checkpoint %s is damaged (%s); resuming from %s, the newest intact one (the steps after it "
                    "are trained again, on the same data with the same dropout masks)",
                    path,
                    problem,
                    checkpoint,
                )
            return checkpoint
        damaged.append((checkpoint, problems[0]))
    if damaged:
        path, problem = damaged[0]
        raise ValueError(
            f"--resume: checkpoint {path} is damaged: {problem}; no intact checkpoint is left in "
            f"{output_dir / CHECKPOINTS}: start again with --overwrite (or restore the file)"
        )
    return None


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """``manifest.json``: size and sha256 of every file of a checkpoint, so a damaged file is found on resume."""
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1), encoding="utf-8")


def verify_checkpoint(checkpoint: Path) -> list[str]:
    """What is wrong with a checkpoint's files (empty when intact), each problem naming the file.

    With a manifest: every listed file must be there with its size and sha256. A checkpoint written before
    manifests existed is checked by loading each file instead (and a warning says it cannot be verified)."""
    manifest_path = checkpoint / MANIFEST
    if not manifest_path.is_file():
        return _probe_checkpoint_files(checkpoint)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as error:
        return [f"its manifest {manifest_path} is unreadable ({error})"]
    problems = []
    if "trainer_state.json" not in files:
        problems.append(f"{manifest_path} lists no trainer_state.json")
    for name, entry in files.items():
        path = checkpoint / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.stat().st_size != entry["size"]:
            problems.append(
                f"{path} has {path.stat().st_size} bytes where {entry['size']} were saved (truncated or replaced)"
            )
        elif _sha256(path) != entry["sha256"]:
            problems.append(f"{path} does not match the sha256 saved in {MANIFEST} (corrupted)")
    return problems


def _probe_checkpoint_files(checkpoint: Path) -> list[str]:
    """Load every file of a checkpoint without a manifest (older versions), naming the one that fails."""
    state_path = checkpoint / "trainer_state.json"
    if not state_path.is_file():
        return [f"{state_path} is missing"]
    logger.warning(
        "checkpoint %s has no %s (saved by an older simcse-weince): its files are checked by loading them",
        checkpoint,
        MANIFEST,
    )
    problems = []
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.name == "trainer_state.json":
                if not isinstance(json.loads(path.read_text(encoding="utf-8")).get("step"), int):
                    raise ValueError("no step")
            elif path.suffix == ".safetensors":
                from safetensors import safe_open

                with safe_open(str(path), framework="pt") as handle:
                    for key in handle.keys():
                        handle.get_tensor(key)
            elif path.suffix in (".bin", ".pkl", ".pt"):
                torch.load(path, map_location="cpu", weights_only=False)  # our own checkpoint, as load_state does
        except Exception as error:  # noqa: BLE001 - any failure to load means the file is damaged
            problems.append(f"{path} cannot be read ({type(error).__name__}: {str(error).splitlines()[0][:200]})")
    return problems


def read_trainer_state(checkpoint: Path) -> dict:
    path = checkpoint / "trainer_state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--resume: {path} is damaged ({error}); resume from an older checkpoint") from None
    return state


def save_checkpoint(accelerator, output_dir: Path, state: dict, limit: int) -> Path:
    """Model, optimizer, scheduler and RNG states (Accelerate) plus our trainer state (step, data position,
    best score, history) and a manifest of their sizes and checksums, written to a temporary folder and renamed:
    a kill mid-save leaves no half checkpoint, and a file damaged later is found on resume."""
    final = output_dir / CHECKPOINTS / f"step-{state['step']:07d}"
    staging = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
        write_manifest(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        release_previous_run(output_dir)  # the new run now has a checkpoint: the run it replaced can go
        older = sorted((output_dir / CHECKPOINTS).glob("step-*[0-9]"))[:-limit] if limit else []
        for path in older:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


class InterruptFlag:
    """Ctrl-C (SIGINT) sets a flag that the loop checks after each step, so a checkpoint can be saved at a
    clean step boundary. A second Ctrl-C interrupts at once."""

    def __init__(self):
        self.raised = False
        self.previous = None

    def _handler(self, signum, frame):
        if self.raised:
            raise KeyboardInterrupt
        self.raised = True
        print("\nCtrl-C: saving a checkpoint after this step (press again to quit at once)", file=sys.stderr)

    def __enter__(self):
        try:
            self.previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: leave signals alone
            self.previous = None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def _mean(values):
    values = [value for value in values if value is not None and math.isfinite(value)]
    return sum(values) / len(values) if values else None


def _summarize_lambda(history: list[dict]) -> dict:
    """Mean over training and the last value of each λ statistic (empty for InfoNCE)."""
    summary = {}
    for name in LAMBDA_STATISTICS:
        values = [entry[name] for entry in history if name in entry]
        if values:
            summary[name] = {"mean": _mean(values), "last": values[-1]}
    return summary


# ------------------------------------------------------------------------------------------ the trainer


def train(config: TrainConfig, *, resume: bool | str | None = None, overwrite: bool = False) -> dict:
    """Train, evaluate and export; returns the results dict (also written to ``<output_dir>/results.json``).

    Args:
        config: a :class:`TrainConfig` (see :func:`preset`).
        resume: True / ``"latest"`` continues from the newest intact checkpoint in ``output_dir`` (a damaged
            newer one is named in a warning); a path resumes from that checkpoint, which must be intact. Data
            order, dropout masks and the schedule continue exactly.
        overwrite: replace an earlier run in ``output_dir``. Every input (config, data, model, tokenizer) is
            loaded first; the earlier run is then kept aside until the new run saves its first checkpoint or
            finishes, and put back if the new run fails before that.

    On processes other than the main one the returned dict is empty.
    """
    claimed: list[Path] = []  # the output folder, once _train has moved an earlier run aside
    try:
        return _train(config, resume=resume, overwrite=overwrite, claimed=claimed)
    except BaseException:
        if claimed and restore_previous_run(claimed[0]):
            logger.warning("the new run stopped before its first checkpoint: the earlier run in %s is back", claimed[0])
        raise


def _train(config: TrainConfig, *, resume, overwrite: bool, claimed: list) -> dict:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
    from tqdm.auto import tqdm
    from transformers import get_scheduler

    from simcse_weince.modeling import SimCSEModel

    wall_start = time.perf_counter()
    config.validate()
    output_dir = Path(config.output_dir).expanduser()

    # --- set-up: processes, data, model, checkpoint; the output folder is touched only once all have loaded ---
    log_with = []
    not_applied: dict[str, str] = {}  # settings that could not take effect here (results.json says so)
    if "tensorboard" in config.report_to:
        import importlib.util

        if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
            log_with.append("tensorboard")
        else:
            warnings.warn("tensorboard is not installed: logging to CSV only (pip install tensorboard)", stacklevel=2)
            not_applied["report_to"] = "tensorboard: not installed (pip install tensorboard); logged to CSV only"
    csv_tracker = make_csv_tracker(output_dir / "logs") if "csv" in config.report_to else None
    if csv_tracker is not None:
        log_with.append(csv_tracker)
    # Accelerate keeps its settings in process-wide singletons: a second train() in the same process (a notebook,
    # a benchmark) may bring other settings (mixed precision, cpu), so start from a clean state. A launched
    # multi-process job keeps its PartialState (the process group lives there).
    AcceleratorState._reset_state(reset_partial_state=int(os.environ.get("WORLD_SIZE", "1")) == 1)
    GradientState._reset_state()
    # split_batches: our batch_size is global, so the scheduler must step once per optimizer update (without
    # it Accelerate steps it once per process, assuming per-device batches)
    # auto -> bf16 where the device computes it natively, else fp32; fp16 on a CPU is refused (Accelerate would
    # silently train in fp32). The device is the one the Accelerator below will use (same process-wide state).
    device_type = PartialState(cpu=config.cpu).device.type
    mixed_precision = resolve_mixed_precision(config.mixed_precision, device_type)
    accelerator = Accelerator(
        cpu=config.cpu,
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        log_with=log_with or None,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    is_main = accelerator.is_main_process
    if config.loss == "infonce" and config.weince != WeinceConfig():
        changed = [name for name, value in config.weince.to_dict().items() if value != getattr(WeinceConfig(), name)]
        not_applied["weince"] = f"loss=infonce: the WEINCE settings {', '.join(changed)} have no effect"
        logger.warning("%s", not_applied["weince"])
    checkpoint = prepare_output_dir(output_dir, resume, overwrite, is_main)
    accelerator.wait_for_everyone()
    set_seed(config.seed)  # before the model: the MLP head's initialisation depends on it

    train_file = resolve_train_file(config)
    data_dir = resolve_data_dir(config.data_dir)
    if config.eval_steps or config.eval_before_training or config.final_evaluation:
        _check_evaluation_data(data_dir)
    sentences, skipped = load_sentences(train_file, config.max_train_samples)
    if skipped and is_main:
        print(f"skipped {skipped} empty lines in {train_file}", file=sys.stderr)
    model = SimCSEModel.from_pretrained(
        config.model, pooler=config.pooler, max_seq_length=config.eval_max_length, dropout=config.dropout
    )
    positions = getattr(model.encoder.config, "max_position_embeddings", None)
    for name in ("max_length", "eval_max_length"):
        if positions and getattr(config, name) and getattr(config, name) > positions:
            raise ValueError(
                f"{name} {getattr(config, name)} exceeds the {positions} positions of {config.model}; "
                f"set --{name.replace('_', '-')} {positions} or less"
            )
    tokenized = tokenize(sentences, model.tokenizer, config.max_length)

    batches_per_epoch = len(tokenized) // config.batch_size
    if batches_per_epoch == 0:
        raise ValueError(
            f"the training data hold {len(tokenized)} sentences, fewer than one batch of {config.batch_size}"
        )
    steps_per_epoch = batches_per_epoch // config.gradient_accumulation_steps
    total_steps = config.max_steps or config.num_epochs * steps_per_epoch
    if total_steps < 1:
        raise ValueError(
            f"{len(tokenized)} sentences make {batches_per_epoch} batches of {config.batch_size}: not one update "
            f"with gradient_accumulation_steps={config.gradient_accumulation_steps}"
        )
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not _no_decay(n)]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and _no_decay(n)]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:  # the fused kernel (one pass over all tensors) is what the HF Trainer uses by default
        optimizer = torch.optim.AdamW(groups, lr=config.learning_rate, fused=True)
    except (RuntimeError, ValueError):
        optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    scheduler = get_scheduler(config.lr_scheduler, optimizer, config.warmup_steps, total_steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    unwrapped = accelerator.unwrap_model(model)
    objective = ContrastiveObjective(config.loss, config.temperature, config.weince)

    # --- resume: weights, optimizer, scheduler, RNG (Accelerate) + step, history, best (ours) ---------------
    state = {
        "step": 0,
        "best_step": None,
        "best_stsb_dev_spearman": None,
        "base_stsb_dev_spearman": None,
        "history": [],
        "evaluations": [],
        "train_seconds": 0.0,
        "wall_seconds": 0.0,
    }
    if checkpoint is not None:
        state = read_trainer_state(checkpoint)
        try:
            accelerator.load_state(str(checkpoint))
        except Exception as error:
            raise RuntimeError(
                f"--resume: cannot load checkpoint {checkpoint} ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:300]}); resume with the settings it was saved with"
            ) from error
        accelerator.print(f"resumed from {checkpoint} at step {state['step']} of {total_steps}")
    if is_main:  # every input has loaded: only now is the output folder touched (a failed start leaves no trace)
        previous = claim_output_dir(output_dir, resume)
        if previous is not None:
            claimed.append(output_dir)
        save_config(config, output_dir / CONFIG_FILE)
    accelerator.wait_for_everyone()
    start_step = state["step"]
    previous_wall = state["wall_seconds"]

    accum = config.gradient_accumulation_steps
    sampler = StepBatchSampler(
        len(tokenized),
        config.batch_size,
        config.seed,
        start_step * accum,
        total_steps * accum,
        accelerator.process_index,
        accelerator.num_processes,
    )
    # A private generator: creating the loader must not draw from the global RNG (dropout masks after a
    # resume would differ from an uninterrupted run).
    loader = torch.utils.data.DataLoader(
        tokenized,
        batch_sampler=sampler,
        collate_fn=PaddingCollator(unwrapped.tokenizer.pad_token_id),
        num_workers=config.num_workers,
        generator=torch.Generator(),
    )

    if csv_tracker is not None:
        csv_tracker.start_step = start_step
    if log_with:
        _init_trackers(accelerator, config)

    best_dir = output_dir / CHECKPOINTS / "best"

    def evaluate_dev() -> float | None:
        """STS-B dev Spearman of the current weights (main process; evaluation pooler, no dropout)."""
        from simcse_weince.evaluation import stsb_spearman

        score = None
        if is_main:

            def encoder(texts):
                with _evaluation_autocast(config, accelerator.device):
                    return unwrapped.encode(texts, batch_size=config.eval_batch_size)

            score = float(stsb_spearman(encoder, split="dev", data_dir=data_dir))
        accelerator.wait_for_everyone()
        return score

    if config.eval_before_training and start_step == 0:
        state["base_stsb_dev_spearman"] = evaluate_dev()
        accelerator.print(f"STS-B dev Spearman before training: {_fmt(state['base_stsb_dev_spearman'])}")

    # --- the loop -----------------------------------------------------------------------------------------
    accelerator.print(
        f"training {config.model} with {config.loss} on {len(tokenized):,} sentences from {train_file}: "
        f"{total_steps} steps of {config.batch_size} x {accum} on {accelerator.num_processes} process(es), "
        f"{accelerator.device}, {precision_label(mixed_precision)}"
        + (f" (mixed precision {config.mixed_precision})" if config.mixed_precision == "auto" else "")
        + (f", encoded {config.mini_batch_size} at a time (GradCache)" if config.mini_batch_size else "")
    )
    progress = tqdm(total=total_steps, initial=start_step, disable=not is_main, desc="training", dynamic_ncols=True)
    micro_batches = iter(loader)
    model.train()
    interrupted, session_seconds = False, 0.0
    with InterruptFlag() as interrupt:
        for step in range(start_step, total_steps):
            step_start = time.perf_counter()
            step_losses, step_diagnostics = [], []
            for _ in range(accum):
                batch = {name: value.to(accelerator.device) for name, value in next(micro_batches).items()}
                with accelerator.accumulate(model):
                    loss, diagnostics = forward_backward(
                        model, batch, objective, accelerator, config.mini_batch_size, config.length_chunks
                    )
                    if accelerator.sync_gradients and config.max_grad_norm:
                        accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                step_losses.append(loss.detach())
                step_diagnostics.append(diagnostics)

            # one device synchronisation per step for everything we log
            names = list(step_diagnostics[0])
            values = torch.stack(
                [torch.stack(step_losses).float().mean()]
                + [torch.stack([d[name] for d in step_diagnostics]).float().mean() for name in names]
            ).tolist()
            session_seconds += time.perf_counter() - step_start
            state["train_seconds"] += time.perf_counter() - step_start
            state["step"] = step + 1
            entry = {
                "step": step + 1,
                "loss": values[0],
                "learning_rate": scheduler.get_last_lr()[0],
                **dict(zip(names, values[1:])),
                "train_seconds": state["train_seconds"],
            }
            if not math.isfinite(entry["loss"]):
                raise RuntimeError(
                    f"the loss is {entry['loss']} at step {step + 1}; lower the learning rate or use bf16 / no "
                    f"mixed precision (the last checkpoint is in {output_dir / CHECKPOINTS})"
                )
            state["history"].append(entry)
            sentences_per_second = (step + 1 - start_step) * config.batch_size * accum / session_seconds
            progress.update(1)
            progress.set_postfix(_postfix(entry, sentences_per_second, mixed_precision), refresh=False)
            if (step + 1) % config.logging_steps == 0:
                accelerator.log({k: v for k, v in entry.items() if k not in ("step", "train_seconds")}, step=step + 1)

            if config.eval_steps and ((step + 1) % config.eval_steps == 0 or step + 1 == total_steps):
                score = evaluate_dev()
                if is_main:
                    state["evaluations"].append({"step": step + 1, "stsb_dev_spearman": score})
                    accelerator.log({"stsb_dev_spearman": score}, step=step + 1)
                    improved = state["best_stsb_dev_spearman"] is None or score > state["best_stsb_dev_spearman"]
                    if improved:
                        state["best_stsb_dev_spearman"], state["best_step"] = score, step + 1
                        _save_weights(unwrapped.encoder, best_dir)
                    progress.write(
                        f"step {step + 1}: STS-B dev Spearman {score:.2f} (best {state['best_stsb_dev_spearman']:.2f}"
                        f" at step {state['best_step']})"
                    )
                accelerator.wait_for_everyone()

            stop = interrupt.raised
            if accelerator.num_processes > 1:  # every process must stop at the same step
                stop = bool(accelerator.reduce(torch.tensor(float(stop), device=accelerator.device), "sum") > 0)
            due = config.save_steps and (step + 1) % config.save_steps == 0 and step + 1 < total_steps
            if due or stop:
                state["wall_seconds"] = previous_wall + time.perf_counter() - wall_start
                path = save_checkpoint(accelerator, output_dir, state, config.save_total_limit)
                if stop:
                    progress.close()
                    if is_main:
                        print(f"interrupted: checkpoint saved to {path}; continue with --resume", file=sys.stderr)
                    interrupted = True
                    break
    progress.close()
    if interrupted:
        accelerator.end_training()
        raise KeyboardInterrupt

    # --- export the best step as a SentenceTransformer, evaluate it, write results and the model card ------
    results = {}
    applied_config = config.to_dict()
    if "report_to" in not_applied:
        applied_config["report_to"] = [name for name in config.report_to if name != "tensorboard"]
    if is_main:
        if state["best_step"] is not None and (best_dir / "model.safetensors").is_file():
            _load_weights(unwrapped.encoder, best_dir)
        unwrapped.save_sentence_transformer(output_dir)
        results = {"stsb_dev_spearman": None, "stsb_test_spearman": None}
        if config.final_evaluation:
            results = _final_evaluation(output_dir, config, data_dir, accelerator.device)
        train_seconds = state["train_seconds"]
        results.update(
            {
                "best_step": state["best_step"] or total_steps,
                "best_stsb_dev_spearman_during_training": state["best_stsb_dev_spearman"],
                "base_stsb_dev_spearman": state["base_stsb_dev_spearman"],
                "total_steps": total_steps,
                "resumed_from_step": start_step or None,
                "num_train_sentences": len(tokenized),
                "embedding_dimension": unwrapped.encoder.config.hidden_size,
                "skipped_empty_lines": skipped,
                "train_file": str(train_file),
                "num_processes": accelerator.num_processes,
                "device": str(accelerator.device),
                "mixed_precision": mixed_precision,  # the precision used (config.mixed_precision may say auto)
                "wall_time_seconds": previous_wall + time.perf_counter() - wall_start,
                "train_time_seconds": train_seconds,
                "train_sentences_per_second": total_steps * config.batch_size * accum / max(train_seconds, 1e-9),
                "lambda_stats": _summarize_lambda(state["history"]),
                "config": applied_config,
                "not_applied": not_applied,
                "evaluations": state["evaluations"],
                "history": state["history"],
                "versions": _versions(),
            }
        )
        (output_dir / "results.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
        from simcse_weince.model_card import write_model_card

        write_model_card(output_dir, results)
        release_previous_run(output_dir)  # a run that saved no checkpoint has started once it is exported
        print(_summary(results, output_dir))
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results


# ------------------------------------------------------------------------------------------------ helpers


def _no_decay(name: str) -> bool:
    return name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name


def _check_evaluation_data(data_dir: Path) -> None:
    """Fail before training, not at the first evaluation, when STS-B is missing and cannot be downloaded."""
    if not (data_dir / "stsbenchmark").is_dir() and hub_is_offline():
        raise FileNotFoundError(
            f"STS-B is not in {data_dir / 'stsbenchmark'} and the Hub is offline; set --data-dir or "
            f"$SIMCSE_WEINCE_DATA_DIR to the folder holding the evaluation data"
        )


def _init_trackers(accelerator, config: TrainConfig) -> None:
    # TensorBoard's hparams accept only scalars and strings
    flat = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            flat.update(
                {f"{key}.{k}": v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in value.items()}
            )
        else:
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    accelerator.init_trackers("simcse-weince", config=flat)


def _save_weights(module: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import save_model

    folder.mkdir(parents=True, exist_ok=True)
    save_model(module, str(folder / "model.safetensors.tmp"))
    os.replace(folder / "model.safetensors.tmp", folder / "model.safetensors")


def _load_weights(module: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import load_model

    load_model(module, str(folder / "model.safetensors"), device=str(next(module.parameters()).device))


def _final_evaluation(output_dir: Path, config: TrainConfig, data_dir: Path, device) -> dict:
    """Scores of the exported folder itself, so ``SentenceTransformer(output_dir)`` reproduces them."""
    from sentence_transformers import SentenceTransformer

    from simcse_weince.evaluation import evaluate_sts, format_sts_table, stsb_spearman

    model = SentenceTransformer(str(output_dir), device=str(device))
    # The evaluation package's default encoding options: what a user gets from the same call on the folder.
    # STS-B dev/test: the original (raw text) benchmark, sentence-transformers' protocol.
    with _evaluation_autocast(config, device):
        results = {
            "stsb_dev_spearman": float(stsb_spearman(model, split="dev", data_dir=data_dir)),
            "stsb_test_spearman": float(stsb_spearman(model, split="test", data_dir=data_dir)),
        }
        if config.final_tasks:  # SimCSE's table: SentEval's tokenised, lower-cased copies (its STS-B column differs)
            table = evaluate_sts(model, tasks=config.final_tasks, split="test", data_dir=data_dir)
            results["sts_test"] = {key: value for key, value in table.items() if key != "details"}
            results["sts_table"] = format_sts_table(table)
    results["evaluation_precision"] = "bf16" if config.eval_bf16 else "fp32"
    return results


def _evaluation_autocast(config: TrainConfig, device):
    """bf16 autocast for evaluation when ``eval_bf16`` asks for it; otherwise fp32 (no autocast at all, even
    inside a bf16 training run)."""
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=config.eval_bf16)


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _postfix(entry: dict, sentences_per_second: float, mixed_precision: str = "no") -> dict:
    postfix = {"loss": f"{entry['loss']:.4f}"}
    if "lambda_mean" in entry:
        postfix.update(
            {
                "λ": f"{entry['lambda_mean']:.3f}",
                "λ>.5": f"{entry['lambda_above_half']:.2f}",
                "ρ0": f"{entry['rho0']:.3f}",
                "ΔAIC": f"{entry['delta_aic_mean']:.1f}",
                "β̂": f"{entry['beta_hat_mean']:.2f}",
            }
        )
    postfix["sent/s"] = f"{sentences_per_second:.1f}"
    postfix["precision"] = precision_label(mixed_precision)
    return postfix


def _summary(results: dict, output_dir: Path) -> str:
    lines = [
        (
            f"STS-B dev Spearman: {_fmt(results['stsb_dev_spearman'])}   STS-B test Spearman: "
            f"{_fmt(results['stsb_test_spearman'])}   (best step {results['best_step']} of {results['total_steps']})"
        )
    ]
    if results.get("sts_table"):
        lines.append(results["sts_table"])
    lines.append(
        f"wall time {results['wall_time_seconds']:.0f} s, training {results['train_sentences_per_second']:.1f} "
        f"sentences/s; model, results.json and README.md in {output_dir}"
    )
    return "\n".join(lines)


def _versions() -> dict:
    import accelerate
    import sentence_transformers
    import transformers

    from simcse_weince import __version__

    return {
        "simcse_weince": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "accelerate": accelerate.__version__,
    }
