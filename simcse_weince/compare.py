"""Compare losses fairly: a grid of ordinary training runs (variant x seed), paired by seed, summarised.

A *variant* is data: a name and the overrides it applies to a base :class:`~simcse_weince.text.config.TrainConfig`
(``{"loss": "weince", "weince.beta": 1.0}``). Every cell of the grid is a plain ``train`` run in
``<output_dir>/<variant>/seed-<s>/``; runs with the same seed share data order, initialisation and the dropout
masks of step 0 (the trainer seeds them), so the differences between variants are paired by seed. A finished cell
(``results.json``) is read, not retrained; a started one (``training_config.yaml``) is resumed; so a killed sweep
finishes when the same call runs again. Before the first cell trains, every cell is checked (:func:`check_cell`): a
finished one is read only if the settings and the data fingerprint recorded in its ``results.json`` are the cell's.
The summary goes to ``comparison.json``, ``comparison.md`` (a table to paste into a README) and ``comparison.png``.

Example::

    from simcse_weince.compare import VARIANTS, compare
    from simcse_weince.text.config import preset

    base = preset("cpu-demo", max_steps=100)
    variants = {name: VARIANTS[name] for name in ("infonce", "weince")}
    summary = compare(base, variants, seeds=[1, 2, 3], output_dir="runs/compare")
    print(summary["differences"]["weince"]["stsb_test"])  # mean, ci95, wins/ties/losses, wilcoxon_p, n

or ``simcse-weince compare --preset cpu-demo --losses infonce,weince --seeds 1,2,3 --output-dir runs/compare``.

The same grid runs SimCLR pretraining when the base config is a
:class:`~simcse_weince.vision.config.VisionTrainConfig` (``simcse-weince vision compare``): each cell is a
``vision train`` run followed by the frozen-feature evaluation (kNN@20, kNN@1, linear probe), and the variant
``untrained`` (``num_epochs: 0``) is the initialised backbone of the same seed, so "does training beat random
features?" is a paired difference too.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from simcse_weince.config import CONFIG_FILE, apply_overrides, changed_settings, load_config
from simcse_weince.provenance import git_commit, versions

logger = logging.getLogger(__name__)

#: the variants shipped: name -> overrides of the base config
VARIANTS: dict[str, dict] = {
    "infonce": {"loss": "infonce"},
    "weince": {"loss": "weince"},
    "weince-reference": {"loss": "weince", "weince.beta": 1.0},
    "infonce-hardness": {"loss": "infonce", "hardness_strength": 9.0},
    # ours, not the paper's (Study 2): WEINCE with the same per-negative hardness term
    "weince-hardness": {"loss": "weince", "hardness_strength": 9.0},
}

#: the vision variants shipped (``simcse-weince vision compare``); ``untrained`` trains 0 epochs: the seed's init
VISION_VARIANTS: dict[str, dict] = {
    "infonce": {"loss": "infonce"},
    "weince": {"loss": "weince"},
    "weince-reference": {"loss": "weince", "weince.beta": 1.0},
    "untrained": {"num_epochs": 0},
}

#: the text metrics compared: name in comparison.json -> label
METRIC_LABELS = {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg (final tasks)"}
METRICS = tuple(METRIC_LABELS)
#: the vision metrics compared (accuracy x100 on the test split, frozen backbone)
VISION_METRIC_LABELS = {"knn@20": "kNN@20", "knn@1": "kNN@1", "linear_probe": "linear probe"}
#: the k of the vision cells' kNN evaluation (the compared ones and k=5, for the record)
VISION_KNN_KS = (1, 5, 20)


def load_variants(path, builtins: dict[str, dict] | None = None) -> dict[str, dict]:
    """``builtins`` (default :data:`VARIANTS`) with the variants of a YAML/JSON file (``name: {setting: value}``)
    merged over them.

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

    extra = {str(name): flatten_overrides(overrides) for name, overrides in values.items()}
    return {**(VARIANTS if builtins is None else builtins), **extra}


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
            try:
                configs[name, seed] = apply_overrides(
                    variant_config, {"seed": seed, "output_dir": str(cell_dir(output_dir, name, seed))}
                )
            except (TypeError, ValueError) as error:
                raise ValueError(f"variant {name!r}, seed {seed}: {error}") from None
    return configs


