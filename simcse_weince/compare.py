"""Compare losses fairly: a grid of ordinary training runs (variant x seed), paired by seed, summarised.

A *variant* is data: a name and the overrides it applies to a base :class:`~simcse_weince.text.config.TrainConfig`
(``{"loss": "weince", "weince.beta": 1.0}``). Every cell of the grid is a plain ``train`` run in
``<output_dir>/<variant>/seed-<s>/``; runs with the same seed share data order, initialisation and the dropout
masks of step 0 (the trainer seeds them), so the differences between variants are paired by seed. A finished cell
(``results.json``) is read, not retrained; a started one (``training_config.yaml``) is resumed; so a killed sweep
finishes when the same call runs again. The summary goes to ``comparison.json``, ``comparison.md`` (a table to
paste into a README) and ``comparison.png``.

Example::

    from simcse_weince.compare import VARIANTS, compare
    from simcse_weince.text.config import preset

    base = preset("cpu-demo", max_steps=100)
    variants = {name: VARIANTS[name] for name in ("infonce", "weince")}
    summary = compare(base, variants, seeds=[1, 2, 3], output_dir="runs/compare")
    print(summary["differences"]["weince"]["stsb_test"])  # mean, ci95, wins/ties/losses, wilcoxon_p, n

or ``simcse-weince compare --preset cpu-demo --losses infonce,weince --seeds 1,2,3 --output-dir runs/compare``.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from pathlib import Path

from simcse_weince.config import CONFIG_FILE, apply_overrides, changed_settings, load_config

logger = logging.getLogger(__name__)

#: the variants shipped: name -> overrides of the base config
VARIANTS: dict[str, dict] = {
    "infonce": {"loss": "infonce"},
    "weince": {"loss": "weince"},
    "weince-reference": {"loss": "weince", "weince.beta": 1.0},
    "infonce-hardness": {"loss": "infonce", "hardness_strength": 9.0},
}

#: the metrics compared: name in comparison.json -> how to read it from a run's results.json
METRICS = ("stsb_dev", "stsb_test", "sts_avg")
METRIC_LABELS = {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg (final tasks)"}


def load_variants(path) -> dict[str, dict]:
    """:data:`VARIANTS` with the variants of a YAML/JSON file (``name: {setting: value}``) merged over them.

    Example: a file holding ``q03: {loss: weince, weince: {quantile: 0.3}}`` adds the variant ``q03``.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"variants file {path} not found")
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"variants file {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
        raise ValueError(f"variants file {path} must map each variant name to a mapping of settings")
    from simcse_weince.config import flatten_overrides

    return {**VARIANTS, **{str(name): flatten_overrides(overrides) for name, overrides in values.items()}}


def cell_dir(output_dir, variant: str, seed: int) -> Path:
    """The run folder of one cell: ``<output_dir>/<variant>/seed-<seed>``."""
    return Path(output_dir).expanduser() / variant / f"seed-{seed}"


def cell_configs(base, variants: dict[str, dict], seeds: list[int], output_dir) -> dict[tuple[str, int], object]:
    """The config of every cell, built (and checked) before anything trains, so a bad variant fails at once."""
    configs = {}
    for name, overrides in variants.items():
        try:
            variant_config = apply_overrides(base, overrides)
        except (TypeError, ValueError) as error:
            raise ValueError(f"variant {name!r}: {error}") from None
        for seed in seeds:
            configs[name, seed] = apply_overrides(
                variant_config, {"seed": seed, "output_dir": str(cell_dir(output_dir, name, seed))}
            )
    return configs


