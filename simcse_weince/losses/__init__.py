"""sentence-transformers losses around the functional core :mod:`simcse_weince.weince`, one per file:

* :class:`WeinceLoss` (``weince_loss.py``): WEINCE, InfoNCE with the extreme-value correction of hard negatives.
* :class:`InfoNCELoss` (``infonce_loss.py``): its λ = 0 baseline, SimCSE's loss.
* :class:`CachedWeinceLoss`, :class:`CachedInfoNCELoss` (``cached_weince_loss.py``, ``cached_infonce_loss.py``): their
  GradCache versions (what they share: ``_cached.py``; what the plain ones share, their one signature included:
  ``_columns.py``).
* :class:`~simcse_weince.losses.from_embeddings.ContrastiveObjective` (``from_embeddings.py``, beside the one path
  from embeddings to the loss): the loss both trainers optimise, on two views' embeddings (torch only).

Each file is named after its class (in snake case, so that a submodule never shadows the class it exports).

One text column is unsupervised SimCSE (dropout positives); two or more are (anchor, positive, negatives...).
Every class takes sentence-transformers' ``MultipleNegativesRankingLoss`` options (``scale``, ``similarity_fct``,
``gather_across_devices``, ``directions``, ``partition_mode``, ``hardness_mode``, ``hardness_strength``), checked once,
when the loss is built (:class:`~simcse_weince.losses.from_embeddings.ContrastiveSettings`); what WEINCE does on each
direction: ``docs/directions.md``.

The path from per-column embeddings to the loss, which these classes and the trainers' objective share, is
:func:`~simcse_weince.losses.from_embeddings.contrastive_loss` (``from_embeddings.py``; torch only).
"""

from __future__ import annotations

from simcse_weince._lazy import lazy_exports

# The classes import sentence-transformers (seconds more than torch alone: `python -X importtime`); the vision
# trainer reaches from_embeddings.py through this package and needs none of it, so the classes load on first use.
_EXPORTS = {"WeinceLoss": "weince_loss", "InfoNCELoss": "infonce_loss", "CachedWeinceLoss": "cached_weince_loss",
            "CachedInfoNCELoss": "cached_infonce_loss"}  # fmt: skip

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
