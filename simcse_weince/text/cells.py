"""The text cells of a comparison (``simcse-weince compare``): one ``train`` run per cell, scored on STS.

:data:`TEXT_CELLS` is what :func:`~simcse_weince.compare.compare` is given (``kind=TEXT_CELLS``) for a
:class:`~simcse_weince.text.config.TrainConfig`; :data:`TEXT_VARIANTS` are its built-in variants."""

from __future__ import annotations

import logging
from pathlib import Path

from simcse_weince.compare.cells import CORRELATION_X100, CellKind, CellState, check_cell, write_results
from simcse_weince.provenance import file_fingerprint
from simcse_weince.text.config import FIELD_CHOICES, PRESETS, TrainConfig, preset

logger = logging.getLogger(__name__)

#: the text metrics compared: name in comparison.json -> label
METRIC_LABELS = {"stsb_dev": "STS-B dev (best)", "stsb_test": "STS-B test", "sts_avg": "STS avg (final tasks)"}


METRICS = tuple(METRIC_LABELS)

#: the text variants shipped (``simcse-weince compare``): name -> overrides of the base config
TEXT_VARIANTS: dict[str, dict] = {
    "infonce": {"loss": "infonce"},
    "weince": {"loss": "weince"},
    "weince-reference": {"loss": "weince", "weince.beta": 1.0},
    "infonce-hardness": {"loss": "infonce", "hardness_mode": "in_batch_negatives", "hardness_strength": 9.0},
    # ours, not the paper's (Studies 2 and 3): WEINCE with the same per-negative hardness term
    "weince-hardness": {"loss": "weince", "hardness_mode": "in_batch_negatives", "hardness_strength": 9.0},
}


def text_data_fingerprint(config, *, download: bool = True) -> dict:
    """The fingerprint of a text cell's training file, resolved as ``train`` resolves it."""
    from simcse_weince.text.data import resolve_train_file  # torch: this module is read by --help

    return file_fingerprint(resolve_train_file(config, download=download))


def run_cell(config, state: CellState | None = None) -> dict:
    """Train one text cell, or read / resume it (see :func:`check_cell`): finished -> read; started -> resume;
    else fresh. The cell's results.json records its settings and ``data_fingerprint`` (path, size and sha256 of
    the training file), which a rerun checks before reusing the cell."""
    state = state or check_cell(config, TEXT_CELLS)
    if state.results is not None:
        return state.results
    from simcse_weince.text.trainer import train  # torch and transformers: this module is read by --help

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
        write_results(Path(config.output_dir), results)
    return results


def run_metrics(results: dict) -> dict:
    """The compared numbers of one text run's results: best STS-B dev during training, STS-B test, STS avg."""
    sts_test = results.get("sts_test") or {}
    return {
        "stsb_dev": results.get("best_stsb_dev_spearman_during_training"),
        "stsb_test": results.get("stsb_test_spearman"),
        "sts_avg": sts_test.get("avg"),
    }


#: the text cells: a TrainConfig, its variants, what a cell runs and which of its numbers are compared
TEXT_CELLS = CellKind(
    name="text",
    config_class=TrainConfig,
    variants=TEXT_VARIANTS,
    aliases=None,
    run_cell=run_cell,
    read_metrics=run_metrics,
    metric_labels=METRIC_LABELS,
    deltas=("stsb_test",),
    dev_curve="stsb_dev_spearman",
    data_fingerprint=text_data_fingerprint,
    score_scale=CORRELATION_X100,
    table_note="Spearman x100; STS-B dev is the best during training, STS avg the test average over the final tasks",
    base_config=preset,
    presets=tuple(PRESETS),
    field_choices=FIELD_CHOICES,
)