@dataclass(frozen=True)
class CellState:
    """What a cell's folder holds, checked against the cell's settings by :func:`check_cell`."""

    results: dict | None  # a finished cell's results (reused as they are); None: the cell trains
    started: bool  # training_config.yaml is there: the cell resumes from its newest checkpoint
    fingerprint: dict | None  # the cell's training data (text: path, size, sha256 of the file); None: not checked


#: sha256 of the training files hashed by this compare() call: (path, size, mtime, inode) -> hex digest
_DIGESTS: dict[tuple, str] = {}


def file_fingerprint(path) -> dict:
    """``{"path", "size", "sha256"}`` of a file: what a finished cell records of its training data."""
    import hashlib

    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return {"path": str(path), "size": stat.st_size, "sha256": _DIGESTS[key]}


def text_data_fingerprint(config, *, download: bool = True) -> dict:
    """The fingerprint of a text cell's training file, resolved as ``train`` resolves it."""
    from simcse_weince.text.data import resolve_train_file

    return file_fingerprint(resolve_train_file(config, download=download))


def vision_data_fingerprint(config, *, download: bool = True) -> None:
    """None: the vision data sets are built in (torchvision, scikit-learn, FakeData) and named by the cell's
    settings (dataset, data_dir, train_size), which are compared; there is no file of the cell's own to hash."""
    return None


def _setting(config, name: str):
    if name.startswith("weince."):
        return getattr(config.weince, name.removeprefix("weince."))
    return getattr(config, name)


