"""simcse-weince: train sentence (and image) encoders with WEINCE, an extreme-value correction of InfoNCE.

The loss core is :mod:`simcse_weince.weince` (pure torch); :class:`WeinceLoss` plugs it into
sentence-transformers. See the README for the trainer, evaluators, diagnostics and the vision adapter.
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

__version__ = "0.1.0"

# Names are resolved on first use, so that `simcse-weince --help` does not wait for torch to import.
_EXPORTS = {
    "WeinceConfig": "weince_config",
    "TailStatistics": "weince_tail",
    "weince_loss": "weince",
    "infonce_loss": "weince",
    "tail_statistics": "weince_tail",
    "mixing_weights": "weince_tail",
    "summarize_statistics": "weince_tail",
    "weince_logits": "weince",
    "WeinceLoss": "losses",
    "InfoNCELoss": "losses",
    "CachedWeinceLoss": "losses",
    "CachedInfoNCELoss": "losses",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