def run_cell(config) -> dict:
    """Train one cell, or read / resume it: results.json -> read; training_config.yaml -> resume; else fresh."""
    folder = Path(config.output_dir)
    saved = folder / CONFIG_FILE
    if saved.is_file():  # a rerun must not silently mix settings: the folder must hold this very cell
        changed = changed_settings(config, load_config(type(config), saved))
        if changed:
            raise ValueError(
                f"{folder} holds a run with other settings ({', '.join(changed)}); use another output directory"
            )
    results_file = folder / "results.json"
    if results_file.is_file():
        try:
            results = json.loads(results_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError:  # killed while writing it: finish the run again from its last checkpoint
            logger.warning("%s is unreadable; resuming the run", results_file)
        else:
            logger.info("%s is finished; reading its results", folder)
            return results
    from simcse_weince.text.train import train

    if saved.is_file():
        logger.info("%s was interrupted; resuming it", folder)
        return train(config, resume=True)
    return train(config)


def run_metrics(results: dict) -> dict:
    """The compared numbers of one run's results: best STS-B dev during training, STS-B test, STS test average."""
    sts_test = results.get("sts_test") or {}
    return {
        "stsb_dev": results.get("best_stsb_dev_spearman_during_training"),
        "stsb_test": results.get("stsb_test_spearman"),
        "sts_avg": sts_test.get("avg"),
    }


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


def summarize(runs: list[dict], baseline: str) -> dict:
    """Per-variant mean/sd of each metric and each other variant's paired differences against ``baseline``."""
    variants = list(dict.fromkeys(run["variant"] for run in runs))
    by_cell = {(run["variant"], run["seed"]): run for run in runs}
    seeds = sorted({run["seed"] for run in runs})
    per_variant = {
        name: {metric: mean_sd([run[metric] for run in runs if run["variant"] == name]) for metric in METRICS}
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
            for metric in METRICS
        }
    return {"per_variant": per_variant, "differences": differences}


def git_commit() -> str | None:
    """The checkout's ``git rev-parse HEAD`` (None outside a git checkout or without git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mean_sd_text(stat: dict) -> str:
    if stat["mean"] is None:
        return "n/a"
    return _fmt(stat["mean"]) + (f" ± {_fmt(stat['sd'])}" if stat["sd"] is not None else "")


def format_markdown(summary: dict) -> str:
    """The comparison as a markdown table (Spearman x100; differences on STS-B test, paired by seed)."""
    baseline = summary["baseline"]
    lines = [
        f"| variant | n | STS-B dev | STS-B test | STS avg | Δ test vs {baseline} [95% CI] | W/T/L | Wilcoxon p |",
        "|:--|--:|--:|--:|--:|--:|:-:|--:|",
    ]
    for name, stats in summary["per_variant"].items():
        if name == baseline:
            delta, wtl, p = "—", "—", "—"
        else:
            test = summary["differences"][name]["stsb_test"]
            ci = test["ci95"]
            delta = f"{test['mean']:+.2f}" if test["mean"] is not None else "n/a"
            if ci is not None:
                delta += f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
            wtl = f"{test['wins']}/{test['ties']}/{test['losses']}"
            p = _fmt(test["wilcoxon_p"], 3)
        row = [name, str(stats["stsb_test"]["n"]), _mean_sd_text(stats["stsb_dev"]), _mean_sd_text(stats["stsb_test"]),
               _mean_sd_text(stats["sts_avg"]), delta, wtl, p]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        f"Spearman x100, mean ± sd over seeds {', '.join(map(str, summary['seeds']))}; STS-B dev is the best during "
        f"training, STS avg the test average over the final tasks. Δ, W/T/L (wins/ties/losses) and the Wilcoxon "
        f"signed-rank p are paired by seed against {baseline}."
    )
    return "\n".join(lines) + "\n"


def plot_comparison(runs: list[dict], curves: dict, summary: dict, path: Path) -> None:
    """Left: mean STS-B dev curve per variant with its min–max band over seeds; right: the paired STS-B test
    differences against the baseline, one dot per seed, with their mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name in summary["per_variant"]:
        by_step: dict[int, list[float]] = {}
        for run in runs:
            if run["variant"] != name:
                continue
            for point in curves.get((name, run["seed"]), []):
                if point.get("stsb_dev_spearman") is not None:
                    by_step.setdefault(point["step"], []).append(point["stsb_dev_spearman"])
        if not by_step:
            continue
        steps = sorted(by_step)
        values = [np.array(by_step[step]) for step in steps]
        line = left.plot(steps, [v.mean() for v in values], marker="o", label=name)[0]
        left.fill_between(steps, [v.min() for v in values], [v.max() for v in values], alpha=0.2,
                          color=line.get_color())  # fmt: skip
    left.set(xlabel="step", ylabel="STS-B dev Spearman x100", title="STS-B dev (mean, min–max over seeds)")
    if left.get_legend_handles_labels()[0]:
        left.legend()

    baseline, names = summary["baseline"], list(summary["differences"])
    by_cell = {(run["variant"], run["seed"]): run for run in runs}
    for position, name in enumerate(names):
        diffs = [
            by_cell[name, seed]["stsb_test"] - by_cell[baseline, seed]["stsb_test"]
            for seed in summary["seeds"]
            if (name, seed) in by_cell and (baseline, seed) in by_cell
            and by_cell[name, seed]["stsb_test"] is not None and by_cell[baseline, seed]["stsb_test"] is not None
        ]  # fmt: skip
        right.scatter([position] * len(diffs), diffs, alpha=0.7)
        if diffs:
            right.hlines(np.mean(diffs), position - 0.25, position + 0.25, color="black")
    right.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    right.set_xticks(range(len(names)), names)
    right.set_xlim(-0.75, max(len(names), 1) - 0.25)
    right.set(ylabel=f"STS-B test − {baseline} (same seed)", title="paired differences (bar: mean)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


#: the λ statistics drawn per step (ρ0, the batch reference, is in comparison.json but not drawn)
LAMBDA_PANELS = ("lambda_mean", "lambda_above_half", "delta_aic_mean", "beta_hat_mean")


def seed_averaged_lambda(histories: dict[tuple[str, int], list[dict]]) -> dict[str, list[dict]]:
    """Per variant, WEINCE's λ statistics at each step averaged over the seeds that logged that step.

    ``histories``: ``(variant, seed) -> [history entries with lambda_mean, ...]`` (a run's ``results["history"]``).
    Returns ``variant -> [{"step", "seeds", <each DIAGNOSTIC_KEYS name>: mean}, ...]``; InfoNCE runs log none and
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


def plot_lambda_over_training(lambda_curves: dict[str, list[dict]], path: Path) -> None:
    """Mean λ, share of λ > ½, mean ΔAIC and mean β̂ per step, averaged over seeds, one line per WEINCE variant:
    what the mixing weight did, so that a result can be explained and not only stated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {"lambda_mean": "mean λ", "lambda_above_half": "share of λ > ½", "delta_aic_mean": "mean ΔAIC",
              "beta_hat_mean": "mean β̂"}  # fmt: skip
    figure, axes = plt.subplots(1, len(LAMBDA_PANELS), figsize=(4 * len(LAMBDA_PANELS), 3.2))
    for axis, key in zip(axes, LAMBDA_PANELS):
        for name, rows in lambda_curves.items():
            points = [(row["step"], row[key]) for row in rows if key in row]
            if points:
                axis.plot(*zip(*points), lw=1.2, label=name)
        axis.set(title=titles[key], xlabel="training step")
    axes[0].legend(fontsize=8)
    figure.suptitle("WEINCE's mixing weight during training (mean over seeds)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def compare(base, variants: dict[str, dict], seeds: list[int], output_dir, *, baseline: str = "infonce") -> dict:
    """Train (or read, or resume) every variant x seed cell and write comparison.json, .md and .png.

    Args:
        base: the :class:`TrainConfig` every variant starts from (its ``seed`` and ``output_dir`` are replaced).
        variants: name -> overrides (``{"loss": "weince", "weince.beta": 1.0}``), e.g. a subset of :data:`VARIANTS`.
        seeds: one run per variant and seed; runs with the same seed are paired.
        output_dir: the sweep folder; cell ``(v, s)`` is ``<output_dir>/<v>/seed-<s>``. Cells run seed by seed.
        baseline: the variant the others are compared against (must be one of ``variants``).

    Returns the summary written to ``comparison.json``.
    """
    from tqdm.auto import tqdm

    if not variants:
        raise ValueError("no variants to compare")
    if baseline not in variants:
        raise ValueError(f"the baseline {baseline!r} is not among the variants ({', '.join(variants)})")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    start = time.perf_counter()
    output_dir = Path(output_dir).expanduser()
    configs = cell_configs(base, variants, seeds, output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs, curves, lambda_histories = [], {}, {}
    # seed by seed (every variant of seed 1, then of seed 2, ...): a sweep stopped early holds complete pairs
    order = sorted(configs.items(), key=lambda cell: (seeds.index(cell[0][1]), list(variants).index(cell[0][0])))
    progress = tqdm(order, desc="compare", unit="run", dynamic_ncols=True)
    for (name, seed), config in progress:
        progress.set_postfix_str(f"{name} seed {seed}")
        results = run_cell(config)
        runs.append({"variant": name, "seed": seed, "output_dir": str(config.output_dir), **run_metrics(results)})
        curves[name, seed] = results.get("evaluations") or []
        lambda_histories[name, seed] = [entry for entry in results.get("history", []) if "lambda_mean" in entry]
    progress.close()
    summary = {
        "baseline": baseline,
        "seeds": list(seeds),
        "variants": {name: variants[name] for name in variants},
        "metrics": METRIC_LABELS,
        "runs": runs,
        **summarize(runs, baseline),
        "base_config": base.to_dict(),
        "git_commit": git_commit(),
        "wall_time_seconds": time.perf_counter() - start,
    }
    summary["curves"] = {f"{name}/seed-{seed}": points for (name, seed), points in curves.items()}
    summary["lambda_curves"] = seed_averaged_lambda(lambda_histories)
    (output_dir / "comparison.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (output_dir / "comparison.md").write_text(format_markdown(summary), encoding="utf-8")
    plot_comparison(runs, curves, summary, output_dir / "comparison.png")
    if summary["lambda_curves"]:  # the WEINCE variants: what λ did, averaged over seeds
        plot_lambda_over_training(summary["lambda_curves"], output_dir / "comparison_lambda.png")
    logger.debug("comparison written to %s (comparison.json, .md, .png)", output_dir)
    return summary


__all__ = ["VARIANTS", "compare", "load_variants", "paired_difference", "seed_averaged_lambda"]
