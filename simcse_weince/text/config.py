"""The text trainer's settings: :class:`TrainConfig` and its presets. Importing this module does not import torch.

``preset("cpu-demo", loss="infonce")`` is the preset with keyword overrides; the same settings come from YAML /
JSON files and CLI flags through :mod:`simcse_weince.settings`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from simcse_weince.poolers import TRAINING_POOLERS
from simcse_weince.precision import MIXED_PRECISION, amx_tiles
from simcse_weince.settings import DIRECTIONS, HARDNESS_MODES, LOSSES, PARTITION_MODES, REPORT_TO, apply_overrides
from simcse_weince.validation import Domain, check_domains, check_field_types
from simcse_weince.weince.config import WeinceConfig

#: the transformers.get_scheduler names that work from (warmup, total steps) alone and step without a metric
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt")  # fmt: skip
STS_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")

#: the allowed values of TrainConfig's choice fields (named in the CLI help; checked by validate())
FIELD_CHOICES = {"loss": LOSSES, "pooler": TRAINING_POOLERS, "mixed_precision": MIXED_PRECISION,
                 "lr_scheduler": LR_SCHEDULERS, "final_tasks": STS_TASKS, "report_to": REPORT_TO,
                 "directions": DIRECTIONS, "partition_mode": PARTITION_MODES,
                 "hardness_mode": ("none", *HARDNESS_MODES)}  # fmt: skip
#: sentence-transformers' MultipleNegativesRankingLoss options at its defaults (the losses' defaults too)
CONTRASTIVE_DEFAULTS = {"directions": ("query_to_doc",), "partition_mode": "joint", "hardness_mode": None}


@dataclass
class SpeedConfig:
    """How training steps run the encoder: the fast path of :mod:`simcse_weince.text.fast_path`, which checks itself
    at start-up and falls back to the stock forward (a warning says why). None of these changes what a step
    computes beyond fp32 rounding, except ``length_chunks`` with dropout (each chunk draws its own masks).
    Set as ``speed: {length_chunks: 4}`` in a config file, ``--speed.length-chunks 4`` or ``--length-chunks 4``.
    Measurements: docs/performance.md."""

    # encode each batch in this many length-sorted chunks (less padding); 1: one forward; auto: 4, except 1 under
    # bf16 on a CPU with AMX or on a GPU (resolve_length_chunks)
    length_chunks: int | Literal["auto"] = "auto"
    # a BERT encoder trains with its linear layers, layer norms and GELU on the real tokens only (the same numbers
    # and dropout masks as the padded forward; fast_path/unpadded.py); other encoders use their own forward
    unpadded_layers: bool = True
    # fp32 steps of that unpadded forward run the linear layers through oneDNN instead of MKL's sgemm (the same
    # products summed in another order; fast_path/onednn_linear.py); auto: on AMD CPUs, where it was measured faster
    onednn_linear: bool | Literal["auto"] = "auto"
    # torch.compile the encoder's training forward (inductor, dynamic shapes), as the HF Trainer's torch_compile;
    # off by default: slower on the CPUs measured (docs/performance.md); replaces unpadded_layers
    compile: bool = False

    def __post_init__(self) -> None:

        check_field_types(self)
        check_domains(self, {"length_chunks": Domain(1, why="or auto")})


#: the domain of each numeric setting of TrainConfig (None, where a field allows it, is not a number: always allowed)
FIELD_DOMAINS = {
    "dropout": Domain(0, 1, high_closed=False, why="a probability of dropping a unit; None keeps the model's"),
    "max_train_samples": Domain(1, why="or None: every sentence"),
    "max_length": Domain(1, why="tokens per sentence"),
    "temperature": Domain(0, low_closed=False),
    "hardness_strength": Domain(0, why="0: no weighting"),
    "batch_size": Domain(2, why="each sentence needs at least one in-batch negative"),
    "mini_batch_size": Domain(1, why="or None: no GradCache"),
    "gradient_accumulation_steps": Domain(1),
    "learning_rate": Domain(0, low_closed=False),
    "warmup_steps": Domain(0),
    "weight_decay": Domain(0),
    "max_grad_norm": Domain(0, low_closed=False, why="or None: no clipping"),
    "num_epochs": Domain(1),
    "max_steps": Domain(1, why="or None for num_epochs"),
    "seed": Domain(0, 2**32, high_closed=False, shown="an integer in [0, 2**32)"),  # what numpy's RNG accepts
    "eval_steps": Domain(0, why="0: no evaluation during training"),
    "eval_batch_size": Domain(1),
    "eval_max_length": Domain(1, why="or None: the model's"),
    "save_total_limit": Domain(1, why="the step checkpoints kept; --save-steps 0 saves none"),
    "save_steps": Domain(0, why="0: no checkpoints"),
    "logging_steps": Domain(1),
    "num_workers": Domain(0),
}


@dataclass
class TrainConfig:
    """Everything a run depends on. The defaults are SimCSE's unsupervised BERT-base recipe (preset ``paper``).

    Batch semantics: ``batch_size`` sentences form one contrastive batch (each sentence's negatives are the
    other ``batch_size - 1``), whatever the number of processes: each process encodes ``batch_size /
    num_processes`` of them and the embeddings are gathered. Gradient accumulation sums the gradients of
    ``gradient_accumulation_steps`` such batches (negatives stay within a batch). ``mini_batch_size`` bounds
    memory without losing negatives: each process encodes its share ``mini_batch_size`` sentences at a time
    (GradCache, see :mod:`simcse_weince.text.gradcache`), with the same loss and gradients.
    """

    # model
    model: str = "bert-base-uncased"  # hub id, local folder, or bundled:all-MiniLM-L6-v2
    pooler: str = "cls"  # cls ([CLS] + MLP head in training), cls_before_pooler, avg
    # SimCSE's --mlp_only_train: drop the cls MLP at evaluation and export. None: as SimCSE's recipes do, True
    # for one column (unsupervised), False for pairs and triplets (supervised keeps the MLP)
    mlp_only_train: bool | None = None
    dropout: float | None = None  # hidden and attention dropout; None keeps the model's (0.1 for BERT)
    # data
    # a path, or a file name inside the data directory: one sentence a line, or a .csv/.tsv/.jsonl table with a
    # header sent0,sent1[,hard_neg] (or anchor,positive[,negative]): pairs and triplets, supervised SimCSE
    train_file: str = "wiki1m_for_simcse.txt"
    data_dir: str | None = None  # None: $SIMCSE_WEINCE_DATA_DIR, else ~/.cache/simcse_weince/data
    max_train_samples: int | None = None  # use only the first N sentences
    max_length: int = 32  # tokens per training sentence
    # loss
    loss: str = "weince"  # weince | infonce
    temperature: float = 0.05
    weince: WeinceConfig = field(default_factory=WeinceConfig)
    hardness_strength: float = 0.0  # LLaVE's weighting of hard in-batch negatives (ST's MNRL); with weince: ours
    # sentence-transformers' MultipleNegativesRankingLoss options (docs/training.md; one column: the two dropout
    # views are query and doc). directions: query_to_doc plus any of doc_to_query, query_to_query, doc_to_doc
    directions: tuple[str, ...] = ("query_to_doc",)
    partition_mode: str = "joint"  # joint: one softmax over every direction's candidates; per_direction: one each
    # which negatives hardness_strength weighs: in_batch_negatives (LLaVE's), hard_negatives (the explicit negative
    # columns), all_negatives; None ("none", the default, as MultipleNegativesRankingLoss's and the losses'): no
    # weighting, whatever hardness_strength says. Recorded runs without this key: read_recorded
    hardness_mode: str | None = None
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
    speed: SpeedConfig = field(default_factory=lambda: SpeedConfig())  # how a step runs the encoder (same numbers)
    cpu: bool = False  # force the CPU even when an accelerator is present
    seed: int = 42
    # evaluation (STS-B dev every eval_steps, the best step is kept; then STS-B test and the 7-task table)
    eval_steps: int = 125  # 0: no evaluation during training (the last step is exported)
    eval_before_training: bool = False  # also score the untrained model (reported, never selected)
    eval_batch_size: int = 128
    eval_max_length: int | None = None  # None: the base model's max_seq_length (<= 512)
    # evaluate under bf16 autocast: auto where the run trains in bf16 on a CPU (resolve_eval_bf16: the scores
    # barely move, a CPU run's evaluation time drops; why: docs/performance.md#comment-numbers), False: fp32,
    # SentEval's digits exactly
    eval_bf16: bool | Literal["auto"] = "auto"
    final_tasks: tuple[str, ...] = STS_TASKS  # test-split table after training; () or none for STS-B only
    final_evaluation: bool = True  # False: no scores at the end (benchmarks, quick experiments)
    # checkpoints and logging
    save_steps: int = 250  # 0: no checkpoints (Ctrl-C still saves one)
    save_total_limit: int = 1  # step checkpoints kept, >= 1 (the best model is kept separately)
    logging_steps: int = 1
    report_to: tuple[str, ...] = ("csv", "tensorboard")
    num_workers: int = 0  # DataLoader workers: they tokenise the next batches while a step runs (worth it on a GPU)
    output_dir: str = "runs/simcse-weince"

    def __post_init__(self) -> None:
        if isinstance(self.weince, dict):
            self.weince = WeinceConfig(**self.weince)
        if isinstance(self.speed, dict):
            self.speed = SpeedConfig(**self.speed)
        for name in ("final_tasks", "report_to", "directions"):  # anything else: check_field_types names it
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        self.validate()

    def validate(self) -> None:

        check_field_types(self)  # batch_size="32" -> TypeError naming the field, not a failed comparison
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; expected one of {LOSSES}")
        if self.pooler not in TRAINING_POOLERS:
            raise ValueError(f"unknown pooler {self.pooler!r}; expected one of {TRAINING_POOLERS}")
        check_domains(self, FIELD_DOMAINS)
        if self.speed.compile and self.mini_batch_size:
            # GradCache replays each chunk's dropout masks from a saved RNG state; compiled random ops are not
            # tested to replay the same masks
            raise ValueError("compile is not supported with mini_batch_size (GradCache); use one or the other")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ValueError(f"unknown lr_scheduler {self.lr_scheduler!r}; expected one of {LR_SCHEDULERS}")
        for name in ("model", "train_file", "output_dir"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} is empty")
        if self.mixed_precision not in MIXED_PRECISION:
            choices = ", ".join(MIXED_PRECISION)
            raise ValueError(f"mixed_precision must be one of {choices}, got {self.mixed_precision!r}")
        unknown = [task for task in self.final_tasks if task not in STS_TASKS]
        if unknown:
            raise ValueError(f"unknown final_tasks {unknown}; choose among {STS_TASKS}")
        unknown = [name for name in self.report_to if name not in REPORT_TO]
        if unknown:
            raise ValueError(f"unknown report_to {unknown}; supported: csv, tensorboard")
        self.check_contrastive_options()

    @staticmethod
    def read_recorded(values: dict) -> dict:
        """Settings a run recorded (its training_config.yaml, a comparison cell's results.json), read as they meant
        when recorded: before ``hardness_mode`` existed, a ``hardness_strength`` weighed the in-batch negatives."""
        if "hardness_mode" not in values and values.get("hardness_strength"):
            return {**values, "hardness_mode": "in_batch_negatives"}
        return values

    def contrastive_options(self) -> dict:
        """``directions``, ``partition_mode`` and ``hardness_mode``, as the losses take them."""
        return {name: getattr(self, name) for name in CONTRASTIVE_DEFAULTS}

    def check_contrastive_options(self) -> None:
        """MultipleNegativesRankingLoss's rules for its options (losses/from_embeddings.py); the defaults are
        not checked there, so that building a config (``--help``) does not import torch."""
        if self.contrastive_options() == CONTRASTIVE_DEFAULTS:
            return
        from simcse_weince.losses.from_embeddings import check_contrastive_options  # torch

        self.directions, self.partition_mode, self.hardness_mode = check_contrastive_options(
            self.directions, self.partition_mode, self.hardness_mode, self.hardness_strength
        )

    def resolved_mlp_only_train(self, num_columns: int) -> bool:
        """Whether the cls MLP is dropped at evaluation, for a training file of ``num_columns`` columns."""
        return self.mlp_only_train if self.mlp_only_train is not None else num_columns == 1

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values["final_tasks"] = list(self.final_tasks)
        values["report_to"] = list(self.report_to)
        values["directions"] = list(self.directions)
        return values


#: ``length_chunks: auto``: 4 length-sorted chunks, except one padded forward under bf16/fp16 on CPUs with AMX
#: and on accelerators, where four smaller forwards do not pay
#: (the measurements: docs/performance.md#the-numbers-behind-the-codes-choices).
AUTO_LENGTH_CHUNKS = 4


def resolve_length_chunks(length_chunks: int | str, mixed_precision: str, device_type: str = "cpu") -> int:
    """The number of length-sorted chunks a run encodes each batch in (``mixed_precision``: the one used, on a
    device of ``device_type``); an explicit number is kept as it is."""
    if length_chunks != "auto":
        return int(length_chunks)
    if mixed_precision == "no":
        return AUTO_LENGTH_CHUNKS

    return AUTO_LENGTH_CHUNKS if device_type == "cpu" and not amx_tiles() else 1


#: presets are overrides of the defaults (which are SimCSE's paper recipe)
PRESETS: dict[str, dict] = {
    "paper": {},
    "cpu-demo": {
        "model": "bundled:all-MiniLM-L6-v2",
        "pooler": "avg",  # the model was trained with mean pooling
        "train_file": "wiki1m_head.txt",  # 11,914 sentences: one epoch is 186 steps of 64
        "eval_steps": 62,  # three checkpoints to choose from (their cost: docs/performance.md#comment-numbers)
        "eval_before_training": True,  # show where training started
        "save_steps": 62,
        "output_dir": "runs/cpu-demo",
    },
}
# The same data and model trained and evaluated SimCSE's way: [CLS] + MLP head in training, [CLS] without it at
# evaluation. MiniLM was trained with mean pooling, so its [CLS] vector starts lower and contrastive training has
# room to move it, which mean pooling (its loss near zero from step 1) has not (docs/performance.md#comment-numbers).
PRESETS["cpu-cls"] = {**PRESETS["cpu-demo"], "pooler": "cls", "output_dir": "runs/cpu-cls"}
# Supervised SimCSE (Gao et al., 2021; run_sup_example.sh): BERT-base on SNLI+MNLI triplets (sent0, sent1,
# hard_neg), 4 GPUs x 128 = 512 triplets a batch, lr 5e-5, 3 epochs, length 32, tau 0.05, STS-B dev every 125
# steps, [CLS] with the MLP kept at evaluation (no --mlp_only_train). Reported: STS average 81.57, STS-B test 84.25.
PRESETS["paper-sup"] = {
    "train_file": "nli_for_simcse.csv",
    "batch_size": 512,
    "learning_rate": 5e-5,
    "num_epochs": 3,
    "mlp_only_train": False,
    "output_dir": "runs/paper-sup",
}


def resolve_eval_bf16(eval_bf16: bool | str, mixed_precision: str, device_type: str = "cpu") -> bool:
    """Whether evaluation runs under bf16 autocast: ``eval_bf16`` itself, or for ``auto`` where the run trains in
    bf16 (so the device computes it natively) on a CPU. A GPU evaluates in fp32, where it costs little."""
    if eval_bf16 != "auto":
        return bool(eval_bf16)
    return mixed_precision == "bf16" and device_type == "cpu"


def preset(name: str = "paper", **overrides) -> TrainConfig:
    """The config of a preset (``paper``, ``cpu-demo``) with keyword overrides (``weince={"quantile": .3}`` too)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {tuple(PRESETS)}")
    return apply_overrides(TrainConfig(), {**PRESETS[name], **overrides})
