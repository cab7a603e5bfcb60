"""The cells of a comparison: each cell's config and folder, and the check that a finished or started cell may be
reused (:func:`check_cell`). What one kind of cell is (its config class, built-in variants, what it runs and
reports) is a :class:`CellKind` that its trainer package supplies (:data:`simcse_weince.text.TEXT_CELLS`,
:data:`simcse_weince.vision.VISION_CELLS`); nothing here imports a trainer package."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from simcse_weince.paths import child_folder
from simcse_weince.records import FIX, RecordError, check_count, loads_json, read_yaml, type_name
from simcse_weince.settings import (
    CONFIG_FILE,
    apply_overrides,
    changed_settings,
    flatten_overrides,
    load_config,
    recorded_settings,
    setting_text,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreScale:
    """The range a compared score can take: a value outside it was edited or mixed up, not measured."""

    name: str  # for messages: "a correlation x100"
    low: float
    high: float

    def problem(self, value) -> str | None:
        """Why ``value`` cannot be a score of this scale (not a finite number, or outside the range), as
        ``"<value>, <reason>"``; None when it can be."""
        if not _is_number(value):
            return f"{value!r}, not a number"
        if self.low <= value <= self.high:
            return None
        return f"{value!r}, outside the range of {self.name} ({self.low:g} to {self.high:g})"


#: Spearman or Pearson correlations x100 (the text cells' STS scores)
CORRELATION_X100 = ScoreScale("a correlation x100", -100.0, 100.0)
#: accuracies x100 (the vision cells' kNN and linear-probe scores)
ACCURACY_X100 = ScoreScale("an accuracy x100", 0.0, 100.0)


@dataclass(frozen=True, eq=False)
class CellKind:
    """One kind of cell, as its trainer package hands it to compare: which config it takes, its built-in variants,
    what a cell runs and which of its numbers are compared, and what its ``compare`` command starts from
    (:func:`simcse_weince.compare.cli.add_compare_command`, which its trainer's CLI module calls)."""

    name: str  # "text", "vision": comparison.json's "kind"
    config_class: type  # the base config's class (TrainConfig, VisionTrainConfig)
    variants: Mapping[str, dict]  # the built-in variants: name -> overrides of the base config
    aliases: Mapping[str, str] | None  # deprecated setting names read in a recorded config (None: none)
    run_cell: Callable[..., dict]  # (config, CellState) -> the cell's results (trained, resumed or read)
    read_metrics: Callable[[dict], dict]  # results -> {metric: value}
    metric_labels: dict[str, str]  # the compared metrics, in table order
    deltas: tuple[str, ...]  # the metrics whose paired differences the table and the dot plot show
    dev_curve: str | None  # the key of results["evaluations"] drawn per step (None: no curve)
    data_fingerprint: Callable[..., dict | None]  # config -> what a finished cell records of its data
    score_scale: ScoreScale  # the range of every compared metric and of the dev curve (an archived cell's checked)
    table_note: str  # what the table's numbers are (the sentence under comparison.md's table)
    # the command line: base_config(preset) (or base_config() for a kind without presets) < --config FILE < flags
    base_config: Callable[..., object]  # -> the base config of a sweep (text: preset(name); vision: the defaults)
    presets: tuple[str, ...]  # the names base_config takes (--preset), the first its default; (): it takes none
    field_choices: Mapping[str, tuple]  # the allowed values of some config fields, shown in their flags' help

    def check_config(self, config, caller: str) -> None:
        """TypeError unless ``config`` is a config of this kind (e.g. a VisionTrainConfig given to text cells)."""
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{caller}(kind={self.name.upper()}_CELLS) needs a {self.config_class.__name__}, got "
                f"{type(config).__name__}"
            )


