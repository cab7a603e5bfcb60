"""The figures of a comparison: ``comparison.png`` (dev curves or metric means, and the paired differences) and
``comparison_lambda.png`` (WEINCE's mixing weight during training)."""

from __future__ import annotations

from pathlib import Path


def _paired_values(runs: list[dict], summary: dict, name: str, metric: str) -> list[float]:
    """The variant's per-seed differences from the baseline on one metric (seeds where both have a value)."""
    by_cell = {(run["variant"], run["seed"]): run for run in runs}
    baseline = summary["baseline"]
    return [
        by_cell[name, seed][metric] - by_cell[baseline, seed][metric]
        for seed in summary["seeds"]
        if (name, seed) in by_cell and (baseline, seed) in by_cell
        and by_cell[name, seed][metric] is not None and by_cell[baseline, seed][metric] is not None
    ]  # fmt: skip


def plot_comparison(runs: list[dict], curves: dict, summary: dict, path: Path, *, dev_curve=None) -> None:
    """Left: the mean dev curve per variant with its min–max band over seeds (``dev_curve``: the evaluations'
    key, text: STS-B dev), or without a curve each metric's mean ± sd per variant; right: the paired differences
    of the delta metrics against the baseline, one dot per seed, with their mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels, deltas = summary["metrics"], summary.get("deltas", ["stsb_test"])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if dev_curve is not None:
        for name in summary["per_variant"]:
            by_step: dict[int, list[float]] = {}
            for run in runs:
                if run["variant"] != name:
                    continue
                for point in curves.get((name, run["seed"]), []):
                    if point.get(dev_curve) is not None:
                        by_step.setdefault(point["step"], []).append(point[dev_curve])
            if not by_step:
                continue
            steps = sorted(by_step)
            values = [np.array(by_step[step]) for step in steps]
            line = left.plot(steps, [v.mean() for v in values], marker="o", label=name)[0]
            left.fill_between(steps, [v.min() for v in values], [v.max() for v in values], alpha=0.2,
                              color=line.get_color())  # fmt: skip
        left.set(xlabel="step", ylabel="STS-B dev Spearman x100", title="STS-B dev (mean, min–max over seeds)")
    else:
        names = list(summary["per_variant"])
        for offset, metric in enumerate(labels):
            stats = [summary["per_variant"][name][metric] for name in names]
            positions = np.arange(len(names)) + (offset - (len(labels) - 1) / 2) * 0.2
            means = [np.nan if s["mean"] is None else s["mean"] for s in stats]
            spreads = [0.0 if s["sd"] is None else s["sd"] for s in stats]
            left.errorbar(positions, means, yerr=spreads, fmt="o", capsize=3, label=labels[metric])
        left.set_xticks(range(len(names)), names)
        left.set(ylabel="accuracy x100", title="mean ± sd over seeds")
    if left.get_legend_handles_labels()[0]:
        left.legend()

    names = list(summary["differences"])
    for offset, metric in enumerate(deltas):
        shift = (offset - (len(deltas) - 1) / 2) * 0.25
        for position, name in enumerate(names):
            diffs = _paired_values(runs, summary, name, metric)
            right.scatter([position + shift] * len(diffs), diffs, alpha=0.7, color=f"C{offset}",
                          label=labels[metric] if position == 0 and len(deltas) > 1 else None)  # fmt: skip
            if diffs:
                right.hlines(np.mean(diffs), position + shift - 0.1, position + shift + 0.1, color="black")
    right.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    right.set_xticks(range(len(names)), names)
    right.set_xlim(-0.75, max(len(names), 1) - 0.25)
    measured = labels[deltas[0]] if len(deltas) == 1 else "metric"
    right.set(ylabel=f"{measured} − {summary['baseline']} (same seed)", title="paired differences (bar: mean)")
    if len(deltas) > 1:
        right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


#: the λ statistics drawn per step (ρ0, the batch reference, is in comparison.json but not drawn)
LAMBDA_PANELS = ("lambda_mean", "lambda_above_half", "delta_aic_mean", "beta_hat_mean")


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
