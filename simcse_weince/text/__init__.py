"""The text application: unsupervised SimCSE with WEINCE or InfoNCE on a Hugging Face encoder.

========================  ============================================================================
``text/config.py``        :class:`TrainConfig`, the presets (``paper``, ``cpu-demo``, ``cpu-cls``)
``text/data.py``          the corpus, tokenised once; batches as a pure function of (seed, index)
``text/model.py``         :class:`SimCSEModel`: encoder + SimCSE pooler, export to a SentenceTransformer
``text/train.py``         :func:`train`: the loop, top to bottom
``text/results.py``       STS-B dev selection, export, ``results.json``, the model card
``text/cli.py``           ``simcse-weince train`` and ``push``
========================  ============================================================================

Example::

    from simcse_weince.text import preset, train

    results = train(preset("cpu-demo", output_dir="runs/demo"))
"""

from __future__ import annotations

import importlib

# resolved on first use: the config imports without torch, the trainer does not
_EXPORTS = {
    "TrainConfig": "config",
    "PRESETS": "config",
    "preset": "config",
    "train": "train",
    "SimCSEModel": "model",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"simcse_weince.text.{_EXPORTS[name]}"), name)
        # importing text/train.py binds the package attribute ``train`` to that module; the function takes the
        # name back, or ``from simcse_weince.text import train`` would hand out the module
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simcse_weince.text' has no attribute {name!r}")
