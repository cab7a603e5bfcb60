"""Collect what the diagnostics fit, from a frozen encoder: embeddings, negative similarities, candidate sets.

* Text: a SentenceTransformer, or a raw Hugging Face encoder plus its tokenizer (mean pooling), over sentences.
* Images: any ``nn.Module`` mapping an image batch to embeddings, over a torchvision-style dataset.

Negatives are pairs of *distinct* items: duplicate sentences are dropped before encoding and (near-)identical
embeddings after it, so a pair at cosine 1 is never a "negative". Pair similarities are streamed block by block
and, past ``max_scores``, uniformly subsampled, so memory stays bounded whatever the number of items.

Example::

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    sentences = read_sentences("wiki1m_head.txt", max_sentences=2000)
    embeddings = encode_sentences(model, sentences)
    scores = negative_similarities(embeddings[distinct_rows(embeddings)])   # ~2M cosines, float64
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from simcse_weince.validation import check_utf8_text_file

__all__ = [
    "candidate_sets",
    "cosine_matrix",
    "distinct_rows",
    "encode_images",
    "encode_sentences",
    "negative_similarities",
    "paired_cosines",
    "read_sentence_pairs",
    "read_sentences",
]


# ------------------------------------------------------------------------------------------------ files


def read_sentences(path, max_sentences: int | None = None) -> list[str]:
    """Distinct non-empty lines of a UTF-8 text file (one sentence per line), in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sentence file not found: {path}")

    check_utf8_text_file(path, "sentence file")  # the trainer refuses the same files: no silent U+FFFD
    sentences = []
    seen = set()
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            sentence = line.strip()
            if sentence and sentence not in seen:
                seen.add(sentence)
                sentences.append(sentence)
                if max_sentences is not None and len(sentences) >= max_sentences:
                    break
    if len(sentences) < 2:
        raise ValueError(f"{path} holds {len(sentences)} distinct non-empty lines; need at least 2")
    return sentences


