"""Study 2 (docs/experiments.md): four variants x seeds 6-10 at batch sizes 64, 256 and 1,024 on ``cpu-cls``.

Every cell is an ordinary ``compare`` cell in ``<output-dir>/batch-<B>/<variant>/seed-<s>``, trained under the
budget the pilot chose (``budget.json`` of ``scripts/study/negatives_budget_search.py``), seed by seed across the batch
sizes, so a sweep stopped early holds complete pairs *and* complete trends. Then, from all the cells found:

- ``batch-<B>/comparison.{json,md,png}``: the paired grid at each batch size (``compare``'s own files);
- ``negatives.json``: per batch size, every variant against ``infonce`` and the WEINCE variants against
  ``infonce-hardness``; the trend (per seed, the difference at the largest batch minus at 64); the pre-registered
  pooled batch-64 analysis over seeds 1-10 (Study 1's cells with this study's);
- ``negatives.md`` (the tables) and ``negatives.png`` (paired difference against batch size, 95% intervals).

    OMP_NUM_THREADS=1 python scripts/study/negatives_study.py --seeds 6,7       # process 1 (and 8,9,10 in process 2)
    python scripts/study/negatives_study.py --seeds 6,7,8,9,10 --summarize-only  # read every cell, write the analyses
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from negatives_budget_search import BATCH_SIZES, cell_config, scaled_learning_rate  # noqa: E402

from simcse_weince.compare import compare, paired_difference  # noqa: E402
from simcse_weince.text import TEXT_CELLS, TEXT_VARIANTS  # noqa: E402

STUDY_VARIANTS = ("infonce", "weince", "infonce-hardness", "weince-hardness")
BASELINE, PEER = "infonce", "infonce-hardness"
METRIC = "stsb_test"  # the primary metric
#: (variant, baseline) pairs reported at each batch size and in the trend
CONTRASTS = tuple((name, BASELINE) for name in STUDY_VARIANTS[1:]) + (("weince", PEER), ("weince-hardness", PEER))


def decision(interval, better="beats", worse="worse") -> str:
    """Study 1's rule: the 95% interval above 0, below 0, or containing 0 (touching counts as containing)."""
    if interval is None:
        return "no interval (fewer than 2 pairs)"
    if interval[0] > 0:
        return better
    if interval[1] < 0:
        return worse
    return "no difference at this size"


def differences_by_seed(runs: list[dict], variant: str, baseline: str, metric: str = METRIC) -> dict[int, float]:
    """Per seed, ``variant`` minus ``baseline`` on ``metric``, for the seeds where both cells have a value."""
    values = {(run["variant"], run["seed"]): run.get(metric) for run in runs}
    seeds = sorted({seed for (_, seed) in values})
    return {seed: values[variant, seed] - values[baseline, seed] for seed in seeds
            if values.get((variant, seed)) is not None and values.get((baseline, seed)) is not None}  # fmt: skip


def contrast(runs: list[dict], variant: str, baseline: str) -> dict:
    """``compare.paired_difference`` of ``variant`` against ``baseline`` on the primary metric."""
    by_seed = differences_by_seed(runs, variant, baseline)
    values = {(run["variant"], run["seed"]): run.get(METRIC) for run in runs}
    seeds = sorted(by_seed)
    result = paired_difference([values[variant, s] for s in seeds], [values[baseline, s] for s in seeds])
    return {**result, "seeds": seeds}


def trend(runs_small: list[dict], runs_large: list[dict], variant: str, baseline: str) -> dict:
    """The trend rule: per seed, (variant - baseline) at the large batch minus the same at the small batch; the
    paired interval of the large-batch differences against the small-batch ones, over the seeds with both."""
    small = differences_by_seed(runs_small, variant, baseline)
    large = differences_by_seed(runs_large, variant, baseline)
    seeds = sorted(set(small) & set(large))
    return {**paired_difference([large[s] for s in seeds], [small[s] for s in seeds]), "seeds": seeds}


