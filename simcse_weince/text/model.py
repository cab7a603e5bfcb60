"""The SimCSE encoder: a raw Hugging Face transformer, SimCSE's poolers, and export to a SentenceTransformer.

Unsupervised SimCSE (Gao et al., 2021) encodes every sentence twice; the two dropout masks make the two views
of a positive pair. During training the ``cls`` pooler puts an MLP (dense + tanh) on top of the [CLS] vector;
at evaluation the MLP is dropped (``cls_before_pooler``), SimCSE's choice for its unsupervised models
(``--mlp_only_train``); its supervised models keep it (``mlp_only_train=False``), and so does the export.
``avg`` (mean over tokens) uses no MLP.

Example::

    model = SimCSEModel.from_pretrained("bert-base-uncased", pooler="cls")
    batch = model.tokenizer(["a sentence", "another one"], padding=True, return_tensors="pt")
    first_view, second_view = model(**batch, num_views=2)  # one forward over the doubled batch
    model.save_sentence_transformer("out")  # SentenceTransformer("out") encodes with the evaluation pooler

Reference: T. Gao, X. Yao, D. Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings", EMNLP 2021
(https://github.com/princeton-nlp/SimCSE, ``simcse/models.py``).
"""

from __future__ import annotations

import logging
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from simcse_weince.encoder_checks import (
    MissingTokenizerPackage,
    check_tokenizer,
    embedding_rows,
    naming_missing_tokenizer_package,
)
from simcse_weince.evaluation.encoders import length_sorted_batches
from simcse_weince.paths import hub_is_offline, looks_like_local_path, resolve_model_path
from simcse_weince.poolers import EXPORT_POOLER, SENTENCE_TRANSFORMERS_POOLING, TRAINING_POOLERS
from simcse_weince.records import check_count, read_json
from simcse_weince.safe_load import RefusedPickle, refusing_pickles

logger = logging.getLogger(__name__)

#: dropouts of task heads (classification, question answering, summary, pooler) that an encoder does not run
HEAD_DROPOUT_PREFIXES = ("classifier", "qa_", "seq_classif", "summary", "pooler")
#: two views whose embeddings differ by less than this (relative to their size) are the same view; dropout 0.1
#: makes them differ by several percent
SAME_VIEWS_TOLERANCE = 1e-4
#: the sentences of the start-up views check
VIEWS_CHECK_ROWS = 4


def dropout_settings(config) -> dict[str, float]:
    """The dropout probabilities an encoder's configuration holds, by field: every number field named ``*dropout*``
    (BERT's, RoBERTa's ``hidden_dropout_prob`` and ``attention_probs_dropout_prob``, DistilBERT's ``dropout`` and
    ``attention_dropout``, ModernBERT's ``embedding_dropout``, ``mlp_dropout``, ``attention_dropout``, T5's
    ``dropout_rate``, ...), except task heads' (:data:`HEAD_DROPOUT_PREFIXES`)."""
    return {
        name: value
        for name, value in config.to_dict().items()
        if "dropout" in name
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not name.startswith(HEAD_DROPOUT_PREFIXES)
    }


def set_dropout(config, dropout: float | None, model: str = "the model") -> list[str]:
    """Set every dropout of ``config`` (:func:`dropout_settings`) to ``dropout`` and log which; None changes nothing.
    A configuration without any is refused (ValueError): a dropout that is never applied must not be recorded."""
    if dropout is None:
        return []
    settings = dropout_settings(config)
    if not settings:
        raise ValueError(
            f"dropout cannot be set on {model!r}: {type(config).__name__} has no dropout setting; leave --dropout unset"
        )
    for name in settings:
        setattr(config, name, dropout)
    logger.info(
        "--dropout %s set %s of %s (were %s)", dropout, ", ".join(settings), type(config).__name__,
        ", ".join(f"{value:g}" for value in settings.values()),
    )  # fmt: skip
    return list(settings)


