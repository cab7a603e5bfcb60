"""Checks of a loaded encoder's tokenizer, before it trains or is evaluated (torch-free).

A received model folder can load degraded without an error: transformers 5 builds a tokenizer from
``tokenizer_config.json`` alone when ``tokenizer.json`` is missing or unreadable, and that tokenizer knows five
tokens, so every word becomes ``[UNK]``. :func:`check_tokenizer` refuses a tokenizer whose vocabulary does not fit
the model's embedding matrix, or which reads ordinary text as nothing but unknown tokens, naming the file it came
from. :func:`check_max_length` refuses a length that leaves no room for text next to the special tokens, and
:func:`check_truncated` makes sure the tokenizer really truncated (transformers only warns, and keeps the whole
sentence, when ``max_length`` is below its special tokens).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from pathlib import Path

from simcse_weince.validation import not_a_regular_file

logger = logging.getLogger(__name__)

#: ordinary English text that any usable tokenizer of a text encoder reads as known tokens
PROBE_TEXT = "A man is playing a guitar on the street."
#: the files a Hugging Face tokenizer is built from, the complete one first
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model",
)  # fmt: skip


#: SentencePiece model files a tokenizer is built from when its folder has no tokenizer.json (XLM-R, T5 and ALBERT,
#: DeBERTa-v2, Llama 2); reading one takes the optional sentencepiece package
SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spiece.model", "spm.model", "tokenizer.model")


class MissingTokenizerPackage(ValueError):
    """A model folder's tokenizer needs an optional package that is not installed; the message names it."""


def missing_tokenizer_package(folder) -> str | None:
    """Why the tokenizer of the model folder ``folder`` cannot be read here, when that is an optional package that
    is not installed: it has no ``tokenizer.json``, a SentencePiece model file, and sentencepiece is missing (then
    transformers falls back to its tiktoken reader and names tiktoken instead). None otherwise."""
    folder = Path(str(folder)).expanduser()
    if not folder.is_dir() or (folder / TOKENIZER_FILES[0]).is_file():
        return None
    found = next((folder / name for name in SENTENCEPIECE_FILES if (folder / name).is_file()), None)
    if found is None or importlib.util.find_spec("sentencepiece") is not None:
        return None
    tiktoken = " (or, for a tiktoken file, pip install tiktoken)" if found.name == "tokenizer.model" else ""
    return (
        f"its tokenizer is the SentencePiece model {found} (the folder has no tokenizer.json), and reading it "
        f"needs the sentencepiece package, which is not installed: pip install sentencepiece{tiktoken}"
    )


@contextlib.contextmanager
def naming_missing_tokenizer_package(model: str, folder):
    """Around loading the tokenizer of a model folder: a failure caused by a missing optional package
    (:func:`missing_tokenizer_package`) becomes :class:`MissingTokenizerPackage` naming it and how to install it."""
    try:
        yield
    except (ImportError, ValueError, OSError) as error:
        missing = missing_tokenizer_package(folder)
        if missing is None:
            raise
        raise MissingTokenizerPackage(f"cannot load the model {model!r}: {missing}") from error


def tokenizer_source(tokenizer) -> str:
    """Where ``tokenizer`` was read from, for an error message: its ``tokenizer.json``, what is wrong with that file
    (missing, or a device, a folder, ...), or the Hub id it was loaded by."""
    origin = str(getattr(tokenizer, "name_or_path", "") or "")
    folder = Path(origin).expanduser()
    if not origin or not folder.is_dir():
        return f"the tokenizer of {origin!r}" if origin else "the tokenizer"
    main = folder / TOKENIZER_FILES[0]
    kind = not_a_regular_file(main)
    if kind is not None:
        link = f" (a link to {main.resolve()})" if main.is_symlink() else ""
        return f"{main} is {kind}{link}, not a regular file"
    if main.is_file():
        return str(main)
    present = [name for name in TOKENIZER_FILES[1:] if (folder / name).is_file()]
    if present:
        return f"{folder / present[0]} (the folder has no tokenizer.json)"
    return (
        f"{folder} has no tokenizer.json nor other vocabulary file: transformers built a {len(tokenizer)}-token "
        "tokenizer from tokenizer_config.json alone"
    )