def read_sentence_pairs(path, min_score: float | None = None, max_pairs: int | None = None):
    """Positive pairs from a tab-separated file: ``[(sentence1, sentence2), ...]`` and their scores (or None).

    Formats: the STS Benchmark (7+ columns: genre, file, year, id, score, sentence1, sentence2 — read without
    quoting), ``sentence1<TAB>sentence2<TAB>score``, or ``sentence1<TAB>sentence2``. With ``min_score``, only
    pairs scored at least that are kept (e.g. 4.0 of 5 for near-paraphrases). Pairs whose two sentences are
    identical are dropped (their cosine is 1 by construction).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pair file not found: {path}")
    pairs, scores = [], []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t")
            if len(fields) >= 7:
                score, first, second = fields[4], fields[5], fields[6]
            elif len(fields) == 3:
                first, second, score = fields
            elif len(fields) == 2:
                (first, second), score = fields, None
            else:
                continue
            try:
                score = None if score is None else float(score)
            except ValueError:
                continue  # a header line
            first, second = first.strip(), second.strip()
            if not first or not second or first == second:
                continue
            if min_score is not None and (score is None or score < min_score):
                continue
            pairs.append((first, second))
            scores.append(score)
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
    if len(pairs) < 2:
        detail = f" with score >= {min_score}" if min_score is not None else ""
        raise ValueError(f"{path} holds {len(pairs)} usable sentence pairs{detail}; need at least 2")
    return pairs, scores


# -------------------------------------------------------------------------------------------- encoding


def _mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1e-9)


def encode_sentences(
    model,
    sentences: list[str],
    *,
    tokenizer=None,
    batch_size: int = 64,
    max_length: int | None = None,
    device: str | torch.device | None = None,
    dropout: bool = False,
    show_progress_bar: bool = True,
) -> torch.Tensor:
    """L2-normalised float32 sentence embeddings (CPU tensor, one row per sentence, input order).

    Args:
        model: a ``SentenceTransformer`` (uses its own tokenizer and pooling), or a Hugging Face encoder whose
            output has ``last_hidden_state`` (mean-pooled over the attention mask) together with ``tokenizer``.
        sentences: the texts.
        batch_size: sentences per forward pass (sorted by length, as sentence-transformers does, for speed).
        max_length: truncation for the raw HF path (default: the tokenizer's own limit).
        device: where to run (default: the model's device).
        dropout: encode in training mode, i.e. with dropout on: an unsupervised-SimCSE "second view".
        show_progress_bar: tqdm over batches.
    """
    if not sentences:
        raise ValueError("no sentences to encode")
    is_sentence_transformer = hasattr(model, "tokenize") and hasattr(model, "encode")
    if not is_sentence_transformer and tokenizer is None:
        raise ValueError("a raw Hugging Face encoder needs its tokenizer (tokenizer=...)")
    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.train(dropout)
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    outputs = [None] * len(sentences)
    try:
        with torch.no_grad():
            for start in tqdm(range(0, len(sentences), batch_size), desc="encoding", disable=not show_progress_bar):
                indices = order[start : start + batch_size]
                batch = [sentences[i] for i in indices]
                if is_sentence_transformer:
                    # sentence-transformers >= 6 renamed tokenize to preprocess
                    features = (model.preprocess if hasattr(model, "preprocess") else model.tokenize)(batch)
                    features = {k: v.to(device) if torch.is_tensor(v) else v for k, v in features.items()}
                    embeddings = model(features)["sentence_embedding"]
                else:
                    encoded = tokenizer(
                        batch, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
                    ).to(device)
                    hidden = model(**encoded).last_hidden_state
                    embeddings = _mean_pool(hidden, encoded["attention_mask"])
                embeddings = torch.nn.functional.normalize(embeddings.float(), dim=-1).cpu()
                for row, index in enumerate(indices):
                    outputs[index] = embeddings[row]
    finally:
        model.train(was_training)
    return torch.stack(outputs)


def encode_images(
    model: torch.nn.Module,
    dataset,
    *,
    batch_size: int = 128,
    max_items: int | None = None,
    device: str | torch.device | None = None,
    num_workers: int = 0,
    show_progress_bar: bool = True,
) -> torch.Tensor:
    """L2-normalised float32 embeddings of a torchvision-style dataset (items ``image`` or ``(image, label)``).

    ``model`` maps a batch of images to ``batch x ...`` outputs (flattened to vectors); it runs in eval mode.
    """
    if len(dataset) < 2:
        raise ValueError(f"the dataset holds {len(dataset)} items; need at least 2")
    if max_items is not None:
        dataset = torch.utils.data.Subset(dataset, range(min(max_items, len(dataset))))
    if device is None:
        parameter = next(model.parameters(), None)
        device = parameter.device if parameter is not None else torch.device("cpu")
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    was_training = model.training
    model.eval()
    outputs = []
    try:
        with torch.no_grad():
            for batch in tqdm(loader, desc="encoding images", disable=not show_progress_bar):
                images = batch[0] if isinstance(batch, (list, tuple)) else batch
                embeddings = model(images.to(device)).flatten(start_dim=1)
                outputs.append(torch.nn.functional.normalize(embeddings.float(), dim=-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(outputs)


# ----------------------------------------------------------------------------------------- similarities


def cosine_matrix(first: torch.Tensor, second: torch.Tensor) -> np.ndarray:
    """Cosine similarities ``first x second`` as float64 numpy (rows L2-normalised here)."""
    first = torch.nn.functional.normalize(first.detach().cpu().double(), dim=-1)
    second = torch.nn.functional.normalize(second.detach().cpu().double(), dim=-1)
    return (first @ second.T).numpy()


def paired_cosines(first: torch.Tensor, second: torch.Tensor) -> np.ndarray:
    """Cosine similarity of row i of ``first`` with row i of ``second``, as float64 numpy."""
    first = torch.nn.functional.normalize(first.detach().cpu().double(), dim=-1)
    second = torch.nn.functional.normalize(second.detach().cpu().double(), dim=-1)
    return (first * second).sum(dim=-1).numpy()


def distinct_rows(embeddings: torch.Tensor, tolerance: float = 1e-6, chunk_size: int = 1024) -> torch.Tensor:
    """Indices of the rows to keep so that no two kept rows have cosine >= 1 - tolerance (first one kept)."""
    normalized = torch.nn.functional.normalize(embeddings.detach().cpu().float(), dim=-1)
    duplicate = torch.zeros(len(normalized), dtype=torch.bool)
    for start in range(0, len(normalized), chunk_size):
        block = normalized[start : start + chunk_size] @ normalized.T  # chunk x N
        rows = torch.arange(start, start + block.shape[0])
        earlier = torch.arange(len(normalized))[None, :] < rows[:, None]
        duplicate[rows] = ((block >= 1 - tolerance) & earlier).any(dim=1)
    return (~duplicate).nonzero().flatten()


def negative_similarities(
    embeddings: torch.Tensor,
    *,
    max_scores: int = 4_000_000,
    chunk_size: int = 1024,
    seed: int = 0,
    show_progress_bar: bool = True,
) -> np.ndarray:
    """Cosine similarities of all pairs ``i < j`` of rows (distinct items), as float64.

    When there are more than ``max_scores`` pairs, each pair is kept independently with probability
    ``max_scores / pairs`` (a uniform subsample, so quantiles and the tail shape are unbiased) and the result is
    truncated to ``max_scores``: memory stays at about 8 bytes x ``max_scores``.
    """
    count = len(embeddings)
    if count < 2:
        raise ValueError(f"need at least 2 embeddings for pairs, got {count}")
    normalized = torch.nn.functional.normalize(embeddings.detach().cpu().float(), dim=-1)
    total_pairs = count * (count - 1) // 2
    keep_rate = min(1.0, max_scores / total_pairs)
    generator = torch.Generator().manual_seed(seed)
    kept = []
    for start in tqdm(range(0, count, chunk_size), desc="pair similarities", disable=not show_progress_bar):
        block = normalized[start : start + chunk_size] @ normalized[start:].T  # rows i, columns j >= start
        rows = torch.arange(block.shape[0])[:, None]
        upper = torch.arange(block.shape[1])[None, :] > rows  # j > i
        values = block[upper]
        if keep_rate < 1.0:
            values = values[torch.rand(values.shape, generator=generator) < keep_rate]
        kept.append(values.double().numpy())
    scores = np.concatenate(kept)[:max_scores]
    if not np.all(np.isfinite(scores)):
        raise ValueError("the embeddings produce NaN/inf similarities; check the encoder")
    return scores


def candidate_sets(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    pool: torch.Tensor,
    *,
    num_candidates: int,
    seed: int = 0,
) -> np.ndarray:
    """One candidate set per anchor, as a contrastive batch would give it: ``A x num_candidates`` cosines with
    the anchor's positive in column 0 and ``num_candidates - 1`` negatives drawn without replacement from
    ``pool`` (held-out items, distinct from the anchors and positives). Feed it to :func:`fit_link`."""
    if num_candidates < 2:
        raise ValueError(f"num_candidates must be >= 2 (the positive and a negative), got {num_candidates}")
    if num_candidates - 1 > len(pool):
        raise ValueError(f"{num_candidates - 1} negatives per set requested but the pool holds {len(pool)}")
    if len(anchors) != len(positives):
        raise ValueError(f"{len(anchors)} anchors but {len(positives)} positives")
    rng = np.random.default_rng(seed)
    positive_scores = paired_cosines(anchors, positives)
    negatives = cosine_matrix(anchors, pool)
    picks = np.stack([rng.choice(len(pool), size=num_candidates - 1, replace=False) for _ in range(len(anchors))])
    negative_scores = np.take_along_axis(negatives, picks, axis=1)
    return np.concatenate([positive_scores[:, None], negative_scores], axis=1)
