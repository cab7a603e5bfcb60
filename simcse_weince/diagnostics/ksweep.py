"""InfoNCE and the number of negatives (Whiteley 2026; docs/method.md#infonce-and-the-number-of-negatives).

With ``k`` negatives, the InfoNCE objective minus ``log k`` is::

    R_k = E[ log(1 + sum_{j<=k} exp((s(a, n_j) - s(a, p)) / tau)) ] - log k

and converges at rate O(1/k) to the cross-entropy between the positive-pair generator and the softmax
similarity-search kernel::

    CE_inf = E_a[ -E_p s(a, p) / tau + log E_n exp(s(a, n) / tau) ]

:func:`k_sweep` measures ``R_k`` on a sweep of ``k`` from one large pool of held-out negatives per anchor
(negatives drawn *with replacement* from the pool, averaged over several draws, so the k -> infinity limit is
exactly the pool's plug-in ``CE_inf``), fits ``CE_inf + b / k``, compares with the direct plug-in estimate, and
does the same for the decoupled loss (DCL, no "1 +"), whose leading coefficient is predicted::

    CE_inf - R~_k  ~  (1 / (2k)) E_a[ Var(e^{s/tau}) / (E e^{s/tau})^2 ]

and reports Proposition 1's bounds ``-log(1 + e^{2/tau}/k) <= CE_inf - R_k <= (e^{2/tau} - 1)^2 / (8k)``.

How large must k be? The expansion is in powers of ``e^{(s_p - s_n)/tau} / k``: below ``k_scale = e^{-CE_inf}``
the positive's own term dominates the sum, ``R_k`` is close to ``-log k`` and a ``CE_inf + b/k`` fit
extrapolates nonsense. ``large_k_regime`` says whether the sweep reached ten times that scale (and ten times the
relative variance of ``e^{s/tau}``); at SimCSE's tau = 0.05 a good encoder needs k in the hundreds of thousands.

Standard errors treat anchors as the independent units: every per-anchor curve ``r_a(k)`` is fitted by the same
linear least squares, so the fitted coefficients are means of per-anchor coefficients, and their standard error
(std / sqrt(A)) accounts for the correlation of ``R_k`` across ``k``.

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> result = k_sweep(np.full(100, 0.8), rng.uniform(-0.2, 0.6, size=(100, 2048)), temperature=0.5)
    >>> abs(result.ce_inf_fit - result.ce_inf_direct) < 3 * result.ce_inf_fit_se
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.special import logsumexp

__all__ = ["KSweepResult", "k_sweep", "proposition1_bounds"]


@dataclass
class KSweepResult:
    """R_k over a sweep of k, the CE_inf + b/k fit, the direct CE_inf, the DCL variant and Proposition 1."""

    temperature: float
    ks: list[int]
    r_k: list[float]  # InfoNCE minus log k
    r_k_se: list[float]
    dcl_k: list[float]  # decoupled (no "1 +") minus log k
    dcl_k_se: list[float]
    fit_ks: list[int]  # the ks used in the 1/k fits
    ce_inf_fit: float
    ce_inf_fit_se: float
    slope: float  # b in CE_inf + b / k
    slope_se: float
    ce_inf_direct: float  # plug-in over the whole pool
    ce_inf_direct_se: float
    dcl_ce_inf_fit: float
    dcl_ce_inf_fit_se: float
    dcl_slope: float  # fitted b~ in R~_k = CE_inf + b~ / k
    dcl_slope_se: float
    dcl_predicted_slope: float  # -(1/2) E_a[Var(e^{s/tau}) / (E e^{s/tau})^2]
    dcl_predicted_slope_se: float
    bound_lower: list[float]  # Proposition 1: lower bound of CE_inf - R_k, per k
    bound_upper: list[float]
    gap: list[float]  # measured CE_inf_direct - R_k, per k
    within_bounds: bool
    k_scale: float  # e^{-CE_inf}: the k at which the negatives' total weight matches the positive's
    relative_variance: float  # E_a[Var(e^{s/tau}) / (E e^{s/tau})^2] over the pool
    large_k_regime: bool  # max(ks) >= 10 * max(k_scale, relative_variance): the 1/k expansion applies
    n_anchors: int
    pool_size: int
    n_draws: int

    def table(self) -> list[dict]:
        """The R_k table: one row per k with R_k, R~_k (and their se), the measured gap and the bounds."""
        columns = ("r_k", "r_k_se", "dcl_k", "dcl_k_se", "gap", "bound_lower", "bound_upper")
        return [{"k": k, **{name: getattr(self, name)[i] for name in columns}} for i, k in enumerate(self.ks)]

    def to_dict(self) -> dict:
        def clean(value):
            if isinstance(value, list):
                return [clean(v) for v in value]
            if isinstance(value, float):
                return value if math.isfinite(value) else None
            return value

        return {key: clean(value) for key, value in asdict(self).items()}


def proposition1_bounds(k, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Proposition 1 of Whiteley (2026): ``lower <= CE_inf - R_k <= upper`` for cosine similarities in [-1, 1].

    The upper bound is ``inf`` when it overflows float64 (tau below about 0.0057).
    """
    k = np.asarray(k, dtype=np.float64)
    span = 2.0 / temperature
    lower = -np.logaddexp(0.0, span - np.log(k))  # -log(1 + e^{2/tau} / k), computed without overflow
    log_upper = 2.0 * (span + math.log(-math.expm1(-span))) - np.log(8.0 * k)  # log((e^{2/tau} - 1)^2 / (8k))
    with np.errstate(over="ignore"):
        upper = np.exp(log_upper)
    return lower, upper


