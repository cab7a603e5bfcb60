"""The hyper-parameters of WEINCE's mixing weight, importable without torch (the CLIs build their flags from
it, and ``simcse-weince --help`` must not wait for torch). :mod:`simcse_weince.weince` re-exports it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from simcse_weince.validation import Domain, check_domains, check_field_types

GATES = ("both", "rho", "aic")

#: the names of the λ statistics every log and summary of a batch carries (:func:`~simcse_weince.weince.tail.
#: summarize_statistics`), defined once; here, without torch, so that plotting a log does not import it
STATISTIC_KEYS = ("lambda_mean", "lambda_above_half", "rho0", "delta_aic_mean", "beta_hat_mean")


#: the domain of each numeric hyper-parameter, as the method defines it (docs/method.md#hyper-parameters)
WEINCE_DOMAINS = {
    "quantile": Domain(0, 1, why="a quantile of the batch's hardness"),
    "aic_margin": Domain(why="a Delta-AIC, either sign"),
    "kappa_rho": Domain(0, low_closed=False, why="the slope of the hardness sigmoid; 0 would fix lambda_rho at 1/2"),
    "kappa_aic": Domain(0, low_closed=False, why="the slope of the Delta-AIC sigmoid; 0 would fix lambda_aic at 1/2"),
    "tail_fraction": Domain(0, 1, low_closed=False, why="a share of each anchor's negatives"),
    "min_tail_points": Domain(1, why="tail points per anchor"),
    "beta": Domain(0, low_closed=False, why="or 'estimated'"),
    "beta_min": Domain(0, low_closed=False, why="the lower clamp of the estimated beta"),
    "beta_max": Domain(0, low_closed=False, why="the upper clamp of the estimated beta"),
    "eps": Domain(0, 1, low_closed=False, high_closed=False, why="the floor of the shortfalls"),
}


@dataclass
class WeinceConfig:
    """Hyper-parameters of the WEINCE mixing weight (docs/method.md#the-mixing-weight). No trainable parameters.

    Args:
        quantile: q, the batch quantile of the hardness rho_i that sets the reference rho_0.
        aic_margin: m, the Delta-AIC (Gumbel minus Weibull) at which the AIC gate is one half.
        kappa_rho: slope of the hardness sigmoid.
        kappa_aic: slope of the Delta-AIC sigmoid.
        tail_fraction: share of each anchor's negatives that form its tail.
        min_tail_points: at least this many tail points (when the anchor has that many negatives).
        beta: ``"estimated"`` (the paper: per-anchor Weibull slope, clamped to [beta_min, beta_max]) or a
            positive float (``1.0`` is the authors' released code).
        beta_min, beta_max: clamp of the estimated beta.
        gate: ``"both"`` (lambda = lambda_rho * lambda_aic), ``"rho"`` or ``"aic"``.
        eps: shortfalls are floored at eps, so a negative at cosine 1 gives ``-log(eps)`` and not inf.
    """

    quantile: float = 0.2
    aic_margin: float = 2.0
    kappa_rho: float = 10.0
    kappa_aic: float = 1.0
    tail_fraction: float = 0.10
    min_tail_points: int = 32
    beta: float | Literal["estimated"] = "estimated"
    beta_min: float = 0.5
    beta_max: float = 16.0
    gate: Literal["both", "rho", "aic"] = "both"
    eps: float = 1e-6

    def __post_init__(self) -> None:

        check_field_types(self)  # quantile="0.3" -> TypeError naming the field, before any comparison
        if isinstance(self.beta, str):
            if self.beta != "estimated":
                raise ValueError(f"beta must be 'estimated' or a positive number, got {self.beta!r}")
        elif isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)):
            raise TypeError(f"beta must be 'estimated' or a positive number, got {type(self.beta).__name__}")
        if self.gate not in GATES:
            raise ValueError(f"unknown gate {self.gate!r}; expected one of {GATES}")
        check_domains(self, WEINCE_DOMAINS)
        if self.beta_min > self.beta_max:
            raise ValueError(f"beta_min must be <= beta_max (the clamp of beta), got {self.beta_min} > {self.beta_max}")

    @classmethod
    def reference(cls, **overrides) -> WeinceConfig:
        """The authors' released ``tlambda_select`` path: a fixed shortfall exponent beta = 1."""
        return cls(**{"beta": 1.0, **overrides})

    def to_dict(self) -> dict:
        return asdict(self)
