"""The contrastive objective both trainers optimise: WEINCE or InfoNCE by name, on two views' embeddings.

``geometry="simcse"`` (text): anchors are the first views, candidate *i* is anchor *i*'s positive and the other
second views are its negatives. ``geometry="simclr"`` (vision): the 2N x 2N NT-Xent set of both views. With
several processes both views are gathered with their gradient first, so the negatives and WEINCE's tail
statistics span the global batch and every process computes the same loss. The loss is computed in float32
with autocast off, whatever the training precision (tail statistics need it). Embeddings to loss is
:func:`~simcse_weince.losses.from_embeddings.contrastive_loss`, the sentence-transformers losses' path too.
``extra_terms`` is an optional module added to the loss (the authors' top-M terms for vision, spec section 7).
``hardness_strength`` adds sentence-transformers' hard-negative weighting to either loss
(:func:`~simcse_weince.weince.infonce_loss`; for WEINCE it is ours, not the paper's). ``directions``,
``partition_mode`` and ``hardness_mode`` are sentence-transformers' ``MultipleNegativesRankingLoss`` options
(simcse geometry only; the defaults are the loss above).
"""

from __future__ import annotations

import dataclasses

import torch

from simcse_weince.losses.from_embeddings import ContrastiveSettings, contrastive_loss
from simcse_weince.weince.config import WeinceConfig


class ContrastiveObjective:
    """``objective(first_view, second_view, *hard_negatives) -> (loss, statistics)``.

    ``statistics`` holds WEINCE's λ statistics (:data:`simcse_weince.weince.STATISTIC_KEYS`) as detached 0-d
    tensors, so that a step costs one device synchronisation for everything it logs; ``{}`` for InfoNCE or when
    called with ``statistics=False`` (computing them costs a little). The extra terms add theirs.

    Every option is checked once, here (:class:`~simcse_weince.losses.from_embeddings.ContrastiveSettings`, then
    :meth:`check_extremes`); a call only computes.
    """

    def __init__(
        self,
        loss: str = "weince",
        temperature: float = 0.05,
        *,
        weince: WeinceConfig | None = None,
        geometry: str = "simcse",
        gather: bool = True,
        extra_terms=None,
        hardness_strength: float = 0.0,
        directions: tuple[str, ...] = ("query_to_doc",),
        partition_mode: str = "joint",
        hardness_mode: str | None = "in_batch_negatives",
    ):
        self.settings = ContrastiveSettings(
            loss=loss, temperature=float(temperature), weince=weince or WeinceConfig(), geometry=geometry,
            gather=gather, hardness_strength=hardness_strength,  # LLaVE's weighting of hard negatives; 0: plain
            directions=directions, partition_mode=partition_mode, hardness_mode=hardness_mode,
        )  # fmt: skip
        self.extra_terms = extra_terms
        self.check_extremes()

    @property
    def loss(self) -> str:
        return self.settings.loss

    @property
    def temperature(self) -> float:
        return self.settings.temperature

    def check_extremes(self) -> None:
        """Refuse settings the loss cannot train with (``ValueError``, before any file is written): the loss and
        its gradient at the extreme cosines, +1 (duplicates: positives and negatives alike) and -1, for λ = 0 and
        λ = 1, must be finite in float32. ``--temperature 1e-300`` or ``--hardness-strength 1e300`` pass every
        range check and would otherwise fail at step 1. The loss is the one training computes
        (:func:`~simcse_weince.losses.from_embeddings.contrastive_loss`), on this process's rows only."""
        basis = torch.eye(3)
        anchors = torch.stack([basis[0], basis[0], -basis[0], basis[1]]).requires_grad_(True)
        candidates = torch.stack([basis[0], basis[0], basis[0], -basis[1]])
        settings = dataclasses.replace(self.settings, gather=False)
        with torch.autocast(device_type="cpu", enabled=False):
            for mixing_weight in (0.0, 1.0) if settings.loss == "weince" else (None,):
                try:
                    loss = contrastive_loss([anchors, candidates], settings, mixing_weight=mixing_weight).loss
                    (grad,) = torch.autograd.grad(loss, anchors)
                    finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
                except (RuntimeError, FloatingPointError, ValueError) as error:
                    if isinstance(error, ValueError) and "not finite" not in str(error):
                        raise  # a bad value the core names itself (a temperature <= 0, ...)
                    finite = False
                if not finite:
                    raise ValueError(
                        f"the {settings.loss} loss with temperature {settings.temperature:g} and hardness strength "
                        f"{settings.hardness_strength:g} is not finite at cosine similarities of ±1 (its logits "
                        f"overflow float32), so training would stop at its first step; use a larger temperature "
                        f"(0.05 is SimCSE's) or a smaller hardness strength (9 is sentence-transformers')"
                    )

    def __call__(
        self, first_view: torch.Tensor, second_view: torch.Tensor, *hard_negatives: torch.Tensor,
        statistics: bool = True,
    ):  # fmt: skip
        """``hard_negatives`` (simcse geometry): one tensor per hard-negative column, row i being anchor i's own
        hard negative; every anchor sees all of them as extra candidates (SimCSE's supervised loss). Half-precision
        views are cast to float32 once, by :func:`~simcse_weince.losses.from_embeddings.anchors_and_candidates`."""
        result = contrastive_loss(
            [first_view, second_view, *hard_negatives], self.settings,
            statistics=statistics and self.settings.loss == "weince",
        )  # fmt: skip
        loss, batch_statistics = result.loss, dict(result.statistics)
        if self.extra_terms is not None:  # on the gathered views (simclr geometry: no hard negatives)
            with torch.autocast(device_type=loss.device.type, enabled=False):
                loss = loss + self.extra_terms(result.anchors, result.candidates, temperature=self.temperature)
            if statistics:
                batch_statistics.update(self.extra_terms.last_statistics)
        return loss, batch_statistics
