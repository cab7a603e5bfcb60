"""simcse-weince: train sentence (and image) encoders with WEINCE, an extreme-value correction of InfoNCE.

The loss core is the package :mod:`simcse_weince.weince` (pure torch: ``loss.py``, ``tail.py``, ``config.py``);
:class:`WeinceLoss` plugs it into sentence-transformers. See the README for the trainer, evaluators, diagnostics
and the vision adapter.
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

__version__ = "0.1.0"

# Names are resolved on first use, so that `simcse-weince --help` does not wait for torch to import.
_EXPORTS = {
    "WeinceConfig": "weince.config",
    "TailStatistics": "weince.tail",
    "weince_loss": "weince.loss",
    "infonce_loss": "weince.loss",
    "tail_statistics": "weince.tail",
    "mixing_weights": "weince.tail",
    "summarize_statistics": "weince.loss",
    "weince_logits": "weince.loss",
    "WeinceLoss": "losses",
    "InfoNCELoss": "losses",
    "CachedWeinceLoss": "losses",
    "CachedInfoNCELoss": "losses",
    "WeinceStatisticsCallback": "losses.weince_statistics_callback",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
