"""Encoders for STS evaluation: one callable ``list[str] -> embeddings`` from whatever the user has.

:func:`as_encoder` accepts

* a ``SentenceTransformer`` (its own modules and pooling; with ``pooler=`` its underlying Hugging Face model is
  pooled SimCSE's way instead),
* any callable ``list[str] -> torch.Tensor | np.ndarray``,
* a string: a SentenceTransformer folder/name, or — when ``pooler`` is given — a raw Hugging Face encoder
  loaded with ``AutoModel`` / ``AutoTokenizer``,
* a ``(model, tokenizer)`` pair of a Hugging Face encoder (pooler default ``"cls"``, SimCSE's default).

The raw-encoder path reproduces the ``batcher`` of SimCSE's ``evaluation.py``: the tokenizer pads each batch to
its longest sentence and does NOT truncate unless ``max_length`` is given; the poolers are SimCSE's
(:data:`POOLERS`). Batches are formed from length-sorted sentences (less padding; the order does not change any
score), run under ``torch.inference_mode`` with the model in eval mode (its previous mode is restored).

Example::

    from simcse_weince.evaluation import as_encoder

    encode = as_encoder("princeton-nlp/unsup-simcse-bert-base-uncased", pooler="cls_before_pooler")
    embeddings = encode(["a man is playing a guitar .", "a woman is slicing an onion ."])  # (2, 768)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from simcse_weince.encoder_checks import (
    check_max_length,
    check_sentence_transformer,
    check_tokenizer,
    check_truncated,
    embedding_rows,
    naming_missing_tokenizer_package,
)

# SimCSE's --pooler choices (evaluation.py), defined with the trainer's in one torch-free module
from simcse_weince.poolers import POOLERS
from simcse_weince.safe_load import refusing_pickles

Encoder = Callable[[list[str]], Any]


def default_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def length_sorted_batches(
    sentences: Sequence[str], batch_size: int, tokenizer=None, max_length: int | None = None
) -> list[list[int]]:
    """Indices of ``sentences`` in batches of similar length, longest first (so every batch pads to little more
    than its own sentences; the order changes no score).

    Lengths are token counts when a ``tokenizer`` is given (truncated at ``max_length`` as the encoding will be),
    characters otherwise. Token counts matter: character-sorted batches pad far more than token-sorted ones
    (docs/performance.md#the-numbers-behind-the-codes-choices).
    """
    if tokenizer is not None and len(sentences):
        ids = tokenizer(list(sentences), truncation=max_length is not None, max_length=max_length)["input_ids"]
        lengths = [len(row) for row in ids]
    else:
        lengths = [len(sentence) for sentence in sentences]
    order = sorted(range(len(sentences)), key=lambda index: -lengths[index])  # stable: ties keep input order
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


class HFEncoder:
    """A raw Hugging Face encoder pooled SimCSE's way.

    Args:
        model: a ``transformers`` encoder (e.g. ``BertModel``); hidden states are requested per call.
        tokenizer: its tokenizer.
        pooler: one of :data:`POOLERS`.
        batch_size: sentences per forward pass.
        max_length: truncate to this many tokens (``None``: no truncation, as SimCSE's SentEval evaluation).
        device: where to run (default: where the model already is; models loaded from a path by
            :func:`as_encoder` go to CUDA/MPS when available).
        show_progress_bar: a tqdm bar over batches.

    Calling it with ``list[str]`` returns a float32 CPU tensor ``(len(sentences), hidden)`` in input order.
    """

    def __init__(
        self,
        model,
        tokenizer,
        pooler: str = "cls",
        batch_size: int = 64,
        max_length: int | None = None,
        device: str | None = None,
        show_progress_bar: bool = True,
    ):
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; choose from {', '.join(POOLERS)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device or _device_of(model)
        self.show_progress_bar = show_progress_bar

    def __call__(self, sentences: list[str]):
        import torch
        from tqdm.auto import tqdm

        sentences = list(sentences)
        hidden = self.model.config.hidden_size
        embeddings = torch.zeros(len(sentences), hidden, dtype=torch.float32)
        was_training = self.model.training
        self.model.to(self.device)
        self.model.eval()
        limit = getattr(self.model.config, "max_position_embeddings", None)
        try:
            batches = length_sorted_batches(sentences, self.batch_size, self.tokenizer, self.max_length)
            with torch.inference_mode():
                for indices in tqdm(batches, desc="Encoding", disable=not self.show_progress_bar, leave=False):
                    batch = self.tokenizer(
                        [sentences[index] for index in indices],
                        padding=True,
                        truncation=self.max_length is not None,
                        max_length=self.max_length,
                        return_tensors="pt",
                    )
                    if self.max_length is not None:
                        check_truncated(batch["input_ids"], self.max_length)
                    # longest first: only the first batch can be too long, so this fails before any real work
                    if self.max_length is None and limit and batch["input_ids"].shape[1] > limit:
                        raise ValueError(
                            f"a sentence has {batch['input_ids'].shape[1]} tokens, more than the model's "
                            f"{limit} positions; pass max_length to truncate"
                        )
                    batch = {key: value.to(self.device) for key, value in batch.items()}
                    pooled = self._pool(batch)
                    embeddings[indices] = pooled.float().cpu()
        finally:
            self.model.train(was_training)
        return embeddings

    def _pool(self, batch):
        outputs = self.model(**batch, output_hidden_states=True, return_dict=True)
        mask = batch["attention_mask"].unsqueeze(-1).to(outputs.last_hidden_state.dtype)
        if self.pooler == "cls":
            if getattr(outputs, "pooler_output", None) is None:
                raise ValueError("pooler='cls' needs a model with a pooler layer; use 'cls_before_pooler'")
            return outputs.pooler_output
        if self.pooler == "cls_before_pooler":
            return outputs.last_hidden_state[:, 0]
        if self.pooler == "avg":
            layer = outputs.last_hidden_state
        elif self.pooler == "avg_first_last":
            layer = (outputs.hidden_states[1] + outputs.hidden_states[-1]) / 2.0
        else:  # avg_top2
            layer = (outputs.hidden_states[-1] + outputs.hidden_states[-2]) / 2.0
        # SimCSE: (h * mask).sum(1) / mask.sum(-1)
        return (layer * mask).sum(1) / mask.sum(1)


class SentenceTransformerEncoder:
    """``SentenceTransformer.encode`` as a callable returning a float32 CPU tensor (sorted batching built in)."""

    def __init__(
        self,
        model,
        batch_size: int = 64,
        max_length: int | None = None,
        device: str | None = None,
        show_progress_bar: bool = True,
    ):
        self.model = model
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device
        self.show_progress_bar = show_progress_bar

    def __call__(self, sentences: list[str]):
        import torch
        from tqdm.auto import tqdm

        sentences = list(sentences)
        previous_max_length = self.model.max_seq_length
        if self.max_length is not None:
            self.model.max_seq_length = self.max_length
        try:
            # Our own token-sorted batches: encode() sorts by characters, which leaves much padding on STS
            # (why: docs/performance.md#comment-numbers).
            batches = length_sorted_batches(
                sentences, self.batch_size, _tokenizer_of(self.model), self.model.max_seq_length
            )
            parts = [
                self.model.encode(
                    [sentences[index] for index in indices],
                    batch_size=len(indices),
                    show_progress_bar=False,
                    convert_to_tensor=True,
                    device=self.device,
                )
                .float()
                .cpu()
                for indices in tqdm(batches, desc="Encoding", disable=not self.show_progress_bar, leave=False)
            ]
        finally:
            if self.max_length is not None:
                self.model.max_seq_length = previous_max_length
        if not parts:
            return torch.zeros(0, self.model.get_embedding_dimension() or 0)
        order = torch.tensor([index for indices in batches for index in indices])
        # row order[i] of the input is row i of the batched embeddings
        return torch.cat(parts).index_select(0, torch.argsort(order))


def _tokenizer_of(model):
    """A SentenceTransformer's tokenizer for length sorting, or ``None`` (then sentences sort by characters)."""
    try:
        tokenizer = model.tokenizer
    except AttributeError:
        return None
    return tokenizer if callable(tokenizer) else None


def _device_of(model) -> str:
    parameter = next(iter(model.parameters()), None)
    return str(parameter.device) if parameter is not None else default_device()


def _is_sentence_transformer(model) -> bool:
    # No SentenceTransformer can exist unless its package was imported: skip the (slow) import for callables.
    package = sys.modules.get("sentence_transformers")
    return package is not None and isinstance(model, package.SentenceTransformer)


def _hf_parts_of(model):
    """(Hugging Face model, tokenizer) inside a SentenceTransformer's first (Transformer) module."""
    first = model[0]
    hf_model = getattr(first, "auto_model", None) or getattr(first, "model", None)
    tokenizer = getattr(first, "tokenizer", None)
    if hf_model is None or tokenizer is None:
        raise ValueError(
            f"cannot apply a SimCSE pooler to this SentenceTransformer: its first module "
            f"{type(first).__name__} has no Hugging Face model/tokenizer"
        )
    return hf_model, tokenizer


def as_encoder(
    model,
    pooler: str | None = None,
    batch_size: int = 64,
    max_length: int | None = None,
    device: str | None = None,
    show_progress_bar: bool = True,
) -> Encoder:
    """Turn ``model`` into a callable ``list[str] -> embeddings`` (see the module docstring for what it accepts).

    Args:
        model: SentenceTransformer, callable, path/name string, or ``(hf_model, tokenizer)`` pair.
        pooler: SimCSE pooler for raw Hugging Face encoders (:data:`POOLERS`); ``None`` keeps a
            SentenceTransformer's own pooling.
        batch_size, max_length, device, show_progress_bar: encoding options (ignored for plain callables).

    Raises:
        ValueError: unknown pooler or unsupported model type.
    """
    if pooler is not None and pooler not in POOLERS:
        raise ValueError(f"unknown pooler {pooler!r}; choose from {', '.join(POOLERS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be a positive integer (or None: no truncation), got {max_length!r}")
    options = dict(batch_size=batch_size, max_length=max_length, device=device, show_progress_bar=show_progress_bar)
    if isinstance(model, tuple):
        if len(model) != 2:
            raise ValueError("a model given as a tuple must be (hf_model, tokenizer)")
        hf_model, tokenizer = model
        return HFEncoder(hf_model, tokenizer, pooler=pooler or "cls", **options)
    if _is_sentence_transformer(model):
        if pooler is None:
            return SentenceTransformerEncoder(model, **options)
        hf_model, tokenizer = _hf_parts_of(model)
        return HFEncoder(hf_model, tokenizer, pooler=pooler, **options)
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        name = str(model)
        if pooler is None:
            from sentence_transformers import SentenceTransformer

            with refusing_pickles(name), naming_missing_tokenizer_package(name, name):
                st_model = SentenceTransformer(name, device=device)
            check_sentence_transformer(st_model, name, max_length)
            return SentenceTransformerEncoder(st_model, **options)
        from transformers import AutoModel, AutoTokenizer

        options["device"] = device or default_device()
        with refusing_pickles(name):
            hf_model = AutoModel.from_pretrained(name)
        with naming_missing_tokenizer_package(name, name):
            tokenizer = AutoTokenizer.from_pretrained(name)
        check_tokenizer(tokenizer, embedding_rows(hf_model), name)
        check_max_length(tokenizer, max_length, "max_length", name)
        return HFEncoder(hf_model, tokenizer, pooler=pooler, **options)
    if callable(model) and not _looks_like_hf_model(model):
        return model
    raise ValueError(
        f"cannot encode with a {type(model).__name__}: pass a SentenceTransformer, a callable list[str] -> "
        "embeddings, a model path/name, or a (hf_model, tokenizer) pair"
    )


def _looks_like_hf_model(model) -> bool:
    # A bare transformers model is callable but takes token ids, not strings: ask for its tokenizer instead.
    return hasattr(model, "config") and hasattr(model, "forward") and not hasattr(model, "encode")
