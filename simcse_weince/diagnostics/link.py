"""Link selection: which link turns similarities into the softmax that picks the positive?
(docs/method.md#link-selection)

Each observation is one anchor's candidate set (its positive and its negatives, as in a contrastive batch) with
the index of the *winner*, the candidate that is the positive. The nested link family::

    logit(s) = theta * T_lambda(s),      T_lambda(s) = (1 - lambda) * s + lambda * (-log(1 - s))

(scale theta > 0, lambda in [0, 1]) contains InfoNCE's softmax link (lambda = 0, theta = 1/tau) and the pure
endpoint-shortfall link of WEINCE (lambda = 1). Its parameters are identifiable, unlike a free tau and beta
together. We maximise the multinomial likelihood ``P(winner) = softmax(theta * T_lambda(scores))[winner]``
over both. For each lambda the log-likelihood is concave in theta (the logits are linear in theta), so theta
is profiled out with Newton's method; lambda is then maximised on a grid refined with scipy. A lambda-hat well
away from 0 says the softmax link alone fits the winners worse.

The confidence interval for lambda is the profile-likelihood interval ``{lambda: 2 (l_max - l_p(lambda)) <=
chi2_1(level)}``, clipped to [0, 1]. The likelihood-ratio test of lambda = 0 refers the statistic to the
boundary mixture ``0.5 chi2_0 + 0.5 chi2_1`` (lambda = 0 lies on the edge of the parameter space; Self &
Liang, 1987).

Example::

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> scores = rng.uniform(-0.3, 0.99, size=(2000, 32))           # one row per anchor's candidate set
    >>> logits = 8.0 * shortfall_transform(scores, 0.4)
    >>> winners = (logits + rng.gumbel(size=logits.shape)).argmax(axis=1)
    >>> fit = fit_link(scores, winners)
    >>> fit.mixing_ci[0] <= 0.4 <= fit.mixing_ci[1]
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import optimize, stats
from scipy.special import logsumexp

__all__ = ["LinkFit", "fit_link", "link_loglik", "shortfall_transform"]


def shortfall_transform(scores: np.ndarray, mixing: float, eps: float = 1e-6) -> np.ndarray:
    """``T_lambda(s) = (1 - lambda) s + lambda (-log(1 - min(s, 1 - eps)))``."""
    scores = np.asarray(scores, dtype=np.float64)
    return (1.0 - mixing) * scores + mixing * -np.log1p(-np.minimum(scores, 1.0 - eps))


@dataclass
class LinkFit:
    """Maximum-likelihood fit of the nested link ``theta * T_lambda(s)`` to observed winners."""

    mixing: float  # lambda-hat
    scale: float  # theta-hat
    scale_se: float
    mixing_ci: tuple[float, float]
    confidence_level: float
    loglik: float
    softmax_scale: float  # theta-hat under lambda = 0 (that is 1 / tau-hat of plain InfoNCE)
    softmax_loglik: float
    lr_statistic: float
    lr_pvalue: float
    n_observations: int
    n_candidates: int
    winner_top1_rate: float  # share of observations whose winner has the highest score
    profile_mixing: np.ndarray = field(repr=False)
    profile_loglik: np.ndarray = field(repr=False)

    # the paper's names
    @property
    def lambda_hat(self) -> float:
        return self.mixing

    @property
    def theta_hat(self) -> float:
        return self.scale

    def to_dict(self) -> dict:
        summary = asdict(self)
        summary.pop("profile_mixing")
        summary.pop("profile_loglik")
        summary["mixing_ci"] = [float(v) for v in self.mixing_ci]
        summary["profile"] = {
            "mixing": [float(v) for v in self.profile_mixing],
            "loglik": [float(v) for v in self.profile_loglik],
        }
        return summary


def link_loglik(transformed: np.ndarray, winners: np.ndarray, scale: float) -> float:
    """Log-likelihood of the winners under ``softmax(scale * transformed)`` (observations x candidates)."""
    logits = scale * transformed
    return float((logits[np.arange(len(winners)), winners] - logsumexp(logits, axis=1)).sum())


def _loglik_and_derivatives(transformed, winner_values, scale):
    """Log-likelihood and its first two derivatives in theta, from one pass over the logits."""
    logits = scale * transformed
    top = logits.max(axis=1, keepdims=True)
    weights = np.exp(logits - top)
    total = weights.sum(axis=1, keepdims=True)
    probs = weights / total
    log_normaliser = top[:, 0] + np.log(total[:, 0])
    mean = (probs * transformed).sum(axis=1)
    variance = np.maximum((probs * transformed**2).sum(axis=1) - mean**2, 0.0)
    loglik = float((scale * winner_values - log_normaliser).sum())
    return loglik, float((winner_values - mean).sum()), float(variance.sum())


def _profile_scale(transformed, winners, start: float = 1.0, max_scale: float = 1e6):
    """The theta maximising the (concave) log-likelihood for fixed transformed scores, by damped Newton."""
    winner_values = transformed[np.arange(len(winners)), winners]
    scale = start
    loglik, gradient, curvature = _loglik_and_derivatives(transformed, winner_values, scale)
    for _ in range(100):
        if curvature <= 1e-300:
            break
        step = gradient / curvature
        while scale + step <= 0:  # stay inside theta > 0
            step /= 2
        while True:  # damping (rarely needed: the log-likelihood is concave in theta)
            new_scale = min(scale + step, max_scale)
            new = _loglik_and_derivatives(transformed, winner_values, new_scale)
            if new[0] >= loglik - 1e-12 or abs(step) <= 1e-12 * max(1.0, scale):
                break
            step /= 2
        converged = abs(new_scale - scale) <= 1e-9 * max(1.0, scale)
        scale, (loglik, gradient, curvature) = new_scale, new
        if converged or scale >= max_scale:
            break
    return scale, loglik


def _validated(scores, winners):
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] < 2 or scores.shape[0] < 1:
        raise ValueError(
            f"scores must be observations x candidates with at least 2 candidates, got shape {scores.shape}"
        )
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores contain NaN or infinite values")
    if scores.max() > 1.0 + 1e-5 or scores.min() < -1.0 - 1e-5:
        raise ValueError(
            f"scores must be cosine similarities in [-1, 1], got range [{scores.min():.4g}, {scores.max():.4g}]"
        )
    if winners is None:
        winners = np.zeros(scores.shape[0], dtype=np.int64)
    winners = np.asarray(winners)
    if winners.shape != (scores.shape[0],) or not np.issubdtype(winners.dtype, np.integer):
        raise ValueError(f"winners must be {scores.shape[0]} integer column indices, got shape {winners.shape}")
    if winners.min() < 0 or winners.max() >= scores.shape[1]:
        raise ValueError(f"winners must index the {scores.shape[1]} candidate columns")
    if np.ptp(scores) <= 0:
        raise ValueError("all scores are equal: the winners carry no information about the link")
    return scores, winners.astype(np.int64)


def _winner_beaten(scores, winners) -> np.ndarray:
    """Per observation: does another candidate score at least as high as the winner? Refuses separable winners."""
    rows = np.arange(len(winners))
    winner_scores = scores[rows, winners]
    others = scores.copy()
    others[rows, winners] = -np.inf
    beaten = others.max(axis=1) >= winner_scores  # some other candidate scores at least as high
    if not beaten.any():
        raise ValueError(
            f"the winner has the strictly highest score in all {len(winners)} observations: the link likelihood "
            "grows without bound in theta and lambda is not identifiable. Use harder candidate sets (more "
            "negatives per observation, in-domain negatives, or positives that are not near-copies)."
        )
    return beaten


class _MixingProfile:
    """The profile likelihood in lambda: ``profile(mixing) -> (theta-hat, log-likelihood)``, lambda clipped to
    [0, 1]. Every lambda evaluated is kept in ``cache`` (the fit reports them as its profile), and each Newton
    solve starts from the last theta-hat found, as neighbouring lambdas have close theta-hats."""

    def __init__(self, scores, winners, eps: float):
        self.scores, self.winners, self.eps = scores, winners, eps
        self.cache: dict[float, tuple[float, float]] = {}
        self.start = 1.0 / max(np.std(scores), 1e-3)

    def __call__(self, mixing: float) -> tuple[float, float]:
        mixing = float(min(max(mixing, 0.0), 1.0))
        if mixing not in self.cache:
            transformed = shortfall_transform(self.scores, mixing, self.eps)
            self.cache[mixing] = _profile_scale(transformed, self.winners, self.start)
            self.start = self.cache[mixing][0]  # warm start for the neighbouring lambda
        return self.cache[mixing]


def _maximise_profile(profile: _MixingProfile, grid_size: int) -> float:
    """lambda-hat: the best point of a grid on [0, 1], refined by scipy between its neighbours (kept only if
    better)."""
    grid = np.linspace(0.0, 1.0, grid_size)
    grid_loglik = np.array([profile(m)[1] for m in grid])
    best = int(np.argmax(grid_loglik))
    left, right = grid[max(best - 1, 0)], grid[min(best + 1, grid_size - 1)]
    refined = optimize.minimize_scalar(
        lambda m: -profile(m)[1], bounds=(left, right), method="bounded", options={"xatol": 1e-6}
    )
    return float(refined.x) if -refined.fun >= grid_loglik[best] else float(grid[best])


def _profile_interval(profile: _MixingProfile, mixing: float, loglik: float, confidence_level: float):
    """Profile-likelihood interval: where the deviance crosses the chi-square quantile on each side of lambda-hat
    (an end of [0, 1] where it does not cross)."""
    critical = float(stats.chi2.ppf(confidence_level, df=1))

    def deviance(m):
        return 2.0 * (loglik - profile(m)[1]) - critical

    lower = 0.0
    if deviance(0.0) > 0 and mixing > 0:
        lower = optimize.brentq(deviance, 0.0, mixing, xtol=1e-6)
    upper = 1.0
    if deviance(1.0) > 0 and mixing < 1:
        upper = optimize.brentq(deviance, mixing, 1.0, xtol=1e-6)
    return lower, upper


def fit_link(
    scores,
    winners=None,
    *,
    grid_size: int = 21,
    confidence_level: float = 0.95,
    eps: float = 1e-6,
) -> LinkFit:
    """Maximum-likelihood fit of ``theta * T_lambda(s)`` to the winners of many candidate sets.

    Args:
        scores: ``observations x candidates`` cosine similarities (one row per anchor: its positive and its
            negatives).
        winners: the column of each row's winner (the positive); default column 0 for every row.
        grid_size: lambda grid on [0, 1] for the profile likelihood (then refined with scipy).
        confidence_level: of the profile-likelihood interval for lambda.
        eps: shortfalls are floored at eps (a score of 1 gives ``-log eps``, not inf).

    Returns:
        :class:`LinkFit` with lambda-hat (``mixing``), theta-hat (``scale``), the interval, the LR test of
        lambda = 0 and the profile.

    Raises:
        ValueError: bad shapes, NaN, all-equal scores, or *separable* winners (every winner has the highest
            score of its row: the likelihood then grows without bound in theta and lambda is not identified).
    """
    scores, winners = _validated(scores, winners)
    beaten = _winner_beaten(scores, winners)
    profile = _MixingProfile(scores, winners, eps)
    mixing = _maximise_profile(profile, grid_size)
    scale, loglik = profile(mixing)
    lower, upper = _profile_interval(profile, mixing, loglik, confidence_level)

    softmax_scale, softmax_loglik = profile(0.0)
    lr_statistic = max(2.0 * (loglik - softmax_loglik), 0.0)
    # lambda = 0 sits on the boundary: the null distribution is 0.5 chi2_0 + 0.5 chi2_1.
    lr_pvalue = 1.0 if lr_statistic <= 0 else 0.5 * float(stats.chi2.sf(lr_statistic, df=1))

    scale_se = _scale_standard_error(scores, winners, mixing, scale, eps)
    profile_mixing = np.array(sorted(profile.cache))
    return LinkFit(
        mixing=mixing,
        scale=float(scale),
        scale_se=scale_se,
        mixing_ci=(float(lower), float(upper)),
        confidence_level=confidence_level,
        loglik=float(loglik),
        softmax_scale=float(softmax_scale),
        softmax_loglik=float(softmax_loglik),
        lr_statistic=float(lr_statistic),
        lr_pvalue=lr_pvalue,
        n_observations=int(scores.shape[0]),
        n_candidates=int(scores.shape[1]),
        winner_top1_rate=float(1.0 - beaten.mean()),
        profile_mixing=profile_mixing,
        profile_loglik=np.array([profile.cache[m][1] for m in profile_mixing]),
    )


def _scale_standard_error(scores, winners, mixing, scale, eps) -> float:
    """Standard error of theta-hat from the observed information of (theta, lambda) (theta alone on a boundary)."""

    def loglik(theta, lam):
        return link_loglik(shortfall_transform(scores, lam, eps), winners, theta)

    h_theta = 1e-4 * scale
    h_lam = 1e-4
    d_tt = (loglik(scale + h_theta, mixing) - 2 * loglik(scale, mixing) + loglik(scale - h_theta, mixing)) / h_theta**2
    if 0.0 + h_lam < mixing < 1.0 - h_lam:
        d_ll = (loglik(scale, mixing + h_lam) - 2 * loglik(scale, mixing) + loglik(scale, mixing - h_lam)) / h_lam**2
        d_tl = (
            loglik(scale + h_theta, mixing + h_lam)
            - loglik(scale + h_theta, mixing - h_lam)
            - loglik(scale - h_theta, mixing + h_lam)
            + loglik(scale - h_theta, mixing - h_lam)
        ) / (4 * h_theta * h_lam)
        information = -np.array([[d_tt, d_tl], [d_tl, d_ll]])
        if np.all(np.linalg.eigvalsh(information) > 0):
            return float(math.sqrt(np.linalg.inv(information)[0, 0]))
    return float(math.sqrt(1.0 / -d_tt)) if d_tt < 0 else math.inf
