"""The statistics of a comparison: mean ± sd per variant, paired differences against a baseline (t-interval,
wins/ties/losses, Wilcoxon signed-rank), and WEINCE's λ statistics averaged over seeds."""

from __future__ import annotations

import math


def mean_sd(values: list) -> dict:
    """Mean and sample standard deviation (ddof 1) of the values that are not None.

    >>> mean_sd([1.0, 2.0, 3.0, None])
    {'mean': 2.0, 'sd': 1.0, 'n': 3}
    """
    import numpy as np

    present = np.array([value for value in values if value is not None], dtype=float)
    if present.size == 0:
        return {"mean": None, "sd": None, "n": 0}
    sd = float(np.std(present, ddof=1)) if present.size > 1 else None
    return {"mean": float(present.mean()), "sd": sd, "n": int(present.size)}


def paired_difference(values, baseline_values, confidence: float = 0.95) -> dict:
    """Paired statistics of ``values - baseline_values`` (one pair per seed; pairs with a None are left out).

    Returns ``mean`` (of the differences), ``ci95`` (the t-interval ``[low, high]``: None for fewer than 2 pairs,
    ``[mean, mean]`` when every difference is the same), ``wins``/``ties``/``losses`` (differences > 0, == 0,
    < 0), ``wilcoxon_p`` (scipy's two-sided signed-rank p; None with fewer than 2 non-zero differences) and ``n``.

    >>> result = paired_difference([81.0, 82.5, 80.0], [80.0, 82.5, 79.0])
    >>> result["mean"], result["wins"], result["ties"], result["losses"], result["n"]
    (0.6666666666666666, 2, 1, 0, 3)
    """
    import numpy as np
    from scipy import stats

    pairs = [(a, b) for a, b in zip(values, baseline_values, strict=True) if a is not None and b is not None]
    differences = np.array([a - b for a, b in pairs], dtype=float)
    n = int(differences.size)
    result = {"mean": None, "ci95": None, "wins": 0, "ties": 0, "losses": 0, "wilcoxon_p": None, "n": n}
    if n == 0:
        return result
    mean = float(differences.mean())
    result.update(
        mean=mean,
        wins=int((differences > 0).sum()),
        ties=int((differences == 0).sum()),
        losses=int((differences < 0).sum()),
    )
    if n >= 2:
        sd = float(np.std(differences, ddof=1))
        if sd > 0:
            low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=sd / math.sqrt(n))
            result["ci95"] = [float(low), float(high)]
        else:  # every difference equal: no spread to estimate (scipy would give nan)
            result["ci95"] = [mean, mean]
    if int((differences != 0).sum()) >= 2:  # the signed-rank test drops zero differences
        result["wilcoxon_p"] = float(stats.wilcoxon(differences).pvalue)
    return result


def summarize(runs: list[dict], baseline: str, metrics: tuple[str, ...]) -> dict:
    """Per-variant mean/sd of each metric (a cell kind's, e.g. ``tuple(TEXT_CELLS.metric_labels)``) and each other
    variant's paired differences against ``baseline``."""
    variants = list(dict.fromkeys(run["variant"] for run in runs))
    by_cell = {(run["variant"], run["seed"]): run for run in runs}
    seeds = sorted({run["seed"] for run in runs})
    per_variant = {
        name: {metric: mean_sd([run[metric] for run in runs if run["variant"] == name]) for metric in metrics}
        for name in variants
    }
    differences = {}
    for name in variants:
        if name == baseline:
            continue
        paired = [seed for seed in seeds if (name, seed) in by_cell and (baseline, seed) in by_cell]
        differences[name] = {
            metric: paired_difference(
                [by_cell[name, seed][metric] for seed in paired], [by_cell[baseline, seed][metric] for seed in paired]
            )
            for metric in metrics
        }
    return {"per_variant": per_variant, "differences": differences}


def seed_averaged_lambda(histories: dict[tuple[str, int], list[dict]]) -> dict[str, list[dict]]:
    """Per variant, WEINCE's λ statistics at each step averaged over the seeds that logged that step.

    ``histories``: ``(variant, seed) -> [history entries with lambda_mean, ...]`` (a run's ``results["history"]``).
    Returns ``variant -> [{"step", "seeds", <each STATISTIC_KEYS name>: mean}, ...]``; InfoNCE runs log none and
    are left out.

    >>> seed_averaged_lambda({("w", 1): [{"step": 1, "lambda_mean": 0.2}], ("w", 2): [{"step": 1, "lambda_mean": 0.4}]})
    {'w': [{'step': 1, 'seeds': 2, 'lambda_mean': 0.30000000000000004}]}
    """
    by_variant: dict[str, dict[int, list[dict]]] = {}
    for (name, _seed), entries in histories.items():
        for entry in entries:
            by_variant.setdefault(name, {}).setdefault(int(entry["step"]), []).append(entry)
    averaged = {}
    for name, steps in by_variant.items():
        rows = []
        for step in sorted(steps):
            entries = steps[step]
            row = {"step": step, "seeds": len(entries)}
            for key in entries[0]:
                values = [entry[key] for entry in entries if isinstance(entry.get(key), (int, float))]
                if key not in ("step", "learning_rate", "train_seconds", "loss") and values:
                    row[key] = sum(values) / len(values)
            rows.append(row)
        averaged[name] = rows
    return averaged


def paired_t_p(differences) -> float | None:
    """Two-sided p of the one-sample t-test that the mean paired difference is 0: the test that goes with the
    t-interval of :func:`paired_difference` (p < 0.05 exactly when that 95% interval excludes 0). None for fewer
    than 2 differences; 0.0 or 1.0 when every difference is the same (non-zero or zero).

    >>> round(paired_t_p([1.0, 2.0, 3.0]), 4)
    0.0742
    """
    import numpy as np
    from scipy import stats

    values = np.asarray([value for value in differences if value is not None], dtype=float)
    if values.size < 2:
        return None
    if float(np.std(values, ddof=1)) == 0.0:
        return 0.0 if values[0] != 0 else 1.0
    return float(stats.ttest_1samp(values, 0.0).pvalue)


def holm(p_values: dict[str, float], alpha: float = 0.05) -> dict[str, dict]:
    """Holm's step-down correction over one family of tests (a study's contrasts).

    Returns, per name, ``p`` (as given), ``adjusted`` (Holm's adjusted p: the i-th smallest p times the number of
    tests not yet rejected, made monotone, capped at 1) and ``survives`` (``adjusted < alpha``). Holm controls the
    chance of any false rejection in the family at ``alpha`` under any dependence between the tests.

    >>> result = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    >>> [(name, round(r["adjusted"], 2), r["survives"]) for name, r in result.items()]
    [('a', 0.03, True), ('b', 0.06, False), ('c', 0.06, False)]
    """
    if not 0 < alpha < 1:
        raise ValueError(f"holm: alpha must lie in (0, 1), got {alpha!r}")
    missing = [name for name, p in p_values.items() if p is None or not 0 <= p <= 1]
    if missing:
        raise ValueError(f"holm: no p-value in [0, 1] for {', '.join(map(str, missing))}")
    ordered = sorted(p_values, key=lambda name: p_values[name])
    count, running, adjusted = len(ordered), 0.0, {}
    for rank, name in enumerate(ordered):
        running = max(running, min(1.0, (count - rank) * p_values[name]))
        adjusted[name] = running
    return {name: {"p": p_values[name], "adjusted": adjusted[name], "survives": adjusted[name] < alpha}
            for name in p_values}  # fmt: skip