def _per_anchor_fit(curves: np.ndarray, ks: np.ndarray):
    """Least-squares ``c + b / k`` for every row of ``curves`` (anchors x len(ks)); returns mean and se of c, b."""
    design = np.stack([np.ones_like(ks, dtype=np.float64), 1.0 / ks], axis=1)
    coefficients = curves @ np.linalg.pinv(design).T  # anchors x 2
    mean = coefficients.mean(axis=0)
    se = coefficients.std(axis=0, ddof=1) / math.sqrt(curves.shape[0])
    return mean, se


def _validated(positive_scores, negative_scores, temperature):
    positives = np.asarray(positive_scores, dtype=np.float64).ravel()
    negatives = np.asarray(negative_scores, dtype=np.float64)
    if negatives.ndim != 2:
        raise ValueError(f"negative_scores must be anchors x pool, got shape {negatives.shape}")
    if negatives.shape[0] != positives.size:
        raise ValueError(
            f"{positives.size} positive scores but {negatives.shape[0]} rows of negative scores (one per anchor)"
        )
    if positives.size < 2:
        raise ValueError("need at least 2 anchors for standard errors")
    if negatives.shape[1] < 2:
        raise ValueError(f"the negative pool needs at least 2 scores per anchor, got {negatives.shape[1]}")
    if not (np.all(np.isfinite(positives)) and np.all(np.isfinite(negatives))):
        raise ValueError("positive or negative scores contain NaN or infinite values")
    if isinstance(temperature, bool) or not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    return positives, negatives, float(temperature)


def _sampled_losses(positives, negatives, temperature, ks, n_draws: int, seed: int, chunk_size: int):
    """Per anchor and k: InfoNCE's R_k and the decoupled (DCL) loss, each averaged over ``n_draws`` draws of k
    pool negatives (with replacement)."""
    num_anchors, pool_size = negatives.shape
    rng = np.random.default_rng(seed)
    infonce = np.empty((num_anchors, ks.size))  # per-anchor R_k, averaged over draws
    decoupled = np.empty((num_anchors, ks.size))
    for start in range(0, num_anchors, chunk_size):
        block = slice(start, start + chunk_size)
        # logits of each negative relative to the positive: (s_n - s_p) / tau
        relative = (negatives[block] - positives[block, None]) / temperature
        rows = np.arange(relative.shape[0])[:, None, None]
        for column, k in enumerate(ks):
            picks = rng.integers(0, pool_size, size=(relative.shape[0], n_draws, int(k)))
            log_sum = logsumexp(relative[rows, picks], axis=2)  # anchors x draws
            infonce[block, column] = np.logaddexp(0.0, log_sum).mean(axis=1) - math.log(k)
            decoupled[block, column] = log_sum.mean(axis=1) - math.log(k)
    return infonce, decoupled


