"""The STS numbers: raw STS-B Spearman (model selection) and the SentEval 7-task suite (SimCSE's table).

Both score cosine similarity against gold with Spearman x100. :func:`evaluate_sts` follows SimCSE's
``evaluation.py --mode test``: STS12-16 use SentEval's ``all`` aggregation by default, STS-B and SICK-R their
test split, all seven with cosine similarity (SimCSE's SentEval fork evaluates STS-B / SICK-R like the STS tasks,
no regressor is trained).

Example::

    from sentence_transformers import SentenceTransformer
    from simcse_weince.evaluation import evaluate_sts, format_sts_table, stsb_spearman

    model = SentenceTransformer("sentence-transformers/all-MiniLM-L6-v2")
    print(stsb_spearman(model, split="dev"))          # raw STS-B dev, x100
    print(format_sts_table(evaluate_sts(model)))      # | STS12 | ... | SICK-R | Avg. |
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simcse_weince.evaluation.data import SENTEVAL_STS_SUBSETS, STS_TASKS, STSData, load_sts_task, load_stsb
from simcse_weince.evaluation.encoders import as_encoder
from simcse_weince.evaluation.scoring import AGGREGATIONS, correlations, sts_correlations

# Column titles of SimCSE's table.
TASK_TITLES = {
    "sts12": "STS12",
    "sts13": "STS13",
    "sts14": "STS14",
    "sts15": "STS15",
    "sts16": "STS16",
    "stsb": "STS-B",
    "sickr": "SICK-R",
}


def _to_matrix(embeddings, expected_rows: int):
    import torch

    if not isinstance(embeddings, torch.Tensor):
        embeddings = torch.as_tensor(np.asarray(embeddings))
    embeddings = embeddings.detach().to("cpu", torch.float32)
    if embeddings.ndim != 2 or embeddings.shape[0] != expected_rows:
        raise ValueError(
            f"the encoder returned shape {tuple(embeddings.shape)} for {expected_rows} sentences; "
            f"expected ({expected_rows}, dim)"
        )
    return embeddings


def encode_unique(encoder, sentences: Sequence[str]) -> tuple[dict[str, int], object]:
    """Encode each distinct sentence once: ``(index of sentence, float32 CPU matrix)``.

    Within one call only; nothing is cached across calls.
    """
    unique = list(dict.fromkeys(sentences))
    return {sentence: row for row, sentence in enumerate(unique)}, _to_matrix(encoder(unique), len(unique))


def pair_cosines(index: dict[str, int], embeddings, data: STSData) -> np.ndarray:
    """Cosine similarity of each pair, float32 like sentence-transformers' ``pairwise_cos_sim`` and SentEval.

    NaN components become 0 and a zero vector gives cosine 0, as SentEval's ``np.nan_to_num(cosine(...))``.
    """
    import torch
    import torch.nn.functional as F

    left = torch.nan_to_num(embeddings[[index[s] for s in data.sentences1]])
    right = torch.nan_to_num(embeddings[[index[s] for s in data.sentences2]])
    cosines = (F.normalize(left, p=2, dim=1) * F.normalize(right, p=2, dim=1)).sum(dim=-1)
    return torch.nan_to_num(cosines).numpy().astype(np.float64)


def stsb_spearman(model_or_encoder, split: str = "dev", data_dir: str | Path | None = None, **encoder_kwargs) -> float:
    """Cosine Spearman x100 on the ORIGINAL STS Benchmark (sentence-transformers' protocol).

    Equals ``100 * EmbeddingSimilarityEvaluator(...)(model)["spearman_cosine"]`` on the same pairs (the gold
    scale does not matter to a rank correlation).

    Args:
        model_or_encoder: anything :func:`as_encoder` accepts.
        split: ``"dev"`` (model selection) or ``"test"`` (reporting) or ``"train"``.
        data_dir: data folder with ``stsbenchmark/``.
        **encoder_kwargs: passed to :func:`as_encoder` (``pooler``, ``batch_size``, ``device``, ...).
    """
    data = load_stsb(split, data_dir=data_dir)
    encoder = as_encoder(model_or_encoder, **encoder_kwargs)
    index, embeddings = encode_unique(encoder, data.sentences1 + data.sentences2)
    _, spearman = correlations(pair_cosines(index, embeddings, data), data.scores)
    return 100.0 * spearman


def _percent(report: dict) -> dict:
    """The correlation report with every correlation x100 (counts untouched)."""
    return {
        "n": report["n"],
        "spearman": {key: 100.0 * value for key, value in report["spearman"].items()},
        "pearson": {key: 100.0 * value for key, value in report["pearson"].items()},
        "subsets": {
            name: {"spearman": 100.0 * entry["spearman"], "pearson": 100.0 * entry["pearson"], "n": entry["n"]}
            for name, entry in report["subsets"].items()
        },
    }


def evaluate_sts(
    model_or_encoder,
    tasks: Sequence[str] = STS_TASKS,
    split: str = "test",
    aggregation: str = "all",
    data_dir: str | Path | None = None,
    **encoder_kwargs,
) -> dict:
    """SentEval STS tasks as SimCSE reports them: cosine Spearman x100 per task, plus their average.

    Args:
        model_or_encoder: anything :func:`as_encoder` accepts.
        tasks: among ``sts12`` ... ``sts16``, ``stsb``, ``sickr`` (STS12-16 exist only for ``split="test"``;
            with another split the default becomes ``("stsb", "sickr")``).
        split: ``"test"`` (SimCSE's table) or ``"dev"`` (STS-B / SICK-R dev, SimCSE's model selection).
        aggregation: how STS12-16 combine their subsets: ``"all"`` (SimCSE), ``"mean"`` or ``"wmean"``.
        data_dir: data folder with ``senteval/downstream/``.
        **encoder_kwargs: passed to :func:`as_encoder`.

    Returns:
        ``{task: spearman x100, ..., "avg": mean over tasks, "details": {"split", "aggregation",
        "tasks": {task: {"n", "spearman": {"all","mean","wmean"}, "pearson": {...}, "subsets": {...}}}}}``,
        every correlation x100. ``avg`` is the exact mean; :func:`format_sts_table` prints SimCSE's Avg.
        (the mean of the two-decimal numbers).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose from {', '.join(AGGREGATIONS)}")
    if isinstance(tasks, str):
        tasks = [task for task in tasks.split(",") if task.strip()]
    if split != "test" and tuple(tasks) == STS_TASKS:
        # STS12-16 have no dev/train split: the default set becomes SimCSE's dev-mode pair, STS-B and SICK-R.
        tasks = ("stsb", "sickr")
    if not tasks:
        raise ValueError("no STS task given")
    # Load everything first: a missing file fails before minutes of encoding.
    datasets = {}
    for task in tasks:
        data = load_sts_task(task, split=split, data_dir=data_dir)
        datasets[data.name] = data
    encoder = as_encoder(model_or_encoder, **encoder_kwargs)
    # One encoding pass over the distinct sentences of all tasks (SICK and STS repeat many sentences).
    every_sentence = [s for data in datasets.values() for s in (*data.sentences1, *data.sentences2)]
    index, embeddings = encode_unique(encoder, every_sentence)

    results: dict = {}
    details = {"split": split, "aggregation": aggregation, "similarity": "cosine", "tasks": {}}
    for name, data in datasets.items():
        report = sts_correlations(pair_cosines(index, embeddings, data), data.scores, data.subsets)
        # STS12-16: SentEval's aggregation over subsets. STS-B / SICK-R have one subset, where all three agree;
        # SimCSE reads results[task]['test']['spearman'], i.e. the one correlation.
        chosen = aggregation if name in SENTEVAL_STS_SUBSETS else "all"
        results[name] = 100.0 * report["spearman"][chosen]
        details["tasks"][name] = _percent(report)
    results["avg"] = float(np.mean([results[name] for name in datasets]))
    results["details"] = details
    return results


def format_sts_table(results: dict) -> str:
    """SimCSE-style markdown table of :func:`evaluate_sts` results: one column per task, then ``Avg.``.

    Numbers are printed ``"%.2f"`` and ``Avg.`` is computed like SimCSE's ``evaluation.py``: the mean of the
    two-decimal per-task numbers, itself printed ``"%.2f"``.
    """
    names = [name for name in STS_TASKS if name in results]
    if not names:
        raise ValueError("no STS task results to format")
    entries = [f"{results[name]:.2f}" for name in names]  # same rounding as SimCSE's "%.2f" %
    average = f"{sum(float(entry) for entry in entries) / len(entries):.2f}"
    titles = [TASK_TITLES[name] for name in names] + ["Avg."]
    entries.append(average)
    widths = [max(len(title), len(entry)) for title, entry in zip(titles, entries)]
    header = "| " + " | ".join(title.rjust(width) for title, width in zip(titles, widths)) + " |"
    rule = "|" + "|".join("-" * (width + 1) + ":" for width in widths) + "|"
    row = "| " + " | ".join(entry.rjust(width) for entry, width in zip(entries, widths)) + " |"
    return "\n".join([header, rule, row])
