"""simcse-weince: train sentence (and image) encoders with WEINCE, an extreme-value correction of InfoNCE.

The loss core is :mod:`simcse_weince.weince` (pure torch); :class:`WeinceLoss` plugs it into
sentence-transformers. See the README for the trainer, evaluators, diagnostics and the vision adapter.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Names are resolved on first use, so that `simcse-weince --help` does not wait for torch to import.
_EXPORTS = {
    "WeinceConfig": "weince_config",
    "TailStatistics": "weince",
    "weince_loss": "weince",
    "infonce_loss": "weince",
    "tail_statistics": "weince",
    "mixing_weights": "weince",
    "summarize_statistics": "weince",
    "weince_logits": "weince",
    "WeinceLoss": "losses",
    "InfoNCELoss": "losses",
    "CachedWeinceLoss": "losses",
    "CachedInfoNCELoss": "losses",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"simcse_weince.{_EXPORTS[name]}"), name)
        globals()[name] = value  # not the submodule of the same name that the import bound (see text/__init__.py)
        return value
    raise AttributeError(f"module 'simcse_weince' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])