@contextmanager
def untouched_rng(device: torch.device):
    """Draws inside leave the random streams of the CPU and of ``device`` where they were (the dropout masks of
    training, and of a resumed run, do not move)."""
    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            yield
        return
    module = getattr(torch, device.type)
    index = device.index if device.index is not None else module.current_device()
    with torch.random.fork_rng(devices=[index], device_type=device.type):
        yield


def check_views_differ(model: SimCSEModel, batch: dict, name: str) -> None:
    """Refuse (ValueError, one line) an encoder whose two training-mode views of ``batch`` are the same: unsupervised
    SimCSE would learn nothing (its positive is the sentence itself). The line names the model's dropout settings
    and how to set them. One forward without gradients; the random streams are left as they were."""
    device = next(model.parameters()).device
    was_training = model.training
    model.train()
    try:
        with untouched_rng(device), torch.no_grad():
            first, second = model(**{key: value.to(device) for key, value in batch.items()}, num_views=2)
    finally:
        model.train(was_training)
    first, second = first.float(), second.float()
    difference = float((first - second).norm() / first.norm().clamp_min(torch.finfo(torch.float32).tiny))
    if difference > SAME_VIEWS_TOLERANCE:
        return
    config = model.encoder.config
    settings = dropout_settings(config)
    if settings:
        described = ", ".join(f"{field}={value:g}" for field, value in settings.items())
        advice = (
            f"its dropout settings ({type(config).__name__}) are {described}; set them with --dropout 0.1, or train "
            "on pairs (a .csv with sent0,sent1)"
        )
    else:
        advice = f"{type(config).__name__} has no dropout setting; train on pairs (a .csv with sent0,sent1) instead"
    raise ValueError(
        f"unsupervised SimCSE needs two different views of each sentence, but two training-mode forward passes of "
        f"{name!r} give the same embeddings: {advice}"
    )


def default_max_seq_length(model_path: str, tokenizer) -> int:
    """The evaluation length: the base SentenceTransformer's ``max_seq_length`` if it has one, else <= 512."""
    st_config = Path(model_path) / "sentence_bert_config.json"
    if st_config.is_file():
        settings = read_json(st_config, "sentence-transformers config")  # a key given twice is refused
        value = settings.get("max_seq_length") if isinstance(settings, dict) else None
        if value is not None:
            return check_count(value, "max_seq_length", st_config, minimum=1)
    return int(min(tokenizer.model_max_length, 512))


def encode_columns(model, batch: dict, num_columns: int = 1) -> tuple:
    """The embeddings of a collated batch, one tensor per column, from one forward pass.

    One column is unsupervised SimCSE: every sentence twice, the two dropout masks make the positive pair. Pairs
    and triplets are stacked column by column (:class:`~simcse_weince.text.data.PaddingCollator`) and encoded
    together, as SimCSE encodes ``sent0``, ``sent1`` and ``hard_neg`` (dropout stays on for all of them)."""
    if num_columns == 1:
        return model(**batch, num_views=2)  # two dropout masks
    return model(**batch).chunk(num_columns)


def trim_trailing_padding(inputs: dict) -> dict:
    """``inputs`` without the trailing columns that no row attends to (the padding a slice of a batch no longer
    needs). Leading padding is kept: it carries positions."""
    attended = inputs["attention_mask"].any(dim=0).nonzero()
    width = int(attended.max()) + 1 if len(attended) else 1
    return {name: value[:, :width] for name, value in inputs.items()}