def analyse(runs_by_batch: dict[int, list[dict]], study1_runs: list[dict] | None) -> dict:
    """Everything ``negatives.json`` holds, from the runs of each batch size (``comparison.json``'s ``runs``)."""
    batch_sizes = sorted(runs_by_batch)
    per_batch = {
        str(batch): {f"{variant} - {baseline}": contrast(runs_by_batch[batch], variant, baseline)
                     for variant, baseline in CONTRASTS}
        for batch in batch_sizes
    }  # fmt: skip
    trends = {}
    if len(batch_sizes) > 1:
        small, large = batch_sizes[0], batch_sizes[-1]
        trends = {f"{variant} - {baseline}": {"from": small, "to": large,
                                             **trend(runs_by_batch[small], runs_by_batch[large], variant, baseline)}
                  for variant, baseline in CONTRASTS}  # fmt: skip
    pooled = {}
    if study1_runs is not None and 64 in runs_by_batch:
        pooled_runs = study1_runs + runs_by_batch[64]
        pooled = {f"{variant} - {BASELINE}": contrast(pooled_runs, variant, BASELINE)
                  for variant in ("weince", "infonce-hardness")}  # fmt: skip
    return {"metric": METRIC, "batch_sizes": batch_sizes, "per_batch": per_batch, "trend": trends,
            "pooled_batch_64": pooled}  # fmt: skip


def interval_text(result: dict) -> str:
    if result["mean"] is None:
        return "n/a"
    interval = result["ci95"]
    shown = "" if interval is None else f" [{interval[0]:+.2f}, {interval[1]:+.2f}]"
    return f"{result['mean']:+.2f}{shown}, {result['wins']}/{result['ties']}/{result['losses']}"


