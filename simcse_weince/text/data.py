"""The text trainer's data: SimCSE's one-sentence-per-line corpus, tokenised once, dynamically padded. Batches
come from :class:`~simcse_weince.training.batches.StepBatchSampler`."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from simcse_weince.paths import hub_is_offline, resolve_data_dir
from simcse_weince.validation import check_regular_file, check_utf8_text_file, has_visible_character

logger = logging.getLogger(__name__)

#: SimCSE's corpus, fetched from the Hub when it is not in the data directory and the Hub is reachable
HUB_TRAIN_FILES = {"wiki1m_for_simcse.txt": ("princeton-nlp/datasets-for-simcse", "wiki1m_for_simcse.txt")}
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
    check_regular_file(path, "training file")
    if not path.is_file():
        raise FileNotFoundError(f"training file {path} not found")
    if path.stat().st_size == 0:
        raise ValueError(f"training file {path} is empty; give a text file with one sentence per line")
    check_utf8_text_file(path, "training file")  # one line naming the byte, not a traceback from datasets
    dataset = load_dataset("text", data_files=str(path), split="train")
    sentences = dataset.filter(lambda batch: [has_visible_character(text) for text in batch["text"]], batched=True)
    skipped = len(dataset) - len(sentences)
    if len(sentences) == 0:
        raise ValueError(
            f"training file {path} holds no sentences ({skipped} lines without a visible character: blank, or only "
            "zero-width characters such as U+200B, U+FEFF)"
        )
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
