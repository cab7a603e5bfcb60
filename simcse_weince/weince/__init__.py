"""WEINCE's functional core: tensors in, tensors out, no trainable parameters (the method: ``docs/method.md``).

================  =========================================================================================
``loss.py``       :func:`weince_loss`, :func:`infonce_loss`, :func:`weince_logits`: the losses and their logits
``tail.py``       :func:`tail_statistics`, :func:`mixing_weights`: the stop-gradient side that sets λ per anchor
``config.py``     :class:`WeinceConfig`: the mixing weight's hyper-parameters (the paper's defaults)
``speedups.py``   what makes ``loss.py`` fast: hand-written backward passes, the numpy top-k of the tail
``reference.py``  :func:`reference_weince_loss`: the same loss as ``docs/method.md`` writes it, plain autograd
================  =========================================================================================

Example::

    from simcse_weince.weince import WeinceConfig, weince_loss

    loss = weince_loss(anchors, positives, temperature=0.05, weince=WeinceConfig())
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

# config.py is read by every command's --help (TrainConfig holds a WeinceConfig); loss.py and tail.py import torch,
# which --help must not wait for, so the names load on first use
_EXPORTS = {
    "WeinceConfig": "config",
    "GATES": "config",
    "weince_loss": "loss",
    "infonce_loss": "loss",
    "weince_logits": "loss",
    "cosine_similarity_matrix": "loss",
    "GEOMETRIES": "loss",
    "TailStatistics": "tail",
    "tail_statistics": "tail",
    "mixing_weights": "tail",
    "summarize_statistics": "loss",
    "STATISTIC_KEYS": "config",
    "reference_weince_loss": "reference",
}

__all__ = list(_EXPORTS)

# the λ statistics were called diagnostics, a name now kept for the EVT package simcse_weince.diagnostics
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, renamed={"DIAGNOSTIC_KEYS": "STATISTIC_KEYS"})