def check_tokenizer(tokenizer, embedding_rows: int | None, model: str) -> None:
    """Refuse (ValueError, one line naming the file) a tokenizer that cannot serve the model ``model``: one with more
    tokens than the ``embedding_rows`` of its input embedding matrix (ids past the end), or one that maps
    :data:`PROBE_TEXT` to nothing but unknown tokens (a vocabulary that is not the model's)."""
    vocabulary = len(tokenizer)
    if embedding_rows is not None and vocabulary > embedding_rows:
        raise ValueError(
            f"cannot use the model {model!r}: its tokenizer ({tokenizer_source(tokenizer)}) has {vocabulary:,} tokens, "
            f"more than the {embedding_rows:,} rows of the model's embedding matrix; give the model folder the "
            "tokenizer it was trained with"
        )
    unknown = tokenizer.unk_token_id
    special = set(tokenizer.all_special_ids) - {unknown}
    ids = [token for token in tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"] if token not in special]
    if not ids or (unknown is not None and all(token == unknown for token in ids)):
        read_as = f"{len(ids)} x {tokenizer.unk_token}" if ids else "no token"
        raise ValueError(
            f"cannot use the model {model!r}: its tokenizer ({tokenizer_source(tokenizer)}) reads ordinary text as "
            f"nothing but unknown tokens ({PROBE_TEXT!r} -> {read_as}; {vocabulary:,} tokens in its vocabulary"
            + (f", {embedding_rows:,} rows in the model's embedding matrix" if embedding_rows else "")
            + "); give the model folder the tokenizer it was trained with"
        )


def embedding_rows(model) -> int | None:
    """The number of rows of a Hugging Face model's input embedding matrix, or None if it does not say."""
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except (AttributeError, NotImplementedError, TypeError):
        return None


def special_tokens_per_sentence(tokenizer) -> list[str]:
    """The special tokens the tokenizer adds to one sentence (BERT: ``[CLS]``, ``[SEP]``)."""
    ids = tokenizer("", add_special_tokens=True)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return tokenizer.convert_ids_to_tokens([token for token in ids if token in special])


def shortest_max_length(tokenizer) -> int:
    """The shortest length that keeps one token of text: the special tokens of a sentence, plus one."""
    return max(tokenizer.num_special_tokens_to_add(pair=False), len(special_tokens_per_sentence(tokenizer))) + 1


def check_max_length(tokenizer, max_length: int | None, flag: str, model: str) -> None:
    """Refuse (ValueError naming ``flag``) a ``max_length`` that leaves no room for text beside the special tokens
    the tokenizer adds to every sentence (``[CLS] x [SEP]`` needs 3); None (no truncation) passes."""
    if max_length is None:
        return
    shortest = shortest_max_length(tokenizer)
    if max_length < shortest:
        special = special_tokens_per_sentence(tokenizer)
        shape = f"{special[0]} x {' '.join(special[1:])}" if special else "x"
        raise ValueError(
            f"{flag} {max_length} leaves no room for text: the tokenizer of {model!r} adds {shortest - 1} special "
            f"tokens to every sentence, so one token of text needs {shortest} ({shape}); set {flag} {shortest} "
            "or more"
        )


def check_truncated(input_ids, max_length: int, what: str = "a sentence") -> None:
    """Raise RuntimeError when a row of ``input_ids`` (lists or a 2-D tensor) is longer than ``max_length``: the
    tokenizer did not truncate (transformers only warns when it cannot)."""
    longest = max((len(row) for row in input_ids), default=0)
    if longest > max_length:
        raise RuntimeError(
            f"the tokenizer did not truncate {what} to max_length {max_length} ({longest} tokens); "
            "raise the max length above the tokenizer's special tokens"
        )


def check_sentence_transformer(model, name: str, max_length: int | None = None) -> None:
    """A SentenceTransformer loaded from ``name``: its tokenizer fits its Hugging Face model and reads text
    (:func:`check_tokenizer`), and ``max_length`` (else the model's ``max_seq_length``) leaves room for text
    (:func:`check_max_length`). Models whose first module is not a Transformer (static embeddings, ...) pass."""
    first = model[0] if len(model) else None
    hf_model = getattr(first, "auto_model", None) or getattr(first, "model", None)
    tokenizer = getattr(first, "tokenizer", None)
    if hf_model is None or tokenizer is None or not callable(tokenizer):
        return
    check_tokenizer(tokenizer, embedding_rows(hf_model), name)
    if max_length is not None:
        check_max_length(tokenizer, max_length, "max_length", name)
    elif isinstance(getattr(model, "max_seq_length", None), int):  # the folder's own (sentence_bert_config.json)
        check_max_length(tokenizer, model.max_seq_length, "max_seq_length", name)
