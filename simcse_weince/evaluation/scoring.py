"""STS scoring: Pearson / Spearman correlations of predicted similarities against gold, and SentEval's aggregations.

SentEval (``senteval/sts.py``, ``STSEval.run`` in SimCSE's fork) reports three numbers for a task made of subsets:

* ``all``   — one correlation over the concatenation of every subset's predictions and gold scores
  (SimCSE's reported setting: ``results[task]['all']['spearman']['all']``);
* ``mean``  — the plain average of the per-subset correlations (``np.average(list)``);
* ``wmean`` — the average weighted by subset size (``np.average(list, weights=nsamples)``).

All correlations are scipy's ``pearsonr`` / ``spearmanr`` in float64, as in SentEval. Values returned here are
raw correlations in [-1, 1]; callers multiply by 100 for tables.

Example::

    from simcse_weince.evaluation.scoring import sts_correlations

    report = sts_correlations([0.9, 0.1, 0.5, 0.4], [5.0, 0.0, 3.0, 2.0], subsets=["a", "a", "b", "b"])
    report["spearman"]["all"], report["spearman"]["mean"], report["subsets"]["a"]["n"]
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr

AGGREGATIONS = ("all", "mean", "wmean")


def _as_float64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


def correlations(predictions: Sequence[float], references: Sequence[float]) -> tuple[float, float]:
    """(Pearson, Spearman) of ``predictions`` against ``references``; NaN when either side is constant."""
    predictions = _as_float64(predictions)
    references = _as_float64(references)
    if len(predictions) != len(references):
        raise ValueError(f"predictions and references differ in length: {len(predictions)} vs {len(references)}")
    if len(predictions) < 2:
        raise ValueError(f"a correlation needs at least 2 pairs, got {len(predictions)}")
    if not (np.isfinite(predictions).all() and np.isfinite(references).all()):
        raise ValueError("predictions and references must be finite (no NaN or inf)")
    with warnings.catch_warnings():
        # Constant input: scipy warns and returns NaN. SentEval reports that NaN as is; so do we, quietly.
        warnings.simplefilter("ignore")
        pearson = float(pearsonr(predictions, references)[0])
        spearman = float(spearmanr(predictions, references)[0])
    return pearson, spearman


def sts_correlations(
    predictions: Sequence[float],
    references: Sequence[float],
    subsets: Sequence[str] | None = None,
) -> dict:
    """Per-subset correlations and SentEval's three aggregations.

    Args:
        predictions: predicted similarity per pair (e.g. cosine).
        references: gold score per pair.
        subsets: subset name per pair (``None``: one subset).

    Returns:
        ``{"pearson": {"all", "mean", "wmean"}, "spearman": {...}, "n": N,
        "subsets": {name: {"pearson", "spearman", "n"}}}`` with raw correlations in [-1, 1]; subsets in order
        of first appearance.
    """
    predictions = _as_float64(predictions)
    references = _as_float64(references)
    if subsets is None:
        subsets = ["all"] * len(predictions)
    subsets = np.asarray(list(subsets), dtype=object)
    if not (len(predictions) == len(references) == len(subsets)):
        raise ValueError(
            f"predictions, references and subsets differ in length: "
            f"{len(predictions)}, {len(references)}, {len(subsets)}"
        )
    per_subset = {}
    for name in dict.fromkeys(subsets.tolist()):
        mask = subsets == name
        try:
            pearson, spearman = correlations(predictions[mask], references[mask])
        except ValueError as error:
            raise ValueError(f"subset {name!r}: {error}") from None
        per_subset[name] = {"pearson": pearson, "spearman": spearman, "n": int(mask.sum())}
    sizes = [entry["n"] for entry in per_subset.values()]
    all_pearson, all_spearman = correlations(predictions, references)
    report = {"n": len(predictions), "subsets": per_subset}
    for metric, overall in (("pearson", all_pearson), ("spearman", all_spearman)):
        values = np.array([entry[metric] for entry in per_subset.values()])
        report[metric] = {
            "all": overall,
            "mean": float(np.average(values)),
            "wmean": float(np.average(values, weights=sizes)),
        }
    return report