def _show(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


#: settings that do not make a cell: a sweep folder that was moved, or restored from an archive, holds the same cells
NOT_CELL_SETTINGS = ("output_dir",)


def _differences(config, recorded, not_applied: dict | None = None) -> dict[str, str]:
    """``name -> "name: old != new"`` for each setting in which ``config`` differs from the ``recorded`` one."""
    names = [name for name in changed_settings(config, recorded) if name not in NOT_CELL_SETTINGS]
    if "report_to" in names and "report_to" in (not_applied or {}):
        # TensorBoard was not installed: results.json records the trackers that ran, not the ones asked for
        if [name for name in config.report_to if name != "tensorboard"] == list(recorded.report_to):
            names.remove("report_to")
    return {name: f"{name}: {_show(_setting(recorded, name))} != {_show(_setting(config, name))}" for name in names}


def _recorded_config(config, values: dict):
    """The settings a cell recorded, as a config of ``config``'s class (earlier releases' names read too)."""
    from simcse_weince.vision.config import DEPRECATED_NAMES, VisionTrainConfig

    aliases = DEPRECATED_NAMES if isinstance(config, VisionTrainConfig) else None
    return apply_overrides(type(config)(), values, aliases)


def _read_finished(folder: Path, config, task: Task) -> dict | None:
    """A cell's results.json when it is a valid result of ``task``; None when the cell has not finished. A file
    that is not a valid result (half-written, not UTF-8, not a JSON object, no settings or scores) is named in a
    warning and the cell counts as unfinished: it is trained (or resumed) again."""
    results_file = folder / "results.json"
    if not results_file.is_file():
        return None
    problem = None
    try:
        results = json.loads(results_file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        problem = f"not UTF-8 text (invalid byte at offset {error.start})"
    except json.JSONDecodeError as error:  # e.g. killed while writing it
        problem = f"not valid JSON ({error.msg} at line {error.lineno})"
    else:
        problem = _invalid_result(results, config, task)
    if problem is not None:
        logger.warning("%s is not a valid result: %s; the cell is trained again", results_file, problem)
        return None
    return results


def _invalid_result(results, config, task: Task) -> str | None:
    """Why ``results`` is not the results.json of a finished ``task`` cell (None when it is)."""
    if not isinstance(results, dict):
        return f"it holds a JSON {'array' if isinstance(results, list) else type(results).__name__}, not an object"
    if not results:
        return "it is empty ({})"
    if not isinstance(results.get("config"), dict):
        return "it records no settings ('config')"
    if not isinstance(results.get("history"), list):
        return "it records no training history ('history')"
    try:
        _recorded_config(config, results["config"])
        task.read_metrics(results)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def check_cell(config, task: Task | None = None) -> CellState:
    """A cell's folder checked against the cell's settings; :func:`compare` checks every cell before the first
    one trains.

    A finished cell (a valid results.json) is reused only when the settings recorded in its results.json (and in
    its training_config.yaml, when there is one) are the cell's, and, for text cells, when its training file
    still has the recorded size and sha256; a started one (training_config.yaml) resumes only under the cell's
    settings. Otherwise ValueError names the cell and each differing setting. A results.json written before
    fingerprints were recorded is reused with a warning (the data cannot be checked); so is a finished cell whose
    training file is not here (restored from an archive to be read).
    """
    task = task or task_for(config)
    folder = Path(config.output_dir)
    differences, started = {}, (folder / CONFIG_FILE).is_file()
    if started:
        differences.update(_differences(config, load_config(type(config), folder / CONFIG_FILE)))
    results = _read_finished(folder, config, task)
    fingerprint = None
    if results is None:
        fingerprint = task.data_fingerprint(config)  # a missing training file fails here, before any cell trains
    else:
        recorded = _recorded_config(config, results["config"])
        differences.update(_differences(config, recorded, results.get("not_applied")))
        try:
            fingerprint = task.data_fingerprint(config, download=False)
        except (OSError, ValueError) as error:
            logger.warning("cannot check the training data of %s (%s); reusing it: its settings match", folder,
                           error)  # fmt: skip
        saved = results.get("data_fingerprint")
        if fingerprint is not None and not (isinstance(saved, dict) and {"size", "sha256"} <= set(saved)):
            logger.warning("%s records no data fingerprint (written by an earlier version): its training data "
                           "cannot be checked; reusing it, its settings match", folder / "results.json")  # fmt: skip
        elif fingerprint is not None:
            old, new = (saved["size"], str(saved["sha256"])), (fingerprint["size"], fingerprint["sha256"])
            if old != new:
                differences["training data"] = (
                    f"training data {fingerprint['path']}: {old[0]} bytes, sha256 {old[1][:12]} != {new[0]} bytes, "
                    f"sha256 {new[1][:12]}"
                )
    if differences:
        raise ValueError(
            f"cell {folder} was {'trained' if results is not None else 'started'} with different settings: "
            f"{', '.join(differences.values())}; use another --output-dir, or delete {folder} to train the cell again"
        )
    if results is not None:
        logger.info("%s is finished; reading its results", folder)
    return CellState(results, started, fingerprint)


def _write_results(folder: Path, results: dict) -> None:
    """results.json, atomically: a cell killed while writing it keeps no half file."""
    staging = folder / "results.json.tmp"
    staging.write_text(json.dumps(results, indent=2), encoding="utf-8")
    staging.replace(folder / "results.json")


def run_cell(config, state: CellState | None = None) -> dict:
    """Train one text cell, or read / resume it (see :func:`check_cell`): finished -> read; started -> resume;
    else fresh. The cell's results.json records its settings and ``data_fingerprint`` (path, size and sha256 of
    the training file), which a rerun checks before reusing the cell."""
    state = state or check_cell(config, TEXT_TASK)
    if state.results is not None:
        return state.results
    from simcse_weince.text.train import train

    fingerprint = text_data_fingerprint(config)  # now, as the cell reads it (a cache hit when nothing changed)
    if state.fingerprint is not None and fingerprint["sha256"] != state.fingerprint["sha256"]:
        raise ValueError(
            f"the training file {fingerprint['path']} changed while the comparison ran (sha256 "
            f"{state.fingerprint['sha256'][:12]} when it started, {fingerprint['sha256'][:12]} now): the cells "
            f"trained so far used the earlier content; restore it, or compare in another --output-dir"
        )
    if state.started:
        logger.info("%s was interrupted; resuming it", config.output_dir)
    results = train(config, resume=True if state.started else None)
    if results:  # the main process
        results["data_fingerprint"] = fingerprint
        _write_results(Path(config.output_dir), results)
    return results


def run_vision_cell(config, state: CellState | None = None) -> dict:
    """Pretrain one vision cell (or read / resume it, as :func:`run_cell`), then evaluate its last checkpoint.

    The cell's ``results.json`` holds the config, the step, the training history (loss and λ statistics) and the
    frozen-feature evaluation (:func:`~simcse_weince.vision.evaluate.evaluate_checkpoint`: kNN at
    :data:`VISION_KNN_KS`, linear probe over 3 probe seeds). It is written last, atomically: a cell killed during
    its evaluation resumes at its final checkpoint and only evaluates again.
    """
    state = state or check_cell(config, VISION_TASK)
    folder = Path(config.output_dir)
    results = state.results
    if results is not None:
        return results
    from simcse_weince.training.runs import read_trainer_state
    from simcse_weince.vision.evaluate import evaluate_checkpoint
    from simcse_weince.vision.train import train

    if state.started:
        logger.info("%s was interrupted; resuming it", folder)
    run = train(config, resume=True if state.started else None)
    state = read_trainer_state(Path(run["checkpoint"]))
    evaluation_start = time.perf_counter()
    evaluation = evaluate_checkpoint(run["checkpoint"], ks=VISION_KNN_KS)
    evaluation_seconds = time.perf_counter() - evaluation_start
    results = {
        "config": config.to_dict(),
        "step": state["step"],
        "train_time_seconds": state["train_seconds"],
        # the whole cell, as in a text run's results.json: pretraining (set-up, steps, checkpoints) + evaluation
        "wall_time_seconds": run["wall_time_seconds"] + evaluation_seconds,
        "final_evaluation_seconds": evaluation_seconds,
        "history": state["history"],
        "evaluation": evaluation,
        "versions": versions(),  # the training code's commit too: a re-summary reads it, never rewrites it
    }
    _write_results(folder, results)
    return results


def run_metrics(results: dict) -> dict:
    """The compared numbers of one text run's results: best STS-B dev during training, STS-B test, STS avg."""
    sts_test = results.get("sts_test") or {}
    return {
        "stsb_dev": results.get("best_stsb_dev_spearman_during_training"),
        "stsb_test": results.get("stsb_test_spearman"),
        "sts_avg": sts_test.get("avg"),
    }


def vision_run_metrics(results: dict) -> dict:
    """The compared numbers of one vision cell, accuracy x100: kNN@20, kNN@1, linear probe (mean of probe seeds)."""
    evaluation = results["evaluation"]
    return {
        "knn@20": 100 * evaluation["knn_accuracy"]["20"],
        "knn@1": 100 * evaluation["knn_accuracy"]["1"],
        "linear_probe": 100 * evaluation["linear_accuracy"]["mean"],
    }


@dataclass(frozen=True)
class Task:
    """What one kind of cell runs and which of its numbers are compared."""

    name: str
    run_cell: Callable[..., dict]  # (config, CellState) -> the cell's results (trained, resumed or read)
    read_metrics: Callable[[dict], dict]  # results -> {metric: value}
    metric_labels: dict[str, str]  # the compared metrics, in table order
    deltas: tuple[str, ...]  # the metrics whose paired differences the table and the dot plot show
    dev_curve: str | None  # the key of results["evaluations"] drawn per step (None: no curve)
    data_fingerprint: Callable[..., dict | None]  # config -> what a finished cell records of its data


TEXT_TASK = Task("text", run_cell, run_metrics, METRIC_LABELS, ("stsb_test",), "stsb_dev_spearman",
                 text_data_fingerprint)  # fmt: skip
VISION_TASK = Task("vision", run_vision_cell, vision_run_metrics, VISION_METRIC_LABELS, ("knn@20", "linear_probe"),
                   None, vision_data_fingerprint)  # fmt: skip


def task_for(config) -> Task:
    """The task of a base config: text for a TrainConfig, vision for a VisionTrainConfig."""
    from simcse_weince.vision.config import VisionTrainConfig

    return VISION_TASK if isinstance(config, VisionTrainConfig) else TEXT_TASK


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


def summarize(runs: list[dict], baseline: str, metrics=METRICS) -> dict:
    """Per-variant mean/sd of each metric and each other variant's paired differences against ``baseline``."""
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
    if summary.get("task", "text") == "text":
        what = ("Spearman x100; STS-B dev is the best during training, STS avg the test average over the final "
                "tasks")  # fmt: skip
    else:
        what = "accuracy x100 of the frozen backbone on the test split (linear probe: mean of its probe seeds)"
    seeds = f"seed{'s' if len(summary['seeds']) > 1 else ''} {', '.join(map(str, summary['seeds']))}"
    lines.append(
        f"{what}. Mean ± sd over {seeds}; Δ, W/T/L (wins/ties/losses) and "
        f"the Wilcoxon signed-rank p are paired by seed against {baseline}."
    )
    return "\n".join(lines) + "\n"


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
        base: the config every variant starts from (its ``seed`` and ``output_dir`` are replaced): a
            :class:`~simcse_weince.text.config.TrainConfig` (STS metrics) or a
            :class:`~simcse_weince.vision.config.VisionTrainConfig` (kNN and linear-probe metrics).
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
    task = task_for(base)
    output_dir = Path(output_dir).expanduser()
    configs = cell_configs(base, variants, seeds, output_dir)
    # seed by seed (every variant of seed 1, then of seed 2, ...): a sweep stopped early holds complete pairs
    order = sorted(configs.items(), key=lambda cell: (seeds.index(cell[0][1]), list(variants).index(cell[0][0])))
    _DIGESTS.clear()  # a training file may have changed since the last call in this process
    states = {cell: check_cell(config, task) for cell, config in order}  # every cell, before the first one trains
    output_dir.mkdir(parents=True, exist_ok=True)
    runs, curves, lambda_histories, cell_seconds = [], {}, {}, 0.0
    progress = tqdm(order, desc="compare", unit="run", dynamic_ncols=True)
    for (name, seed), config in progress:
        progress.set_postfix_str(f"{name} seed {seed}")
        try:
            results = task.run_cell(config, states[name, seed])
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
                     **task.read_metrics(results)})  # fmt: skip
        curves[name, seed] = results.get("evaluations") or []
        lambda_histories[name, seed] = [entry for entry in results.get("history", []) if "lambda_mean" in entry]
        cell_seconds += results.get("wall_time_seconds") or 0.0
    progress.close()
    summary = {
        "task": task.name,
        "baseline": baseline,
        "seeds": list(seeds),
        "variants": {name: variants[name] for name in variants},
        "metrics": dict(task.metric_labels),
        "deltas": list(task.deltas),
        "runs": runs,
        **summarize(runs, baseline, tuple(task.metric_labels)),
        "base_config": base.to_dict(),
        "git_commit": git_commit(),  # the summarising checkout's; each run has its training_commit
        "wall_time_seconds": time.perf_counter() - start,
        # the cells' own training wall times added up: the grid's cost, also when it ran over several calls
        "cell_wall_time_seconds": cell_seconds,
    }
    summary["curves"] = {f"{name}/seed-{seed}": points for (name, seed), points in curves.items()}
    summary["lambda_curves"] = seed_averaged_lambda(lambda_histories)
    (output_dir / "comparison.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    (output_dir / "comparison.md").write_text(format_markdown(summary), encoding="utf-8")
    plot_comparison(runs, curves, summary, output_dir / "comparison.png", dev_curve=task.dev_curve)
    if summary["lambda_curves"]:  # the WEINCE variants: what λ did, averaged over seeds
        plot_lambda_over_training(summary["lambda_curves"], output_dir / "comparison_lambda.png")
    logger.debug("comparison written to %s (comparison.json, .md, .png)", output_dir)
    return summary


__all__ = ["VARIANTS", "VISION_VARIANTS", "compare", "load_variants", "paired_difference", "seed_averaged_lambda"]
