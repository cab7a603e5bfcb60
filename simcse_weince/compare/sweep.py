"""The sweep: every variant x seed cell trained (or read, or resumed), then summarised and written."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from simcse_weince.compare.cells import CellKind, cell_configs, check_cell
from simcse_weince.compare.plots import plot_comparison, plot_lambda_over_training
from simcse_weince.compare.report import format_markdown
from simcse_weince.compare.statistics import seed_averaged_lambda, summarize
from simcse_weince.provenance import clear_digests, git_commit

logger = logging.getLogger(__name__)


def compare(
    base, variants: dict[str, dict], seeds: list[int], output_dir, *, kind: CellKind, baseline: str = "infonce"
) -> dict:
    """Train (or read, or resume) every variant x seed cell and write comparison.json, .md and .png.

    Args:
        base: the config every variant starts from (its ``seed`` and ``output_dir`` are replaced), of
            ``kind.config_class``.
        variants: name -> overrides (``{"loss": "weince", "weince.beta": 1.0}``), e.g. a subset of
            ``kind.variants``.
        seeds: one run per variant and seed; runs with the same seed are paired.
        output_dir: the sweep folder; cell ``(v, s)`` is ``<output_dir>/<v>/seed-<s>``. Cells run seed by seed.
        kind: what a cell is: :data:`~simcse_weince.text.TEXT_CELLS` (a ``train`` run, STS metrics) for a
            :class:`~simcse_weince.text.config.TrainConfig`, :data:`~simcse_weince.vision.VISION_CELLS` (a
            ``vision train`` run, kNN and linear-probe metrics) for a
            :class:`~simcse_weince.vision.config.VisionTrainConfig`.
        baseline: the variant the others are compared against (must be one of ``variants``).

    Returns the summary written to ``comparison.json``.
    """
    kind.check_config(base, "compare")
    if not variants:
        raise ValueError("no variants to compare")
    if baseline not in variants:
        raise ValueError(f"the baseline {baseline!r} is not among the variants ({', '.join(variants)})")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and at least one, got {seeds}")
    start = time.perf_counter()
    output_dir = Path(output_dir).expanduser()
    configs = cell_configs(base, variants, seeds, output_dir)
    # seed by seed (every variant of seed 1, then of seed 2, ...): a sweep stopped early holds complete pairs
    order = sorted(configs.items(), key=lambda cell: (seeds.index(cell[0][1]), list(variants).index(cell[0][0])))
    clear_digests()  # a training file may have changed since the last call in this process
    states = {cell: check_cell(config, kind) for cell, config in order}  # every cell, before the first one trains
    output_dir.mkdir(parents=True, exist_ok=True)
    runs, curves, lambda_histories, cell_seconds = run_cells(order, states, kind)
    summary = {
        "kind": kind.name,
        "table_note": kind.table_note,
        "score_scale": {"name": kind.score_scale.name, "low": kind.score_scale.low, "high": kind.score_scale.high},
        "baseline": baseline,
        "seeds": list(seeds),
        "variants": {name: variants[name] for name in variants},
        "metrics": dict(kind.metric_labels),
        "deltas": list(kind.deltas),
        "runs": runs,
        **summarize(runs, baseline, tuple(kind.metric_labels)),
        "base_config": base.to_dict(),
        "git_commit": git_commit(),  # the summarising checkout's; each run has its training_commit
        "wall_time_seconds": time.perf_counter() - start,
        # the cells' own wall times (each a whole run, from set-up to card) added up: the grid's cost, also when
        # it ran over several calls
        "cell_wall_time_seconds": cell_seconds,
    }
    summary["curves"] = {f"{name}/seed-{seed}": points for (name, seed), points in curves.items()}
    summary["lambda_curves"] = seed_averaged_lambda(lambda_histories)
    write_outputs(output_dir, summary, runs, curves, kind)
    logger.debug("comparison written to %s (comparison.json, .md, .png)", output_dir)
    return summary


def run_cells(order: list, states: dict, kind: CellKind) -> tuple[list[dict], dict, dict, float]:
    """Train (or read, or resume) the cells in ``order``; ``(runs, curves, lambda_histories, cell_seconds)``: one
    row of metrics per cell, each cell's dev curve and λ history, and the cells' wall times added up."""
    from tqdm.auto import tqdm

    runs, curves, lambda_histories, cell_seconds = [], {}, {}, 0.0
    progress = tqdm(order, desc="compare", unit="run", dynamic_ncols=True)
    for (name, seed), config in progress:
        progress.set_postfix_str(f"{name} seed {seed}")
        try:
            results = kind.run_cell(config, states[name, seed])
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the cell saved a checkpoint at the step it stopped
            progress.close()
            logger.warning(
                "compare stopped in cell %s: run the same compare command again to continue (finished cells are "
                "read, the stopped one resumes from its checkpoint)", config.output_dir,
            )  # fmt: skip
            raise
        runs.append({"variant": name, "seed": seed, "output_dir": str(config.output_dir),
                     # the commit that trained the cell (its results.json's), not the summarising checkout's
                     "training_commit": (results.get("versions") or {}).get("git_commit"),
                     **kind.read_metrics(results)})  # fmt: skip
        curves[name, seed] = results.get("evaluations") or []
        lambda_histories[name, seed] = [entry for entry in results.get("history", []) if "lambda_mean" in entry]
        cell_seconds += results.get("wall_time_seconds") or 0.0
    progress.close()
    return runs, curves, lambda_histories, cell_seconds


def write_outputs(output_dir: Path, summary: dict, runs: list[dict], curves: dict, kind: CellKind) -> None:
    """comparison.json, .md, .png (and comparison_lambda.png for WEINCE variants) together or not at all: each is
    made under a staging name first, then all are renamed; a failure on the way leaves the earlier ones as they
    were, and a λ figure of an earlier sweep that has none now is removed (it would describe other runs)."""
    # staging names keep the suffix (matplotlib picks the format by it)
    staging = {name: output_dir / f".staging-{name}" for name in ("comparison.json", "comparison.md", "comparison.png")}
    lambda_figure = output_dir / "comparison_lambda.png"
    try:
        staging["comparison.json"].write_text(json.dumps(summary, indent=2), encoding="utf-8")
        staging["comparison.md"].write_text(format_markdown(summary), encoding="utf-8")
        plot_comparison(runs, curves, summary, staging["comparison.png"], dev_curve=kind.dev_curve)
        if summary["lambda_curves"]:  # the WEINCE variants: what λ did, averaged over seeds
            staging["comparison_lambda.png"] = output_dir / ".staging-comparison_lambda.png"
            plot_lambda_over_training(summary["lambda_curves"], staging["comparison_lambda.png"])
    except BaseException:
        for path in staging.values():
            path.unlink(missing_ok=True)
        raise
    for name, path in staging.items():
        os.replace(path, output_dir / name)
    if "comparison_lambda.png" not in staging:
        lambda_figure.unlink(missing_ok=True)
