"""simcse-weince: train sentence (and image) encoders with WEINCE, an extreme-value correction of InfoNCE.

The loss core is :mod:`simcse_weince.weince` (pure torch); :class:`WeinceLoss` plugs it into
sentence-transformers. See the README for the trainer, evaluators, diagnostics and the vision adapter.
"""

from simcse_weince.weince import (
    TailStatistics,
    WeinceConfig,
    infonce_loss,
    mixing_weights,
    tail_statistics,
    weince_logits,
    weince_loss,
)

__version__ = "0.1.0"

__all__ = [
    "WeinceConfig",
    "TailStatistics",
    "weince_loss",
    "infonce_loss",
    "tail_statistics",
    "mixing_weights",
    "weince_logits",
    "WeinceLoss",
    "InfoNCELoss",
]


def __getattr__(name):
    # The sentence-transformers adapter is imported lazily: `import simcse_weince` stays light.
    if name in ("WeinceLoss", "InfoNCELoss"):
        from simcse_weince import losses

        return getattr(losses, name)
    raise AttributeError(f"module 'simcse_weince' has no attribute {name!r}")
