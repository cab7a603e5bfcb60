"""The text application: unsupervised SimCSE with WEINCE or InfoNCE on a Hugging Face encoder.

========================  ============================================================================
``text/config.py``        :class:`TrainConfig`, the presets (``paper``, ``cpu-demo``, ``cpu-cls``)
``text/data.py``          the corpus, tokenised once; batches as a pure function of (seed, index)
``text/model.py``         :class:`SimCSEModel`: encoder + SimCSE pooler, export to a SentenceTransformer
``text/columns.py``       training files of 1-3 columns (SimCSE's and sentence-transformers' names)
``text/trainer.py``       :func:`train` and its recipe for :func:`~simcse_weince.training.loop.run_training`
``text/gradcache.py``     the trainer's GradCache step (``mini_batch_size``)
``text/fast_path/``       the training forward below public APIs, checked at start-up, with its fallback
``text/results.py``       STS-B dev selection, export, ``results.json``, the model card
``text/cells.py``         ``TEXT_CELLS`` (and ``TEXT_VARIANTS``): a cell of ``simcse-weince compare``
``text/cli.py``           ``simcse-weince train``, ``push`` and ``compare``
========================  ============================================================================

Example::

    from simcse_weince.text import preset, train

    results = train(preset("cpu-demo", output_dir="runs/demo"))
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

# resolved on first use: the config imports without torch, the trainer does not
_EXPORTS = {
    "TrainConfig": "config",
    "PRESETS": "config",
    "preset": "config",
    "train": "trainer",
    "SimCSEModel": "model",
    "TEXT_VARIANTS": "cells",
    "TEXT_CELLS": "cells",
}
__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
