"""The text trainer's data, tokenised batch by batch as the loader draws it and dynamically padded: SimCSE's
one-sentence-per-line corpus, or a table of pairs / triplets (:mod:`simcse_weince.text.columns`). Batches come from
:class:`~simcse_weince.training.batches.StepBatchSampler`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from simcse_weince.encoder_checks import check_truncated
from simcse_weince.paths import hub_is_offline, resolve_data_dir
from simcse_weince.provenance import file_fingerprint
from simcse_weince.text.columns import is_table_file, read_table
from simcse_weince.validation import check_regular_file, check_utf8_text_file, has_visible_character

logger = logging.getLogger(__name__)

#: SimCSE's corpus, fetched from the Hub when it is not in the data directory and the Hub is reachable
HUB_TRAIN_FILES = {
    "wiki1m_for_simcse.txt": ("princeton-nlp/datasets-for-simcse", "wiki1m_for_simcse.txt"),
    # supervised SimCSE's SNLI+MNLI triplets (sent0,sent1,hard_neg), preset paper-sup
    "nli_for_simcse.csv": ("princeton-nlp/datasets-for-simcse", "nli_for_simcse.csv"),
}
# Files cut from the head of a downloadable one: the cpu-demo's 11,914 sentences.
HEAD_TRAIN_FILES = {"wiki1m_head.txt": ("wiki1m_for_simcse.txt", 11914)}


def resolve_train_file(config, *, download: bool = True) -> Path:
    """The training text file: a path as given, else a name in the data directory (downloaded when online and
    ``download``). A path that exists but is not a regular file (a folder, a FIFO, a socket) is named as what it is."""
    data_dir = resolve_data_dir(config.data_dir)
    given = Path(config.train_file).expanduser()
    candidates = [given] if given.is_absolute() else [given, data_dir / given]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates:
        check_regular_file(candidate, "training file")
    if not download:
        raise FileNotFoundError(f"training file not found: {' or '.join(str(candidate) for candidate in candidates)}")
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
    logger.info("downloading %s from the Hub dataset %s into %s ...", filename, repo_id, data_dir)
    try:
        return Path(hf_hub_download(repo_id, filename, repo_type="dataset", local_dir=data_dir))
    except Exception as error:  # network, auth, disk: say what we tried
        raise FileNotFoundError(
            f"training file {name!r} is not in {data_dir} and downloading it from {repo_id} failed: {error}"
        ) from error


def load_sentences(path: Path, max_train_samples: int | None = None):
    """One sentence per line, through 🤗 datasets; empty lines (no visible character: blank, or only zero-width
    characters such as U+200B or U+FEFF) are dropped and counted.

    Returns ``(dataset with a "text" column, number of empty lines skipped)``.
    """
    from datasets import load_dataset

    path = Path(path)
    _check_training_file(path)
    if path.stat().st_size == 0:
        raise ValueError(f"training file {path} is empty; give a text file with one sentence per line")
    check_utf8_text_file(path, "training file")  # one line naming the byte, not a traceback from datasets
    start = time.perf_counter()
    cache_dir = prepared_data_cache(path)
    prepared_before = _text_dataset_is_cached(path, cache_dir)
    dataset = load_dataset("text", data_files=str(path), split="train", cache_dir=str(cache_dir))
    sentences = dataset.filter(lambda batch: [has_visible_character(text) for text in batch["text"]], batched=True)
    if prepared_before:
        logger.info("reused the prepared lines of %s from the datasets cache", path)
    else:  # also where the cache could not be looked up: a preparation is never hidden
        logger.info(
            "prepared %d lines of %s in %.1f s (datasets cache)", len(dataset), path, time.perf_counter() - start
        )
    skipped = len(dataset) - len(sentences)
    if len(sentences) == 0:
        raise ValueError(
            f"training file {path} holds no sentences ({skipped} lines without a visible character: blank, or only "
            "zero-width characters such as U+200B, U+FEFF)"
        )
    if max_train_samples is not None:
        sentences = sentences.select(range(min(max_train_samples, len(sentences))))
    return sentences, skipped


def prepared_data_cache(path: Path) -> Path:
    """The 🤗 datasets cache folder of the lines of ``path``, named by the sha256 of its content (the run's
    ``data_fingerprint``, hashed once per process): datasets keys a local file by its path and mtime, so a file
    rewritten with its mtime kept (``cp -p``, ``rsync -t``) would be read from the cache as its old lines. Under
    datasets' own cache folder (``HF_DATASETS_CACHE``)."""
    from datasets import config as datasets_config

    sha256 = file_fingerprint(path)["sha256"]
    return Path(datasets_config.HF_DATASETS_CACHE) / "simcse_weince" / f"text-{sha256}"


