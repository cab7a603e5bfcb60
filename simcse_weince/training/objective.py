"""The contrastive objective both trainers optimise: WEINCE or InfoNCE by name, on two views' embeddings.

``geometry="simcse"`` (text): anchors are the first views, candidate *i* is anchor *i*'s positive and the other
second views are its negatives. ``geometry="simclr"`` (vision): the 2N x 2N NT-Xent set of both views. With
several processes both views are gathered with their gradient first, so the negatives and WEINCE's tail
statistics span the global batch and every process computes the same loss. The loss is computed in float32
with autocast off, whatever the training precision (tail statistics need it). Embeddings to loss is
:func:`~simcse_weince.losses.from_embeddings.loss_from_embeddings`, the sentence-transformers losses' path too.
``extra_terms`` is an optional module added to the loss (the authors' top-M terms for vision, spec section 7).
``hardness_strength`` adds sentence-transformers' hard-negative weighting to either loss
(:func:`~simcse_weince.weince.infonce_loss`; for WEINCE it is ours, not the paper's). ``directions``,
``partition_mode`` and ``hardness_mode`` are sentence-transformers' ``MultipleNegativesRankingLoss`` options
(simcse geometry only; the defaults are the loss above).
"""

from __future__ import annotations

import torch

from simcse_weince.losses.from_embeddings import check_contrastive_options, loss_from_embeddings
from simcse_weince.settings import LOSSES
from simcse_weince.weince.loss import GEOMETRIES, WeinceConfig, infonce_loss, weince_loss


class ContrastiveObjective:
    """``objective(first_view, second_view, *hard_negatives) -> (loss, diagnostics)``.

    ``diagnostics`` holds WEINCE's λ statistics (:data:`simcse_weince.weince.DIAGNOSTIC_KEYS`) as detached 0-d
    tensors, so that a step costs one device synchronisation for everything it logs; ``{}`` for InfoNCE or when
    called with ``diagnostics=False`` (computing them costs a little). The extra terms add theirs.
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
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
        if geometry not in GEOMETRIES:
            raise ValueError(f"unknown geometry {geometry!r}; expected one of {GEOMETRIES}")
        self.loss, self.temperature, self.geometry, self.gather = loss, float(temperature), geometry, gather
        self.weince = weince or WeinceConfig()
        self.extra_terms = extra_terms
        self.hardness_strength = float(hardness_strength)  # LLaVE's weighting of hard negatives; 0: plain
        self.directions, self.partition_mode, self.hardness_mode = check_contrastive_options(
            directions, partition_mode, hardness_mode, self.hardness_strength
        )
        options = (self.directions, self.partition_mode, self.hardness_mode)
        if geometry != "simcse" and options != (("query_to_doc",), "joint", "in_batch_negatives"):
            # simclr's 2N x 2N set treats both views alike already; MNRL's options are defined on (query, doc)
            raise ValueError(
                f"directions, partition_mode and hardness_mode are for the simcse geometry (text); the {geometry} "
                f"geometry takes only their defaults, got {list(options[0])}, {options[1]!r}, {options[2]!r}"
            )
        self.check_extremes()

    def check_extremes(self) -> None:
        """Refuse settings the loss cannot train with (``ValueError``, before any file is written): the loss and
        its gradient at the extreme cosines, +1 (duplicates: positives and negatives alike) and -1, for λ = 0 and
        λ = 1, must be finite in float32. ``--temperature 1e-300`` or ``--hardness-strength 1e300`` pass every
        range check and would otherwise fail at step 1."""
        basis = torch.eye(3)
        anchors = torch.stack([basis[0], basis[0], -basis[0], basis[1]]).requires_grad_(True)
        candidates = torch.stack([basis[0], basis[0], basis[0], -basis[1]])
        options = {"temperature": self.temperature, "geometry": self.geometry,
                   "hardness_strength": self.hardness_strength}  # fmt: skip
        with torch.autocast(device_type="cpu", enabled=False):
            for mixing_weight in (0.0, 1.0) if self.loss == "weince" else (None,):
                try:
                    if mixing_weight is None:
                        loss = infonce_loss(anchors, candidates, **options)
                    else:
                        loss = weince_loss(anchors, candidates, config=self.weince, mixing_weight=mixing_weight,
                                           **options)  # fmt: skip
                    (grad,) = torch.autograd.grad(loss, anchors)
                    finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())
                except (RuntimeError, FloatingPointError, ValueError) as error:
                    if isinstance(error, ValueError) and "not finite" not in str(error):
                        raise  # a bad value the core names itself (a temperature <= 0, ...)
                    finite = False
                if not finite:
                    raise ValueError(
                        f"the {self.loss} loss with temperature {self.temperature:g} and hardness strength "
                        f"{self.hardness_strength:g} is not finite at cosine similarities of ±1 (its logits "
                        f"overflow float32), so training would stop at its first step; use a larger temperature "
                        f"(0.05 is SimCSE's) or a smaller hardness strength (9 is sentence-transformers')"
                    )

    def __call__(
        self, first_view: torch.Tensor, second_view: torch.Tensor, *hard_negatives: torch.Tensor,
        diagnostics: bool = True,
    ):  # fmt: skip
        """``hard_negatives`` (simcse geometry): one tensor per hard-negative column, row i being anchor i's own
        hard negative; every anchor sees all of them as extra candidates (SimCSE's supervised loss)."""
        result = loss_from_embeddings(
            [first_view.float(), second_view.float(), *(column.float() for column in hard_negatives)],
            loss=self.loss, temperature=self.temperature, config=self.weince, geometry=self.geometry,
            gather=self.gather, hardness_strength=self.hardness_strength,
            statistics=diagnostics and self.loss == "weince", directions=self.directions,
            partition_mode=self.partition_mode, hardness_mode=self.hardness_mode,
        )  # fmt: skip
        loss, logs = result.loss, dict(result.statistics)
        if self.extra_terms is not None:  # on the gathered views (simclr geometry: no hard negatives)
            with torch.autocast(device_type=loss.device.type, enabled=False):
                loss = loss + self.extra_terms(result.anchors, result.candidates, temperature=self.temperature)
            if diagnostics:
                logs.update(self.extra_terms.last_diagnostics)
        return loss, logs
