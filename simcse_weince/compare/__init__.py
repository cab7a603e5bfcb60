"""Compare losses fairly: a grid of ordinary training runs (variant x seed), paired by seed, summarised.

A *variant* is data: a name and the overrides it applies to a base :class:`~simcse_weince.text.config.TrainConfig`
(``{"loss": "weince", "weince.beta": 1.0}``). Every cell of the grid is a plain ``train`` run in
``<output_dir>/<variant>/seed-<s>/``; runs with the same seed share data order, initialisation and the dropout
masks of step 0 (the trainer seeds them), so the differences between variants are paired by seed. A finished cell
(``results.json``) is read, not retrained; a started one (``training_config.yaml``) is resumed; so a killed sweep
finishes when the same call runs again. Before the first cell trains, every cell is checked (:func:`check_cell`): a
finished one is read only if the settings and the data fingerprint recorded in its ``results.json`` are the cell's.
The summary goes to ``comparison.json``, ``comparison.md`` (a table to paste into a README) and ``comparison.png``.

==========================  ============================================================================
``compare/sweep.py``        :func:`compare`: every cell trained, read or resumed; the summary written
``compare/cells.py``        :class:`CellKind`, each cell's config and folder, :func:`check_cell` (reusable?)
``compare/statistics.py``   mean ± sd, paired differences (t-interval, W/T/L, Wilcoxon), λ averaged over seeds
``compare/report.py``       ``comparison.md`` and the study report (:func:`study_report`)
``compare/plots.py``        ``comparison.png`` and ``comparison_lambda.png``
``compare/cli.py``          :func:`~simcse_weince.compare.cli.add_compare_command`, for a trainer's ``compare``
``text/cells.py``           ``TEXT_CELLS``, ``TEXT_VARIANTS``: a ``train`` run, STS metrics
``text/cli.py``             ``simcse-weince compare`` (with ``TEXT_CELLS``)
``vision/cells.py``         ``VISION_CELLS``, ``VISION_VARIANTS``: ``vision train``, then kNN and linear probe
``vision/cli.py``           ``simcse-weince vision compare`` (with ``VISION_CELLS``)
==========================  ============================================================================

Example::

    from simcse_weince.compare import compare
    from simcse_weince.text import TEXT_CELLS, TEXT_VARIANTS, preset

    base = preset("cpu-demo", max_steps=100)
    variants = {name: TEXT_VARIANTS[name] for name in ("infonce", "weince")}
    summary = compare(base, variants, seeds=[1, 2, 3], output_dir="runs/compare", kind=TEXT_CELLS)
    print(summary["differences"]["weince"]["stsb_test"])  # mean, ci95, wins/ties/losses, wilcoxon_p, n

or ``simcse-weince compare --preset cpu-demo --losses infonce,weince --seeds 1,2,3 --output-dir runs/compare``.

The same grid runs SimCLR pretraining with ``kind=VISION_CELLS`` (from :mod:`simcse_weince.vision`) and a
:class:`~simcse_weince.vision.config.VisionTrainConfig` as the base (``simcse-weince vision compare``): each cell is
a ``vision train`` run followed by the frozen-feature evaluation (kNN@20, kNN@1, linear probe), and the variant
``untrained`` (``num_epochs: 0``) is the initialised backbone of the same seed, so "does training beat random
features?" is a paired difference too.

What a kind of cell is (its config class, built-in variants, what it runs and reports, the base config of its
command) comes from its trainer package as a :class:`CellKind`, and each trainer's CLI module registers its own
``compare`` command with it; this package imports neither :mod:`simcse_weince.text` nor :mod:`simcse_weince.vision`
(they import it).
"""

from simcse_weince.compare.cells import (
    CellKind,
    CellState,
    cell_configs,
    cell_dir,
    check_cell,
    load_variants,
)
from simcse_weince.compare.plots import plot_comparison, plot_lambda_over_training
from simcse_weince.compare.report import format_markdown, study_report
from simcse_weince.compare.statistics import mean_sd, paired_difference, seed_averaged_lambda, summarize
from simcse_weince.compare.sweep import compare
from simcse_weince.provenance import file_fingerprint

__all__ = [
    "CellKind",
    "CellState",
    "cell_configs",
    "cell_dir",
    "check_cell",
    "compare",
    "file_fingerprint",
    "format_markdown",
    "load_variants",
    "mean_sd",
    "paired_difference",
    "plot_comparison",
    "plot_lambda_over_training",
    "seed_averaged_lambda",
    "study_report",
    "summarize",
]