def _text_dataset_is_cached(path: Path, cache_dir: Path) -> bool:
    """Whether 🤗 datasets holds ``path`` read already (an earlier run, or the machine's main process of this one):
    its builder's cache folder is complete. False where that cannot be looked up (another datasets release)."""
    try:
        from datasets import load_dataset_builder

        folder = Path(load_dataset_builder("text", data_files=str(path), cache_dir=str(cache_dir)).cache_dir)
        return (folder / "dataset_info.json").is_file()
    except Exception:  # the lookup goes below load_dataset; any failure only means "not known to be cached"
        return False


def _check_training_file(path: Path) -> None:
    """A regular file that exists (a folder, FIFO or socket is named as what it is), whatever its format."""
    check_regular_file(path, "training file")
    if not path.is_file():
        raise FileNotFoundError(f"training file {path} not found")


def load_training_data(path: Path, max_train_samples: int | None = None):
    """The training rows of ``path``: a table (``.csv``, ``.tsv``, ``.jsonl`` with a header) or plain text.

    Returns ``(dataset, columns, skipped)``: a 🤗 dataset with one text column per entry of ``columns`` (in role
    order: anchor, positive, hard negative; plain text is the single column ``text``) and the number of empty
    lines skipped."""
    from datasets import Dataset

    path = Path(path)
    if not is_table_file(path):
        sentences, skipped = load_sentences(path, max_train_samples)
        return sentences, ("text",), skipped
    _check_training_file(path)
    table = read_table(path, max_train_samples)
    return Dataset.from_dict(table.rows), table.columns, table.skipped


def tokenize(sentences, tokenizer, max_length: int, columns: tuple[str, ...] = ("text",)):
    """Token ids of every sentence (truncated, unpadded), all rows up front: the trainer's path before it tokenised
    batch by batch (:class:`TokenizingCollator`, tested against this with :class:`PaddingCollator`). With several
    columns a row's ids are a list of one id list per column (the collator stacks them column by column). A row the
    tokenizer left longer than ``max_length`` is refused (:func:`~simcse_weince.encoder_checks.check_truncated`)."""

    def encode(texts: list[str]):
        encoded = tokenizer(texts, truncation=True, max_length=max_length)
        check_truncated(encoded["input_ids"], max_length, "the training sentences")
        return encoded

    if len(columns) == 1:
        return sentences.map(
            lambda batch: encode(batch[columns[0]]), batched=True, remove_columns=[columns[0]], desc="tokenizing"
        )

    def encode_columns(batch):
        encoded = [encode(batch[name]) for name in columns]
        rows = range(len(batch[columns[0]]))
        return {key: [[column[key][row] for column in encoded] for row in rows] for key in encoded[0]}

    return sentences.map(encode_columns, batched=True, remove_columns=list(columns), desc="tokenizing")


class PaddingCollator:
    """Pads token ids to the longest sentence of the batch (dynamic padding, like SimCSE).

    Rows of several columns (pairs, triplets) are stacked column by column, as SimCSE stacks ``sent0``, ``sent1``
    and ``hard_neg``: rows ``c * N .. (c + 1) * N - 1`` of the batch are column ``c`` of its N rows."""

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict]) -> dict:
        from torch.nn.utils.rnn import pad_sequence

        batch = {}
        for name in features[0]:
            padding = self.pad_token_id if name == "input_ids" else 0
            values = [feature[name] for feature in features]
            if values[0] and isinstance(values[0][0], list):  # one list per column: column-major
                values = [row[column] for column in range(len(values[0])) for row in values]
            batch[name] = pad_sequence([torch.tensor(value) for value in values], batch_first=True,
                                       padding_value=padding)  # fmt: skip
        return batch


class TokenizingCollator:
    """Tokenises a batch's rows as the loader draws them (truncated to ``max_length``) and pads them to the batch's
    longest sentence, on the right: the training data need no tokenising pass before the first step (a 1M-line corpus
    starts in seconds, docs/training.md). The same tensors as :func:`tokenize` followed by :class:`PaddingCollator`,
    bit for bit; rows of several columns are stacked column by column, as there.

    Args:
        tokenizer: a 🤗 tokenizer with a pad token.
        max_length: tokens per sentence, special tokens included.
        columns: the text columns of a row, in role order (anchor, positive, hard negative).
    """

    def __init__(self, tokenizer, max_length: int, columns: tuple[str, ...] = ("text",)):
        self.tokenizer, self.max_length, self.columns = tokenizer, max_length, tuple(columns)

    def __call__(self, rows: list[dict]) -> dict:
        texts = [row[name] for name in self.columns for row in rows]  # column-major: c * N .. (c + 1) * N - 1
        # padding_side: the trainer trims trailing padding (trim_trailing_padding), whatever the tokenizer's default
        encoded = self.tokenizer(texts, truncation=True, max_length=self.max_length, padding="longest",
                                 padding_side="right", return_tensors="pt")  # fmt: skip
        # a tokenizer that ignores truncation would train on rows past max_length (issue 54, class 6)
        if encoded["input_ids"].shape[1] > self.max_length:
            check_truncated(encoded["input_ids"].tolist(), self.max_length, "the training sentences")
        return dict(encoded)