def format_markdown(analysis: dict) -> str:
    batch_sizes = analysis["batch_sizes"]
    lines = ["Paired STS-B test differences (Spearman × 100; mean [95% t-interval], wins/ties/losses over seeds):", "",
             "| contrast | " + " | ".join(f"batch {b}" for b in batch_sizes) + " | trend (largest − 64) |",
             "|---|" + "---|" * len(batch_sizes) + "---|"]  # fmt: skip
    for variant, baseline in CONTRASTS:
        key = f"{variant} - {baseline}"
        cells = [interval_text(analysis["per_batch"][str(b)][key]) for b in batch_sizes]
        trend_result = analysis["trend"].get(key)
        cells.append(interval_text(trend_result) if trend_result else "—")
        lines.append(f"| `{variant}` − `{baseline}` | " + " | ".join(cells) + " |")
    lines += ["", "Decisions (per batch size, an interval above 0 beats, below 0 is worse; trend: grows/shrinks):", ""]
    for variant, baseline in CONTRASTS:
        key = f"{variant} - {baseline}"
        per_batch = "; ".join(f"{b}: {decision(analysis['per_batch'][str(b)][key]['ci95'])}" for b in batch_sizes)
        trend_result = analysis["trend"].get(key)
        grows = decision(trend_result["ci95"], "grows", "shrinks") if trend_result else "—"
        lines.append(f"- `{variant}` − `{baseline}`: {per_batch}; trend: {grows.replace(' at this size', '')}.")
    if analysis["pooled_batch_64"]:
        lines += ["", "Pooled at batch 64 (seeds 1–5 of Study 1, bf16, with seeds 6–10 of this study, fp32):", ""]
        for key, result in analysis["pooled_batch_64"].items():
            lines.append(f"- `{key.replace(' - ', '` − `')}`: {interval_text(result)} over {result['n']} seeds; "
                         f"{decision(result['ci95'])}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(analysis: dict, path: Path) -> None:
    """Paired STS-B test difference against the batch size, 95% intervals, one line per contrast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    batch_sizes = analysis["batch_sizes"]
    for axis, baseline in zip(axes, (BASELINE, PEER)):
        contrasts = [(v, b) for v, b in CONTRASTS if b == baseline]
        for offset, (variant, _) in enumerate(contrasts):
            results = [analysis["per_batch"][str(b)][f"{variant} - {baseline}"] for b in batch_sizes]
            points = [(b * 1.06 ** (offset - 1), r) for b, r in zip(batch_sizes, results) if r["mean"] is not None]
            if not points:
                continue
            xs = [x for x, _ in points]
            means = [r["mean"] for _, r in points]
            low = [r["mean"] - (r["ci95"] or [r["mean"]] * 2)[0] for _, r in points]
            high = [(r["ci95"] or [r["mean"]] * 2)[1] - r["mean"] for _, r in points]
            axis.errorbar(xs, means, yerr=[low, high], marker="o", capsize=3, lw=1.2, label=variant)
        axis.axhline(0, color="grey", lw=0.8)
        axis.set_xscale("log", base=2)
        axis.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
        axis.set(xlabel="batch size (negatives per anchor + 1)", title=f"− {baseline}")
        axis.legend(fontsize=8)
    axes[0].set_ylabel("paired Δ STS-B test (×100)")
    figure.suptitle("Study 2: paired difference against the batch size (mean, 95% t-interval over seeds)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="runs/study/negatives")
    parser.add_argument("--seeds", default="6,7,8,9,10")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--budget", default="results/study/negatives-budget/budget.json", help="the pilot's choice")
    parser.add_argument("--study1", default="results/study/cpu-cls", help="Study 1's cpu-cls sweep (pooled analysis)")
    parser.add_argument("--mixed-precision", default="no", help="fp32 (see the protocol)")
    parser.add_argument("--summarize-only", action="store_true", help="no training: summarise the finished cells")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    seeds = [int(seed) for seed in args.seeds.split(",")]
    choice = json.loads(Path(args.budget).read_text())["choice"]
    output_dir = Path(args.output_dir)
    variants = {name: TEXT_VARIANTS[name] for name in STUDY_VARIANTS}
    bases = {batch: cell_config(batch, choice["num_epochs"], scaled_learning_rate(batch, choice["lr_scaling"]),
                                args.mixed_precision) for batch in args.batch_sizes}  # fmt: skip
    if not args.summarize_only:  # seed by seed across the batch sizes: complete pairs and trends first
        for seed in seeds:
            for batch, base in bases.items():
                compare(base, variants, [seed], output_dir / f"batch-{batch}", kind=TEXT_CELLS)
    runs_by_batch = {}
    for batch, base in bases.items():
        folder = output_dir / f"batch-{batch}"
        finished = [s for s in seeds if all((folder / v / f"seed-{s}" / "results.json").is_file() for v in variants)]
        if finished:  # compare reads finished cells (no training) and writes the per-batch files
            runs_by_batch[batch] = compare(base, variants, finished, folder, kind=TEXT_CELLS)["runs"]
    if not runs_by_batch:  # nothing to summarise yet (the grid runs seed by seed over several sessions)
        print(f"no seed of {args.seeds} has all {len(variants)} variants finished at any batch size yet")
        return
    study1 = Path(args.study1) / "comparison.json"
    study1_runs = json.loads(study1.read_text())["runs"] if study1.is_file() else None
    analysis = analyse(runs_by_batch, study1_runs)
    analysis["budget"] = choice
    analysis["training_commits"] = sorted({run.get("training_commit") or "unknown"
                                           for runs in runs_by_batch.values() for run in runs})  # fmt: skip
    (output_dir / "negatives.json").write_text(json.dumps(analysis, indent=2))
    (output_dir / "negatives.md").write_text(format_markdown(analysis))
    plot(analysis, output_dir / "negatives.png")
    print(format_markdown(analysis))


if __name__ == "__main__":
    main()
