"""The text of a comparison: ``comparison.md`` (:func:`format_markdown`) and the study report that README and
docs/experiments.md show (:func:`study_report`: the table, each difference's decision, λ statistics, cost)."""

from __future__ import annotations

from pathlib import Path

from simcse_weince.compare.cells import ACCURACY_X100, CORRELATION_X100, ScoreScale
from simcse_weince.compare.statistics import summarize
from simcse_weince.records import read_json


def _fmt(value, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mean_sd_text(stat: dict) -> str:
    if stat["mean"] is None:
        return "n/a"
    return _fmt(stat["mean"]) + (f" ± {_fmt(stat['sd'])}" if stat["sd"] is not None else "")


def format_markdown(summary: dict) -> str:
    """The comparison as a markdown table: mean ± sd per metric, then each delta metric's paired difference
    against the baseline (mean [95% t-interval], wins/ties/losses, Wilcoxon p)."""
    baseline, labels = summary["baseline"], summary["metrics"]
    deltas = summary.get("deltas", ["stsb_test"])
    header = ["variant", "n", *labels.values()]
    for metric in deltas:
        header += [f"Δ {labels[metric]} vs {baseline} [95% CI]", "W/T/L", "Wilcoxon p"]
    lines = ["| " + " | ".join(header) + " |", "|:--|" + "--:|" * (1 + len(labels)) + "--:|:-:|--:|" * len(deltas)]
    for name, stats in summary["per_variant"].items():
        row = [name, str(stats[deltas[0]]["n"]), *(_mean_sd_text(stats[metric]) for metric in labels)]
        for metric in deltas:
            if name == baseline:
                row += ["—", "—", "—"]
                continue
            difference = summary["differences"][name][metric]
            ci = difference["ci95"]
            delta = f"{difference['mean']:+.2f}" if difference["mean"] is not None else "n/a"
            if ci is not None:
                delta += f" [{ci[0]:+.2f}, {ci[1]:+.2f}]"
            wtl = f"{difference['wins']}/{difference['ties']}/{difference['losses']}"
            row += [delta, wtl, _fmt(difference["wilcoxon_p"], 3)]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    what = summary.get("table_note") or _ARCHIVED_KINDS[_archived_kind(summary)][1]
    seeds = f"seed{'s' if len(summary['seeds']) > 1 else ''} {', '.join(map(str, summary['seeds']))}"
    lines.append(
        f"{what}. Mean ± sd over {seeds}; Δ, W/T/L (wins/ties/losses) and "
        f"the Wilcoxon signed-rank p are paired by seed against {baseline}."
    )
    return "\n".join(lines) + "\n"


#: the λ statistics of the study report: name in the λ curves -> label
LAMBDA_KEYS = {"lambda_mean": "mean λ", "lambda_above_half": "share λ > ½", "rho0": "ρ₀",
               "delta_aic_mean": "mean ΔAIC", "beta_hat_mean": "mean β̂"}  # fmt: skip


def decision(interval) -> str:
    """docs/experiments.md's decision from the 95% interval of a paired difference."""
    if interval is None:
        return "no interval (fewer than 2 pairs)"
    low, high = interval
    if low > 0:
        return "beats the baseline"
    if high < 0:
        return "worse than the baseline"
    return "no difference at this size"


def difference_lines(differences: dict, baseline: str, summary: dict, *, record: bool) -> list[str]:
    """One line per variant and Δ metric: the paired mean, its interval and the decision (``record``: also W/T/L)."""
    lines = []
    for name, metrics in differences.items():
        for metric in summary.get("deltas", ["stsb_test"]):
            difference = metrics[metric]
            if difference["mean"] is None:  # no pairs for this metric
                continue
            interval = difference["ci95"]
            shown = "" if interval is None else f" [{interval[0]:+.2f}, {interval[1]:+.2f}]"
            tally = f" ({difference['wins']}/{difference['ties']}/{difference['losses']})" if record else ""
            lines.append(f"- `{name}` − `{baseline}`, {summary['metrics'][metric]}: {difference['mean']:+.2f}{shown}"
                         f"{tally}; {decision(interval)}.")  # fmt: skip
    return lines


def against(summary: dict, other: str) -> list[str]:
    """Each other variant's paired differences against ``other`` (a second baseline, e.g. the peer loss)."""
    if other not in {run["variant"] for run in summary["runs"]}:
        return []
    differences = summarize(summary["runs"], other, tuple(summary["metrics"]))["differences"]
    return difference_lines(differences, other, summary, record=True)


#: comparison.json files written before a sweep recorded its kind's table note and score scale (issue 55; the
#: archives under results/) name their kind as "task" (none: the text trainer's, the only kind then): what their
#: numbers are and the range they take
_ARCHIVED_KINDS = {
    "text": (CORRELATION_X100, "Spearman x100; STS-B dev is the best during training, STS avg the test average over "
             "the final tasks"),
    "vision": (ACCURACY_X100, "accuracy x100 of the frozen backbone on the test split (linear probe: mean of its "
               "probe seeds)"),
}  # fmt: skip


def _archived_kind(summary: dict) -> str:
    kind = summary.get("kind", summary.get("task", "text"))
    if kind not in _ARCHIVED_KINDS:
        raise ValueError(f"a comparison of kind {kind!r} records no table_note or score_scale")
    return kind


def _score_scale(summary: dict) -> ScoreScale:
    recorded = summary.get("score_scale")
    if isinstance(recorded, dict):
        return ScoreScale(str(recorded.get("name")), float(recorded["low"]), float(recorded["high"]))
    return _ARCHIVED_KINDS[_archived_kind(summary)][0]


def check_archived_scores(summary: dict, source: Path) -> None:
    """ValueError naming ``source``, the run and the metric when a run's score of a summary cannot have been measured
    (not a number, or outside the scale of its task: a correlation x100 within ±100, an accuracy x100 within 0-100)."""
    scale = _score_scale(summary)
    for run in summary["runs"]:
        for metric, label in summary["metrics"].items():
            value = run.get(metric)
            if value is not None and (problem := scale.problem(value)):
                raise ValueError(
                    f"{source}: run {run.get('variant')!r} seed {run.get('seed')}: its {metric} ({label}) is {problem}"
                )


def study_report(folder: Path, others: tuple[str, ...] = ()) -> str:
    """The markdown of one sweep folder's results, from its comparison.json and comparison.md: the paired table,
    each difference's decision (also against each of ``others``), the λ statistics of each WEINCE variant
    averaged over seeds and steps, and the cells' commit and wall time."""
    folder = Path(folder)
    summary = read_json(folder / "comparison.json", "comparison")  # a key given twice is refused, naming it
    check_archived_scores(summary, folder / "comparison.json")
    lines = [f"### `{folder.name}`", "", (folder / "comparison.md").read_text(encoding="utf-8").rstrip(), ""]
    lines += difference_lines(summary["differences"], summary["baseline"], summary, record=False)
    for other in others:
        lines += against(summary, other)
    curves = summary.get("lambda_curves") or {}
    if curves:
        lines += ["", "| WEINCE variant | " + " | ".join(LAMBDA_KEYS.values()) + " |",
                  "|---|" + "---:|" * len(LAMBDA_KEYS)]  # fmt: skip
        for name, rows in curves.items():
            entries = []  # the row's table entries ("cell" means a grid cell here: variant x seed)
            for key in LAMBDA_KEYS:
                values = [row[key] for row in rows if key in row]
                entries.append(f"{sum(values) / len(values):.3f}" if values else "n/a")
            lines.append(f"| `{name}` | " + " | ".join(entries) + " |")
        lines.append("")
        lines.append("(per-step values averaged over the seeds, then over the steps)")
    seconds = summary.get("cell_wall_time_seconds")
    # the commits that trained the runs (each run's training_commit); a summary older than that field records
    # only the checkout that summarised it, which is what it then says
    trained = sorted({run["training_commit"][:7] for run in summary["runs"] if run.get("training_commit")})
    if trained:
        provenance = f"trained at commit{'s' if len(trained) > 1 else ''} " + ", ".join(f"`{c}`" for c in trained)
    else:
        provenance = f"summarised at commit `{(summary.get('git_commit') or 'unknown')[:7]}`"
    lines += ["", f"{len(summary['runs'])} runs {provenance}"
              + (f"; their wall times (whole runs) add up to {seconds / 3600:.2f} h." if seconds else ".")]  # fmt: skip
    return "\n".join(lines) + "\n"
