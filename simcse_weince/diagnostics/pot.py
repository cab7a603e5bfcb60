"""Peaks over threshold: a generalised Pareto fit to the upper tail of negative similarities
(docs/method.md#peaks-over-threshold).

Take the scores above a high threshold ``u`` (default: their 0.99 quantile), the exceedances ``y = s - u``,
and fit the generalised Pareto distribution (GPD)::

    P(Y > y) = (1 + xi * y / sigma) ** (-1 / xi)        (xi != 0),      exp(-y / sigma)   (xi = 0)

by maximum likelihood. ``xi < 0`` puts the scores in the Weibull domain of attraction: a finite upper endpoint
``u - sigma / xi`` (for cosine similarities it should sit at or below 1). ``xi = 0`` is the Gumbel-domain
(exponential) alternative that InfoNCE's softmax link implicitly assumes; the likelihood-ratio test says
whether the data reject it.

Estimation follows the authors: the profile log-likelihood over a grid of xi in [-1.5, 1] (sigma maximised for
each xi), refined around the best grid point with :func:`scipy.optimize.minimize_scalar`. Standard errors come
from the observed information (the numerical Hessian at the optimum) or from a bootstrap of the exceedances.

Example::

    >>> import numpy as np
    >>> from scipy.stats import genpareto
    >>> scores = genpareto.rvs(-0.4, scale=0.1, size=20_000, random_state=0)
    >>> fit = fit_gpd(scores, quantile=0.9)
    >>> round(fit.xi, 1), fit.endpoint <= 0.25 + 3 * fit.endpoint_se
    (-0.4, True)

Reference: Coles, *An Introduction to Statistical Modeling of Extreme Values* (2001), ch. 4; Smith (1985) on
the regularity of the GPD likelihood (standard asymptotics need xi > -1/2, a maximum exists for xi > -1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import optimize, stats

__all__ = ["GPDFit", "exceedances_above", "fit_gpd", "gpd_loglik", "threshold_stability"]

# Below xi = -1 the GPD density has a pole at its endpoint, so the likelihood is unbounded there (sigma -> -xi*max y).
_UNBOUNDED_BELOW = -1.0


@dataclass
class GPDFit:
    """A generalised Pareto fit to the exceedances over ``threshold``.

    ``endpoint`` (``threshold - sigma / xi``) is ``inf`` for ``xi >= 0``. ``lr_statistic`` / ``lr_pvalue`` test the
    exponential (xi = 0, Gumbel-domain) model against the GPD (chi-square with one degree of freedom).
    ``profile_xi`` / ``profile_loglik`` hold the profile log-likelihood on the grid (for plots).
    """

    xi: float
    sigma: float
    threshold: float
    quantile: float | None
    xi_se: float
    sigma_se: float
    endpoint: float
    endpoint_se: float
    n_exceedances: int
    n_scores: int
    loglik: float
    exponential_sigma: float
    exponential_loglik: float
    lr_statistic: float
    lr_pvalue: float
    se_method: str
    profile_xi: np.ndarray = field(repr=False)
    profile_loglik: np.ndarray = field(repr=False)
    exceedances: np.ndarray = field(repr=False)

    @property
    def weibull_domain(self) -> bool:
        """True when xi < 0 (a finite endpoint: the Weibull domain of attraction)."""
        return self.xi < 0

    def to_dict(self) -> dict:
        """JSON-ready summary (no arrays; a non-finite endpoint becomes ``None``)."""
        summary = asdict(self)
        for name in ("profile_xi", "profile_loglik", "exceedances"):
            summary.pop(name)
        return {key: _json_number(value) for key, value in summary.items()}


def _json_number(value):
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


# ------------------------------------------------------------------------------------------- likelihood


def gpd_loglik(exceedances: np.ndarray, xi: float, sigma: float) -> float:
    """Log-likelihood of the GPD(xi, sigma) at the exceedances (``-inf`` outside the support)."""
    y = np.asarray(exceedances, dtype=np.float64)
    if sigma <= 0:
        return -math.inf
    if abs(xi) < 1e-9:
        return float(-y.size * math.log(sigma) - y.sum() / sigma)
    z = 1.0 + xi * y / sigma
    if np.any(z <= 0):
        return -math.inf
    return float(-y.size * math.log(sigma) - (1.0 + 1.0 / xi) * np.log(z).sum())


def _profile_sigma(y: np.ndarray, xi: float) -> tuple[float, float]:
    """The sigma that maximises the likelihood for this xi, and the maximised log-likelihood."""
    largest = float(y.max())
    scale = max(float(y.mean()), 1e-300)
    if abs(xi) < 1e-9:
        return scale, gpd_loglik(y, 0.0, scale)
    if xi < 0:
        # Support: sigma > -xi * max(y). Search the log of the distance to that bound.
        floor = -xi * largest

        def to_sigma(t):
            return floor + math.exp(t)

        bounds = (math.log(scale) - 40.0, math.log(max(scale, largest)) + 8.0)
    else:
        to_sigma = math.exp
        bounds = (math.log(scale) - 20.0, math.log(max(scale, largest)) + 8.0)
    result = optimize.minimize_scalar(
        lambda t: -gpd_loglik(y, xi, to_sigma(t)), bounds=bounds, method="bounded", options={"xatol": 1e-10}
    )
    sigma = to_sigma(float(result.x))
    return sigma, gpd_loglik(y, xi, sigma)


def _maximise(y: np.ndarray, xi_range: tuple[float, float], grid_size: int):
    """Grid over xi (sigma profiled), then a bounded refinement around the best grid point."""
    lower = max(xi_range[0], _UNBOUNDED_BELOW)
    grid = np.linspace(xi_range[0], xi_range[1], grid_size)
    grid = grid[grid >= lower]
    profile = np.array([_profile_sigma(y, float(xi))[1] for xi in grid])
    if not np.isfinite(profile).any():
        raise ValueError("the GPD likelihood is not finite anywhere on the xi grid; the exceedances are degenerate")
    best = int(np.nanargmax(profile))
    left = grid[max(best - 1, 0)]
    right = grid[min(best + 1, grid.size - 1)]
    refined = optimize.minimize_scalar(
        lambda xi: -_profile_sigma(y, xi)[1], bounds=(left, right), method="bounded", options={"xatol": 1e-7}
    )
    xi_hat = float(refined.x)
    sigma_hat, loglik = _profile_sigma(y, xi_hat)
    if loglik < profile[best]:  # the refinement cannot do worse than the grid
        xi_hat = float(grid[best])
        sigma_hat, loglik = _profile_sigma(y, xi_hat)
    return xi_hat, sigma_hat, loglik, grid, profile


def _observed_information_covariance(y: np.ndarray, xi: float, sigma: float) -> np.ndarray | None:
    """Inverse of the numerical Hessian of -loglik at (xi, sigma); None when it is not positive definite."""
    steps = np.array([1e-4, 1e-4 * sigma])
    point = np.array([xi, sigma])

    def negloglik(p):
        return -gpd_loglik(y, p[0], p[1])

    hessian = np.empty((2, 2))
    for i in range(2):
        for j in range(2):
            ei = np.eye(2)[i] * steps[i]
            ej = np.eye(2)[j] * steps[j]
            hessian[i, j] = (
                negloglik(point + ei + ej)
                - negloglik(point + ei - ej)
                - negloglik(point - ei + ej)
                + negloglik(point - ei - ej)
            ) / (4 * steps[i] * steps[j])
    if not np.all(np.isfinite(hessian)):
        return None
    hessian = (hessian + hessian.T) / 2
    if np.any(np.linalg.eigvalsh(hessian) <= 0):
        return None
    return np.linalg.inv(hessian)


def _bootstrap_covariance(y, xi_range, grid_size, n_bootstrap, seed) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_bootstrap):
        resampled = rng.choice(y, size=y.size, replace=True)
        if np.ptp(resampled) <= 0:
            continue
        xi, sigma, *_ = _maximise(resampled, xi_range, grid_size)
        draws.append((xi, sigma))
    if len(draws) < 2:
        raise ValueError("the bootstrap produced fewer than two usable resamples; too few distinct exceedances")
    return np.cov(np.asarray(draws).T)


# ------------------------------------------------------------------------------------------------ API


def _validated_scores(scores) -> np.ndarray:
    values = np.asarray(scores, dtype=np.float64).ravel()
    if values.size == 0:
        raise ValueError("scores is empty")
    if not np.all(np.isfinite(values)):
        bad = int((~np.isfinite(values)).sum())
        raise ValueError(f"scores contain {bad} NaN or infinite values; drop them (or fix the encoder) first")
    if np.ptp(values) <= 0:
        raise ValueError(f"all {values.size} scores are equal ({values[0]}); there is no tail to fit")
    return values


def exceedances_above(scores, quantile: float = 0.99, threshold: float | None = None):
    """``(threshold, exceedances)``: the threshold (the ``quantile`` of the scores unless given) and ``s - u > 0``."""
    values = _validated_scores(scores)
    if threshold is None:
        if not 0.0 <= quantile < 1.0:
            raise ValueError(f"quantile must be in [0, 1), got {quantile}")
        threshold = float(np.quantile(values, quantile))
    threshold = float(threshold)
    return threshold, values[values > threshold] - threshold


def _parameter_covariance(y, xi, sigma, xi_range, grid_size, n_bootstrap, seed) -> tuple[np.ndarray, str]:
    """The covariance of (xi-hat, sigma-hat) and how it was had: ``n_bootstrap`` refits when asked, else the
    observed information, or a 200-draw bootstrap where that is not positive definite."""
    if n_bootstrap > 0:
        return _bootstrap_covariance(y, xi_range, grid_size, n_bootstrap, seed), "bootstrap"
    covariance = _observed_information_covariance(y, xi, sigma)
    if covariance is None:
        warnings.warn(
            f"the observed information is not positive definite at xi = {xi:.3f}; "
            "standard errors come from a 200-draw bootstrap instead",
            stacklevel=3,  # the caller of fit_gpd
        )
        return _bootstrap_covariance(y, xi_range, grid_size, 200, seed), "bootstrap"
    return covariance, "observed_information"


def _endpoint(threshold, xi, sigma, covariance) -> tuple[float, float]:
    """The upper endpoint ``u - sigma / xi`` of a bounded tail (xi < 0) and its delta-method standard error;
    ``(inf, inf)`` for an unbounded one."""
    if xi < 0:
        endpoint = threshold - sigma / xi
        gradient = np.array([sigma / xi**2, -1.0 / xi])  # d endpoint / d(xi, sigma)
        return endpoint, float(math.sqrt(max(gradient @ covariance @ gradient, 0.0)))
    return math.inf, math.inf


def fit_gpd(
    scores,
    quantile: float = 0.99,
    *,
    threshold: float | None = None,
    min_exceedances: int = 30,
    xi_range: tuple[float, float] = (-1.5, 1.0),
    grid_size: int = 51,
    n_bootstrap: int = 0,
    seed: int = 0,
) -> GPDFit:
    """Fit a generalised Pareto distribution to the exceedances of ``scores`` over a high threshold.

    Args:
        scores: 1-D array of similarities (e.g. negative cosine similarities of distinct items).
        quantile: the threshold is this quantile of the scores (ignored when ``threshold`` is given).
        threshold: an explicit threshold ``u``.
        min_exceedances: fewer exceedances than this raise a ValueError.
        xi_range, grid_size: the profile-likelihood grid over xi (points below -1, where the likelihood is
            unbounded, are skipped).
        n_bootstrap: when > 0, standard errors from this many bootstrap refits of the exceedances instead of
            the observed information. The observed information is also replaced by a 200-draw bootstrap when it
            is not positive definite (xi near or below -1/2, where it is not a valid approximation anyway).
        seed: seed of the bootstrap.

    Returns:
        :class:`GPDFit`.

    Raises:
        ValueError: NaN/inf scores, all-equal scores, too few (or all-equal) exceedances.
    """
    values = _validated_scores(scores)
    quantile_used = None if threshold is not None else float(quantile)
    threshold, y = exceedances_above(values, quantile, threshold)
    if y.size < min_exceedances:
        raise ValueError(
            f"only {y.size} scores exceed the threshold {threshold:.6g} (need at least {min_exceedances}); "
            f"use more scores or a lower quantile"
        )
    if np.ptp(y) <= 0:
        raise ValueError(f"all {y.size} exceedances are equal; the scores are too discrete for a GPD fit")
    xi, sigma, loglik, grid, profile = _maximise(y, xi_range, grid_size)

    covariance, se_method = _parameter_covariance(y, xi, sigma, xi_range, grid_size, n_bootstrap, seed)
    xi_se, sigma_se = (float(math.sqrt(max(covariance[i, i], 0.0))) for i in range(2))
    endpoint, endpoint_se = _endpoint(threshold, xi, sigma, covariance)

    exponential_sigma = float(y.mean())
    exponential_loglik = gpd_loglik(y, 0.0, exponential_sigma)
    lr_statistic = max(2.0 * (loglik - exponential_loglik), 0.0)
    return GPDFit(
        xi=xi,
        sigma=sigma,
        threshold=threshold,
        quantile=quantile_used,
        xi_se=xi_se,
        sigma_se=sigma_se,
        endpoint=float(endpoint),
        endpoint_se=endpoint_se,
        n_exceedances=int(y.size),
        n_scores=int(values.size),
        loglik=float(loglik),
        exponential_sigma=exponential_sigma,
        exponential_loglik=float(exponential_loglik),
        lr_statistic=float(lr_statistic),
        lr_pvalue=float(stats.chi2.sf(lr_statistic, df=1)),
        se_method=se_method,
        profile_xi=grid,
        profile_loglik=profile,
        exceedances=np.sort(y),
    )


def threshold_stability(scores, quantiles=None, **fit_kwargs) -> list[dict]:
    """xi-hat (with its standard error) refitted at a range of thresholds, by default the 0.98-0.995 quantiles.

    Above a high enough threshold the GPD shape does not depend on the threshold, so a flat curve supports the
    fit. Thresholds that leave too few exceedances are reported with an ``error`` entry instead of numbers.
    """
    values = _validated_scores(scores)
    quantiles = np.linspace(0.98, 0.995, 7) if quantiles is None else np.asarray(quantiles, dtype=float)
    rows = []
    for q in quantiles:
        try:
            fit = fit_gpd(values, float(q), **fit_kwargs)
        except ValueError as error:
            rows.append({"quantile": float(q), "error": str(error)})
            continue
        rows.append(
            {
                "quantile": float(q),
                "threshold": fit.threshold,
                "xi": fit.xi,
                "xi_se": fit.xi_se,
                "sigma": fit.sigma,
                "endpoint": _json_number(fit.endpoint),
                "n_exceedances": fit.n_exceedances,
            }
        )
    return rows
