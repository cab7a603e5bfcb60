"""The vision cells of a comparison (``simcse-weince vision compare``): a ``vision train`` run per cell, then the
frozen-feature evaluation of its last checkpoint (kNN, linear probe).

:data:`VISION_CELLS` is what :func:`~simcse_weince.compare.compare` is given (``kind=VISION_CELLS``) for a
:class:`~simcse_weince.vision.config.VisionTrainConfig`; :data:`VISION_VARIANTS` are its built-in variants."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from simcse_weince.compare.cells import ACCURACY_X100, CellKind, CellState, check_cell, write_results
from simcse_weince.provenance import versions
from simcse_weince.vision.config import DEPRECATED_NAMES, FIELD_CHOICES, VisionTrainConfig

logger = logging.getLogger(__name__)

#: the vision metrics compared (accuracy x100 on the test split, frozen backbone)
VISION_METRIC_LABELS = {"knn@20": "kNN@20", "knn@1": "kNN@1", "linear_probe": "linear probe"}


#: the k of the vision cells' kNN evaluation (the compared ones and k=5, for the record)
VISION_KNN_KS = (1, 5, 20)


#: the vision variants shipped (``simcse-weince vision compare``); ``untrained`` trains 0 epochs: the seed's init
VISION_VARIANTS: dict[str, dict] = {
    "infonce": {"loss": "infonce"},
    "weince": {"loss": "weince"},
    "weince-reference": {"loss": "weince", "weince.beta": 1.0},
    "untrained": {"num_epochs": 0},
}


def vision_data_fingerprint(config, *, download: bool = True) -> None:
    """None: the vision data sets are built in (torchvision, scikit-learn, FakeData) and named by the cell's
    settings (dataset, data_dir, train_size), which are compared; there is no file of the cell's own to hash."""
    return None


def run_vision_cell(config, state: CellState | None = None) -> dict:
    """Pretrain one vision cell (or read / resume it, as :func:`run_cell`), then evaluate its last checkpoint.

    The cell's ``results.json`` holds the config, the step, the training history (loss and λ statistics) and the
    frozen-feature evaluation (:func:`~simcse_weince.vision.evaluate.evaluate_checkpoint`: kNN at
    :data:`VISION_KNN_KS`, linear probe over 3 probe seeds). It is written last, atomically: a cell killed during
    its evaluation resumes at its final checkpoint and only evaluates again.
    """
    state = state or check_cell(config, VISION_CELLS)
    folder = Path(config.output_dir)
    results = state.results
    if results is not None:
        return results
    # torch and torchvision: this module is read by --help
    from simcse_weince.training.checkpoints import read_trainer_state
    from simcse_weince.vision.evaluate import evaluate_checkpoint
    from simcse_weince.vision.trainer import train

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
    write_results(folder, results)
    return results


def vision_run_metrics(results: dict) -> dict:
    """The compared numbers of one vision cell, accuracy x100: kNN@20, kNN@1, linear probe (mean of probe seeds)."""
    evaluation = results["evaluation"]
    return {
        "knn@20": 100 * evaluation["knn_accuracy"]["20"],
        "knn@1": 100 * evaluation["knn_accuracy"]["1"],
        "linear_probe": 100 * evaluation["linear_accuracy"]["mean"],
    }


#: the vision cells: a VisionTrainConfig (earlier releases' setting names read too), its variants, what a cell
#: runs and which of its numbers are compared
VISION_CELLS = CellKind(
    name="vision",
    config_class=VisionTrainConfig,
    variants=VISION_VARIANTS,
    aliases=DEPRECATED_NAMES,
    run_cell=run_vision_cell,
    read_metrics=vision_run_metrics,
    metric_labels=VISION_METRIC_LABELS,
    deltas=("knn@20", "linear_probe"),
    dev_curve=None,
    data_fingerprint=vision_data_fingerprint,
    score_scale=ACCURACY_X100,
    table_note="accuracy x100 of the frozen backbone on the test split (linear probe: mean of its probe seeds)",
    base_config=VisionTrainConfig,
    presets=(),
    field_choices=FIELD_CHOICES,
)