class SimCSEModel(nn.Module):
    """A Hugging Face encoder with a SimCSE pooler (and, for ``cls``, the training-only MLP head).

    Args:
        encoder: a ``transformers`` base model (``AutoModel``), returning ``last_hidden_state``.
        tokenizer: its tokenizer.
        pooler: ``"cls"`` ([CLS] + MLP in training, [CLS] without MLP at evaluation), ``"cls_before_pooler"``
            or ``"avg"`` (mean over non-padding tokens).
        max_seq_length: the length sentences are truncated to at evaluation and in the exported model.
        mlp_only_train: with ``cls``, drop the MLP at evaluation and export (SimCSE's unsupervised recipe); False
            keeps it (its supervised recipe).
    """

    def __init__(
        self, encoder: nn.Module, tokenizer, pooler: str = "cls", max_seq_length: int = 512,
        mlp_only_train: bool = True,
    ):  # fmt: skip
        super().__init__()
        if pooler not in TRAINING_POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; expected one of {TRAINING_POOLERS}")
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_seq_length = max_seq_length
        self.mlp_only_train = mlp_only_train
        hidden_size = encoder.config.hidden_size
        self.mlp = None
        if pooler == "cls":
            self.mlp = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())
            # SimCSE initialises the head like BERT's own layers.
            std = getattr(encoder.config, "initializer_range", 0.02)
            nn.init.normal_(self.mlp[0].weight, std=std)
            nn.init.zeros_(self.mlp[0].bias)
        # BERT's own pooler (dense + tanh over [CLS], trained for NSP) is used by no SimCSE pooler. Freezing it
        # keeps it out of the optimizer and out of DDP's gradient reduction (which fails on unused parameters),
        # and it is exported unchanged, so loading the model prints no "newly initialised weights" warning.
        bert_pooler = getattr(encoder, "pooler", None)
        if isinstance(bert_pooler, nn.Module):
            bert_pooler.requires_grad_(False)
        # how training steps run the encoder (length chunks, unpadded layers, ...): a checked
        # simcse_weince.text.fast_path.TrainingForward set by the trainer; None is the encoder's own forward. A plain
        # attribute, not a module: the state dict (checkpoints, export) keeps the encoder's own keys
        self.training_forward = None

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        pooler: str = "cls",
        max_seq_length: int | None = None,
        dropout: float | None = None,
        mlp_only_train: bool = True,
    ) -> SimCSEModel:
        """Load encoder and tokenizer by hub id, local folder (a SentenceTransformer folder works) or
        ``bundled:all-MiniLM-L6-v2``. ``dropout`` overrides every dropout of the encoder (:func:`set_dropout`;
        SimCSE: 0.1). A tokenizer that does not fit the model is refused
        (:func:`~simcse_weince.encoder_checks.check_tokenizer`)."""
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        path = resolve_model_path(model)
        if looks_like_local_path(path) and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"model folder {path} not found; pass an existing folder or a Hub id (org/name)")
        if Path(path).expanduser().is_file():
            raise ValueError(f"model {path} is a file; pass the folder that holds config.json, or a Hub id")

        def loading_error(error: Exception) -> RuntimeError:
            hint = (
                " The Hugging Face Hub is offline (HF_HUB_OFFLINE=1): pass a local folder or a model in the cache."
                if hub_is_offline() and not Path(path).exists()
                else ""
            )
            return RuntimeError(f"cannot load the model {model!r}: {str(error).splitlines()[0]}{hint}")

        try:
            config = AutoConfig.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise loading_error(error) from error
        set_dropout(config, dropout, model)
        try:
            with refusing_pickles(path):
                encoder = AutoModel.from_pretrained(path, config=config)
            with naming_missing_tokenizer_package(model, path):
                tokenizer = AutoTokenizer.from_pretrained(path)
        except (RefusedPickle, MissingTokenizerPackage):
            raise
        except (OSError, ValueError) as error:
            raise loading_error(error) from error
        check_tokenizer(tokenizer, embedding_rows(encoder), model)
        if max_seq_length is None:
            max_seq_length = default_max_seq_length(path, tokenizer)
        return cls(encoder, tokenizer, pooler=pooler, max_seq_length=max_seq_length, mlp_only_train=mlp_only_train)

    @property
    def evaluation_pooler(self) -> str:
        """``cls`` (with the MLP) when a cls run keeps its MLP, else :data:`~simcse_weince.poolers.EXPORT_POOLER`'s."""
        return "cls" if self.pooler == "cls" and not self.mlp_only_train else EXPORT_POOLER[self.pooler]

    def evaluation_modules(self) -> nn.Module:
        """What evaluation uses: the encoder, and the MLP when it is kept (the best dev step saves these)."""
        return self.encoder if self.evaluation_pooler != "cls" else nn.ModuleDict({"encoder": self.encoder,
                                                                                   "mlp": self.mlp})  # fmt: skip

    def pool(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor, pooler: str) -> torch.Tensor:
        if pooler in ("cls", "cls_before_pooler"):
            pooled = last_hidden_state[:, 0]
        else:  # avg: mean over real tokens
            mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
            pooled = (last_hidden_state * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)
        if pooler == "cls":
            pooled = self.mlp(pooled)
        return pooled

    def forward(self, input_ids, attention_mask, token_type_ids=None, num_views: int = 1):
        """Sentence embeddings with the *training* pooler.

        With ``num_views=2`` the batch is repeated and encoded in ONE forward call (SimCSE's trick: dropout draws
        independent masks for the copies); returns a tuple of the views. In training mode the encoder runs through
        :attr:`training_forward` when one is set (:mod:`simcse_weince.text.fast_path`), else its own forward.
        """
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        if num_views > 1:
            inputs = {name: value.repeat(num_views, 1) for name, value in inputs.items()}
        if self.training and self.training_forward is not None:
            embeddings = self.training_forward(self.encoder, inputs, self.training_pool)
        else:
            embeddings = self.training_pool(self.encoder(**inputs).last_hidden_state, inputs["attention_mask"])
        return embeddings.chunk(num_views) if num_views > 1 else embeddings

    def training_pool(self, last_hidden_state: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`pool` with the training pooler."""
        return self.pool(last_hidden_state, attention_mask, self.pooler)

    @torch.no_grad()
    def encode(self, sentences: list[str], batch_size: int = 64, device=None) -> np.ndarray:
        """Evaluation embeddings (evaluation pooler, no dropout) as a float32 array, in input order.

        Sentences are batched by token count so that batches carry little padding.
        """

        was_training = self.training
        self.eval()
        device = device or next(self.parameters()).device
        batches = length_sorted_batches(sentences, batch_size, self.tokenizer, self.max_seq_length)
        embeddings = np.zeros((len(sentences), self.encoder.config.hidden_size), dtype=np.float32)
        try:
            for indices in batches:
                batch = self.tokenizer(
                    [sentences[i] for i in indices],
                    padding=True,
                    truncation=True,
                    max_length=self.max_seq_length,
                    return_tensors="pt",
                ).to(device)
                hidden = self.encoder(**batch).last_hidden_state
                pooled = self.pool(hidden, batch["attention_mask"], self.evaluation_pooler)
                embeddings[indices] = pooled.float().cpu().numpy()
        finally:
            self.train(was_training)
        return embeddings

    def save_sentence_transformer(self, output_dir: str | Path, create_model_card: bool = False) -> Path:
        """Write a SentenceTransformer folder: the encoder + a Pooling module set to the *evaluation* pooler.

        ``SentenceTransformer(output_dir)`` then reproduces :meth:`encode` (no normalisation: cosine similarity
        does not need it). A kept MLP is exported as a ``Dense`` module (tanh) after the ``cls`` pooling.
        """
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer

        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        # The Transformer module loads from a folder: stage the weights, then let sentence-transformers write
        # its own layout (modules.json, sentence_bert_config.json, 1_Pooling/) into output_dir.
        staging = output_dir / ".export-staging"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            self.encoder.save_pretrained(staging)
            self.tokenizer.save_pretrained(staging)
            transformer = Transformer(str(staging), max_seq_length=self.max_seq_length)
            pooling = Pooling(
                transformer.get_embedding_dimension(),
                pooling_mode=SENTENCE_TRANSFORMERS_POOLING[self.evaluation_pooler],
            )
            modules = [transformer, pooling]
            if self.evaluation_pooler == "cls":  # SimCSE's supervised models: [CLS] through the trained MLP
                linear = self.mlp[0]
                modules.append(Dense(linear.in_features, linear.out_features, activation_function=nn.Tanh(),
                                     init_weight=linear.weight.detach().float().cpu().clone(),
                                     init_bias=linear.bias.detach().float().cpu().clone()))  # fmt: skip
            model = SentenceTransformer(modules=modules, device="cpu")
            model.save(str(output_dir), create_model_card=create_model_card)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return output_dir