def load_variants(path, builtins: Mapping[str, dict]) -> dict[str, dict]:
    """``builtins`` (a kind's variants, e.g. ``TEXT_CELLS.variants``) with the variants of a YAML/JSON file
    (``name: {setting: value}``) merged over them.

    Example: a file holding ``q03: {loss: weince, weince: {quantile: 0.3}}`` adds the variant ``q03``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"variants file {path} not found")
    values = read_yaml(path, "variants file") or {}  # a variant or a setting named twice is refused, naming it
    if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
        raise ValueError(f"variants file {path} must map each variant name to a mapping of settings")
    extra = {str(name): flatten_overrides(overrides) for name, overrides in values.items()}
    return {**builtins, **extra}


def cell_dir(output_dir, variant: str, seed: int) -> Path:
    """The run folder of one cell: ``<output_dir>/<variant>/seed-<seed>`` (a variant name that would leave
    ``output_dir`` is refused: :func:`~simcse_weince.paths.child_folder`)."""
    return child_folder(output_dir, variant, "variant") / f"seed-{int(seed)}"


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


#: settings that do not make a cell: a sweep folder that was moved, or restored from an archive, holds the same cells
NOT_CELL_SETTINGS = ("output_dir",)


def _differences(config, recorded, not_applied: dict | None = None) -> dict[str, str]:
    """``name -> "name: old != new"`` for each setting in which ``config`` differs from the ``recorded`` one."""
    names = [name for name in changed_settings(config, recorded) if name not in NOT_CELL_SETTINGS]
    if "report_to" in names and "report_to" in (not_applied or {}):
        # TensorBoard was not installed: results.json records the trackers that ran, not the ones asked for
        if [name for name in config.report_to if name != "tensorboard"] == list(recorded.report_to):
            names.remove("report_to")
    return {name: f"{name}: {setting_text(recorded, name)} != {setting_text(config, name)}" for name in names}


def _recorded_config(config, values: dict, kind: CellKind):
    """The settings a cell recorded, as a config of ``config``'s class (the names of earlier releases, the kind's
    ``aliases``, read too)."""
    return apply_overrides(type(config)(), recorded_settings(type(config), values), kind.aliases)


def _read_finished(folder: Path, config, kind: CellKind) -> dict | None:
    """A cell's results.json when it is a valid result of ``kind``; None when the cell has not finished. A file
    that is not a valid result (half-written, not UTF-8, not a JSON object, no settings or scores) is named in a
    warning and the cell counts as unfinished: it is trained (or resumed) again."""
    results_file = folder / "results.json"
    if not results_file.is_file():
        return None
    problem = None
    try:
        results = loads_json(results_file.read_text(encoding="utf-8"), results_file)  # a key twice: refused
    except UnicodeDecodeError as error:
        problem = f"not UTF-8 text (invalid byte at offset {error.start})"
    except RecordError as error:  # e.g. killed while writing it, or a key given twice
        problem = str(error).removeprefix(f"{results_file} ").removesuffix(f"; {FIX}")
    else:
        problem = _invalid_result(results, config, kind)
    if problem is not None:
        logger.warning("%s is not a valid result: %s; the cell is trained again", results_file, problem)
        return None
    return results


def _invalid_result(results, config, kind: CellKind) -> str | None:
    """Why ``results`` is not the results.json of a finished ``kind`` cell (None when it is)."""
    if not isinstance(results, dict):
        return f"it holds a JSON {'array' if isinstance(results, list) else type(results).__name__}, not an object"
    if not results:
        return "it is empty ({})"
    if not isinstance(results.get("config"), dict):
        return "it records no settings ('config')"
    if not isinstance(results.get("history"), list):
        return "it records no training history ('history')"
    try:
        for name in COUNTS:
            if results.get(name) is not None:
                check_count(results[name], name, "it")
        steps = results.get("total_steps", results.get("step"))
        if steps and not results["history"]:  # a run that took steps logged at least its last one
            return f"its history is empty ([]) while it records {steps} steps"
    except RecordError as error:
        return str(error).removeprefix("it: ").removesuffix(f"; {FIX}")
    try:
        _recorded_config(config, results["config"], kind)
        metrics = kind.read_metrics(results)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"
    for name, value in metrics.items():
        if value is not None and (problem := kind.score_scale.problem(value)):
            return f"its {name} ({kind.metric_labels.get(name, name)}) is {problem}"
    for key, fields in (("evaluations", ("step", kind.dev_curve)), ("history", ("step", "lambda_mean"))):
        entries = results.get(key) or []
        if not isinstance(entries, list):
            return f"its {key!r} is a {type(entries).__name__}, not a list"
        last_step = -1
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"{key}[{index}] is a {type(entry).__name__}, not an object"
            for field in filter(None, fields):
                if entry.get(field) is not None and not _is_number(entry[field]):
                    value = entry[field]
                    shown = type_name(value) if isinstance(value, float) else repr(value)  # NaN is named NaN
                    return f"{key}[{index}].{field} is {shown}, not a number"
            step = entry.get("step")
            if step is not None and not (float(step).is_integer() and last_step < step):
                order = ("negative" if step < 0 else "not an integer" if not float(step).is_integer()
                         else f"not after the step before it ({last_step})")  # fmt: skip
                return f"{key}[{index}].step is {step}: {order}; steps count up from 0"
            last_step = last_step if step is None else step
            score = entry.get(kind.dev_curve) if key == "evaluations" and kind.dev_curve else None
            if score is not None and (problem := kind.score_scale.problem(score)):
                return f"{key}[{index}].{kind.dev_curve} is {problem}"
    seconds = results.get("wall_time_seconds")
    if seconds is not None and not _is_number(seconds):
        return f"its wall_time_seconds is {seconds!r}, not a number"
    return None


#: the counts a results.json may record (each a non-negative integer)
COUNTS = ("total_steps", "step", "best_step", "num_train_rows", "num_train_sentences", "skipped_empty_lines",
          "num_processes", "resumed_from_step", "embedding_dimension")  # fmt: skip


def _is_number(value) -> bool:
    """A finite int or float (JSON's numbers; not a bool, a string or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_cell(config, kind: CellKind) -> CellState:
    """A cell's folder checked against the cell's settings; :func:`compare` checks every cell before the first
    one trains. ``kind`` is the cell's kind (``TEXT_CELLS``, ``VISION_CELLS``); ``config`` must be of its class.

    A finished cell (a valid results.json) is reused only when the settings recorded in its results.json (and in
    its training_config.yaml, when there is one) are the cell's, and, for text cells, when its training file
    still has the recorded size and sha256; a started one (training_config.yaml) resumes only under the cell's
    settings. Otherwise ValueError names the cell and each differing setting. A results.json written before
    fingerprints were recorded is reused with a warning (the data cannot be checked); so is a finished cell whose
    training file is not here (restored from an archive to be read).
    """
    kind.check_config(config, "check_cell")
    folder = Path(config.output_dir)
    differences, started = {}, (folder / CONFIG_FILE).is_file()
    if started:
        differences.update(_differences(config, load_config(type(config), folder / CONFIG_FILE)))
    results = _read_finished(folder, config, kind)
    fingerprint = None
    if results is None:
        fingerprint = kind.data_fingerprint(config)  # a missing training file fails here, before any cell trains
    else:
        recorded = _recorded_config(config, results["config"], kind)
        differences.update(_differences(config, recorded, results.get("not_applied")))
        try:
            fingerprint = kind.data_fingerprint(config, download=False)
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


def write_results(folder: Path, results: dict) -> None:
    """results.json, atomically: a cell killed while writing it keeps no half file."""
    staging = folder / "results.json.tmp"
    staging.write_text(json.dumps(results, indent=2), encoding="utf-8")
    staging.replace(folder / "results.json")
