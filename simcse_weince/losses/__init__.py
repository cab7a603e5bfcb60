"""sentence-transformers losses around the functional core :mod:`simcse_weince.weince`, one per file:

* :class:`WeinceLoss` (``weince.py``): WEINCE, InfoNCE with the extreme-value correction of hard negatives.
* :class:`InfoNCELoss` (``infonce.py``): its λ = 0 baseline, SimCSE's loss.
* :class:`CachedWeinceLoss`, :class:`CachedInfoNCELoss` (``cached.py``): their GradCache versions.

One text column is unsupervised SimCSE (dropout positives); two or more are (anchor, positive, negatives...).
"""

from __future__ import annotations

from simcse_weince.losses.cached import CachedInfoNCELoss, CachedWeinceLoss
from simcse_weince.losses.infonce import InfoNCELoss
from simcse_weince.losses.weince import WeinceLoss

__all__ = ["WeinceLoss", "InfoNCELoss", "CachedWeinceLoss", "CachedInfoNCELoss"]