def _sweep_and_fit_range(ks, fit_min_k: int | None, pool_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct ks (default powers of two up to the pool size) and the mask of those the 1/k fits use."""
    if ks is None:
        ks = [2**i for i in range(int(math.log2(pool_size)) + 1)]
    ks = np.asarray(sorted({int(k) for k in ks}), dtype=np.int64)
    if ks.size == 0 or ks.min() < 1:
        raise ValueError(f"ks must be positive integers, got {ks.tolist()}")
    if fit_min_k is None:
        fit_min_k = max(1, int(ks.max()) // 8)
    fit_mask = ks >= fit_min_k
    if fit_mask.sum() < 2:
        raise ValueError(f"need at least two ks >= fit_min_k={fit_min_k} for the 1/k fit, got {ks.tolist()}")
    return ks, fit_mask


def _pool_plug_in(positives, negatives, temperature) -> tuple[float, float, float, float]:
    """What the whole pool gives without drawing: the direct ``CE_inf`` and DCL's predicted slope, each with its
    standard error over anchors."""
    num_anchors, pool_size = negatives.shape
    # Direct plug-in: -s_p/tau + log mean_pool exp(s_n/tau), per anchor.
    scaled = negatives / temperature
    per_anchor_ce = -positives / temperature + logsumexp(scaled, axis=1) - math.log(pool_size)
    ce_direct = float(per_anchor_ce.mean())
    ce_direct_se = float(per_anchor_ce.std(ddof=1) / math.sqrt(num_anchors))

    # DCL leading coefficient: Var(w) / (E w)^2 with w = e^{s/tau} (scale-free, so shift by the row max).
    weights = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    relative_variance = weights.var(axis=1) / weights.mean(axis=1) ** 2
    predicted = -0.5 * float(relative_variance.mean())
    predicted_se = 0.5 * float(relative_variance.std(ddof=1) / math.sqrt(num_anchors))
    return ce_direct, ce_direct_se, predicted, predicted_se


def k_sweep(
    positive_scores,
    negative_scores,
    *,
    temperature: float = 0.05,
    ks=None,
    n_draws: int = 8,
    fit_min_k: int | None = None,
    seed: int = 0,
    chunk_size: int = 256,
) -> KSweepResult:
    """R_k on a sweep of k from one pool of negatives per anchor, with the CE_inf + b/k fit and the DCL check.

    Args:
        positive_scores: length-A similarities ``s(a, p)`` of each anchor to its positive.
        negative_scores: ``A x P`` similarities of each anchor to a pool of held-out negatives (P >= 2).
        temperature: tau.
        ks: the numbers of negatives (default powers of two from 1 up to the pool size).
        n_draws: independent draws of k negatives (with replacement) per anchor and k, averaged.
        fit_min_k: the 1/k fits use the ks >= this; default ``max(ks) / 8`` (the four largest ks of a doubling
            sweep). The expansion is in powers of ``e^{(s_p - s_n)/tau} / k``, so the O(1/k^2) remainder is
            large at small k, and the smaller tau the larger k has to be.
        seed: seed of the draws.
        chunk_size: anchors processed at a time (bounds memory at chunk_size x n_draws x max(ks) values).

    Returns:
        :class:`KSweepResult`.
    """
    positives, negatives, temperature = _validated(positive_scores, negative_scores, temperature)
    num_anchors, pool_size = negatives.shape
    ks, fit_mask = _sweep_and_fit_range(ks, fit_min_k, pool_size)
    if n_draws < 1:
        raise ValueError(f"n_draws must be >= 1, got {n_draws}")

    infonce, decoupled = _sampled_losses(positives, negatives, temperature, ks, n_draws, seed, chunk_size)
    (ce_fit, slope), (ce_fit_se, slope_se) = _per_anchor_fit(infonce[:, fit_mask], ks[fit_mask])
    (dcl_ce, dcl_slope), (dcl_ce_se, dcl_slope_se) = _per_anchor_fit(decoupled[:, fit_mask], ks[fit_mask])
    ce_direct, ce_direct_se, predicted, predicted_se = _pool_plug_in(positives, negatives, temperature)

    # The expansion is in e^{(s_p - s_n)/tau} / k and Var/(k mean^2): both must be small at the largest k.
    k_scale = math.exp(-ce_direct) if -ce_direct < 700 else math.inf
    lower, upper = proposition1_bounds(ks, temperature)
    r_k = infonce.mean(axis=0)
    gap = ce_direct - r_k
    sqrt_a = math.sqrt(num_anchors)
    return KSweepResult(
        temperature=temperature,
        ks=ks.tolist(),
        r_k=r_k.tolist(),
        r_k_se=(infonce.std(axis=0, ddof=1) / sqrt_a).tolist(),
        dcl_k=decoupled.mean(axis=0).tolist(),
        dcl_k_se=(decoupled.std(axis=0, ddof=1) / sqrt_a).tolist(),
        fit_ks=ks[fit_mask].tolist(),
        ce_inf_fit=float(ce_fit),
        ce_inf_fit_se=float(ce_fit_se),
        slope=float(slope),
        slope_se=float(slope_se),
        ce_inf_direct=ce_direct,
        ce_inf_direct_se=ce_direct_se,
        dcl_ce_inf_fit=float(dcl_ce),
        dcl_ce_inf_fit_se=float(dcl_ce_se),
        dcl_slope=float(dcl_slope),
        dcl_slope_se=float(dcl_slope_se),
        dcl_predicted_slope=predicted,
        dcl_predicted_slope_se=predicted_se,
        bound_lower=lower.tolist(),
        bound_upper=upper.tolist(),
        gap=gap.tolist(),
        within_bounds=bool(np.all((gap >= lower) & (gap <= upper))),
        k_scale=k_scale,
        relative_variance=2.0 * -predicted,
        large_k_regime=bool(ks.max() >= 10.0 * max(k_scale, 2.0 * -predicted)),
        n_anchors=int(num_anchors),
        pool_size=int(pool_size),
        n_draws=int(n_draws),
    )
