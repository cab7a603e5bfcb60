"""Extreme-value diagnostics and the negatives-count theory: known answers on synthetic data, clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from simcse_weince.diagnostics import (
    GPDFit,
    fit_gpd,
    fit_link,
    k_sweep,
    proposition1_bounds,
    shortfall_transform,
    tail_agreement,
    threshold_stability,
)

# ------------------------------------------------------------------------------------------------ POT


def test_gpd_fit_recovers_xi_and_its_standard_error_over_repeated_draws():
    xi_true, sigma_true, n = -0.4, 0.1, 20_000
    fits = [
        fit_gpd(stats.genpareto.rvs(xi_true, scale=sigma_true, size=n, random_state=seed), threshold=0.0)
        for seed in range(16)
    ]
    xis = np.array([f.xi for f in fits])
    assert np.all(np.abs(xis - xi_true) < 0.05)
    assert all(f.n_exceedances == n and f.se_method == "observed_information" for f in fits)
    # The reported standard error matches the spread over draws and the asymptotic (1 + xi) / sqrt(n).
    mean_se = np.mean([f.xi_se for f in fits])
    assert 0.6 < mean_se / xis.std(ddof=1) < 1.6
    assert mean_se == pytest.approx((1 + xi_true) / math.sqrt(n), rel=0.15)
    # Implied endpoint u - sigma/xi = 0.25, within its delta-method interval.
    endpoints = np.array([f.endpoint for f in fits])
    endpoint_se = np.array([f.endpoint_se for f in fits])
    assert np.mean(np.abs(endpoints - 0.25) < 2.5 * endpoint_se) >= 0.8
    assert fits[0].lr_pvalue < 1e-10 and fits[0].weibull_domain


def test_gpd_fit_at_a_quantile_threshold_is_the_same_tail_and_beats_scipy_fit():
    # Exceedances of a GPD over any threshold are GPD with the same shape (threshold stability).
    scores = stats.genpareto.rvs(-0.3, loc=0.2, scale=0.1, size=50_000, random_state=1)
    fit = fit_gpd(scores, quantile=0.9)
    assert fit.quantile == 0.9
    assert fit.threshold == pytest.approx(np.quantile(scores, 0.9))
    assert fit.n_exceedances == pytest.approx(5_000, abs=2)
    assert fit.xi == pytest.approx(-0.3, abs=3 * fit.xi_se + 0.01)
    assert fit.endpoint == pytest.approx(0.2 + 0.1 / 0.3, abs=3 * fit.endpoint_se)
    # Known answer: the maximum likelihood scipy finds on the same exceedances, ours is at least as high.
    y = fit.exceedances
    shape, _, scale = stats.genpareto.fit(y, floc=0)
    assert fit.loglik >= stats.genpareto.logpdf(y, shape, scale=scale).sum() - 1e-6
    assert fit.loglik == pytest.approx(stats.genpareto.logpdf(y, fit.xi, scale=fit.sigma).sum(), rel=1e-9)


def test_exponential_tail_is_not_rejected_and_bootstrap_se_agrees_with_information():
    scores = stats.expon.rvs(scale=0.05, size=3_000, random_state=2)
    fit = fit_gpd(scores, threshold=0.0)
    assert abs(fit.xi) < 3 * fit.xi_se
    assert fit.lr_pvalue > 0.01
    assert fit.exponential_sigma == pytest.approx(scores.mean())
    assert math.isinf(fit.endpoint) or fit.endpoint > scores.max()
    boot = fit_gpd(scores, threshold=0.0, n_bootstrap=40, seed=0)
    assert boot.se_method == "bootstrap"
    assert boot.xi == fit.xi
    assert 0.5 < boot.xi_se / fit.xi_se < 2.0
    summary = fit.to_dict()
    assert "exceedances" not in summary and summary["n_exceedances"] == 3_000


def test_threshold_stability_spans_the_documented_quantiles():
    scores = stats.genpareto.rvs(-0.4, scale=0.1, size=40_000, random_state=3)
    rows = threshold_stability(scores)
    assert [round(r["quantile"], 4) for r in rows] == [0.98, 0.9825, 0.985, 0.9875, 0.99, 0.9925, 0.995]
    for row in rows:
        assert abs(row["xi"] + 0.4) < 4 * row["xi_se"] + 0.05
    # A threshold with too few exceedances is reported, not a crash or a NaN.
    rows = threshold_stability(scores[:3_000], quantiles=[0.98, 0.995])
    assert "xi" in rows[0] and "error" in rows[1]


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        (np.array([0.1, np.nan, 0.3] * 100), "NaN"),
        (np.full(5_000, 0.3), "equal"),
        (np.linspace(0, 1, 1_000), "exceed"),  # 10 exceedances at the 0.99 quantile
        (np.r_[np.zeros(9_800), np.full(200, 1.0)], "exceed"),  # nothing strictly above a tied quantile
        (np.r_[np.linspace(0, 0.5, 9_900), np.full(100, 0.9)], "equal"),  # all exceedances tied
        (np.array([]), "empty"),
    ],
)
def test_gpd_degenerate_inputs_raise_clear_errors(scores, message):
    with pytest.raises(ValueError, match=message):
        fit_gpd(scores)


def test_gpd_fit_is_a_dataclass_with_the_documented_fields():
    fit = fit_gpd(stats.genpareto.rvs(-0.2, scale=1.0, size=2_000, random_state=4), quantile=0.5)
    assert isinstance(fit, GPDFit)
    for name in (
        "xi",
        "sigma",
        "threshold",
        "xi_se",
        "sigma_se",
        "endpoint",
        "n_exceedances",
        "loglik",
        "exponential_loglik",
        "lr_statistic",
        "lr_pvalue",
    ):
        value = getattr(fit, name)
        assert np.isfinite(value), name


# ------------------------------------------------------------------------------------------- the link


def _link_draws(rng, observations, candidates, scale, mixing):
    """Scores in (-0.3, 1) and a winner per row drawn from softmax(scale * T_mixing(scores))."""
    scores = 1.0 - 1.3 * rng.beta(1.2, 3.0, size=(observations, candidates))
    logits = scale * shortfall_transform(scores, mixing)
    winners = (logits + rng.gumbel(size=logits.shape)).argmax(axis=1)  # Gumbel-max = softmax sampling
    return scores, winners


def test_link_interval_covers_the_true_mixing_weight():
    rng = np.random.default_rng(0)
    covered = 0
    repeats = 40
    for _ in range(repeats):
        scores, winners = _link_draws(rng, 300, 16, scale=8.0, mixing=0.4)
        fit = fit_link(scores, winners)
        low, high = fit.mixing_ci
        assert 0.0 <= low <= fit.mixing <= high <= 1.0
        covered += low <= 0.4 <= high
    assert covered / repeats >= 0.9


def test_link_fit_recovers_theta_and_lambda_and_tests_the_softmax_link():
    rng = np.random.default_rng(1)
    scores, winners = _link_draws(rng, 4_000, 32, scale=8.0, mixing=0.4)
    fit = fit_link(scores, winners)
    assert fit.mixing_ci[0] <= 0.4 <= fit.mixing_ci[1]
    assert fit.lambda_hat == pytest.approx(0.4, abs=0.2)  # lambda and theta trade off: sd ~0.07 here
    assert fit.theta_hat == pytest.approx(8.0, abs=3 * fit.scale_se)
    assert fit.lr_pvalue < 1e-3  # the softmax link alone is rejected
    assert fit.loglik >= fit.softmax_loglik
    # the LR statistic and its boundary-mixture p-value (0.5 chi2_0 + 0.5 chi2_1), by hand
    from scipy.stats import chi2

    assert fit.lr_statistic == pytest.approx(2 * (fit.loglik - fit.softmax_loglik), rel=1e-12)
    assert fit.lr_pvalue == pytest.approx(0.5 * chi2.sf(fit.lr_statistic, df=1), rel=1e-12)
    # Data from the softmax link: lambda = 0 is inside the interval and not rejected.
    scores, winners = _link_draws(rng, 2_000, 16, scale=10.0, mixing=0.0)
    fit = fit_link(scores, winners)
    assert fit.mixing_ci[0] == 0.0 and fit.lr_pvalue > 0.01
    assert fit.softmax_scale == pytest.approx(10.0, rel=0.2)
    assert fit.to_dict()["profile"]["mixing"][0] == 0.0


def test_shortfall_transform_is_the_nested_family():
    s = np.array([-0.5, 0.0, 0.5, 1.0])
    assert np.allclose(shortfall_transform(s, 0.0), s)
    assert np.allclose(shortfall_transform(s[:3], 1.0), -np.log1p(-s[:3]))
    assert np.isfinite(shortfall_transform(s, 0.5)).all()  # s = 1 is floored at 1 - eps, not inf


def test_link_degenerate_inputs_raise_clear_errors():
    rng = np.random.default_rng(2)
    scores = rng.uniform(-0.2, 0.5, size=(50, 8))
    scores[:, 0] = 0.9  # the positive always wins: separable
    with pytest.raises(ValueError, match="not identifiable"):
        fit_link(scores)
    with pytest.raises(ValueError, match="NaN"):
        fit_link(np.where(scores > 0.4, np.nan, scores))
    with pytest.raises(ValueError, match="equal"):
        fit_link(np.full((20, 4), 0.3))
    with pytest.raises(ValueError, match="candidates"):
        fit_link(scores[:, :1])
    with pytest.raises(ValueError, match="cosine"):
        fit_link(scores * 3)
    with pytest.raises(ValueError, match="winners"):
        fit_link(scores, winners=np.full(50, 8))


# ------------------------------------------------------------------------------------------- k-sweep


def test_k_sweep_recovers_the_closed_form_limit():
    # Negatives from a discrete distribution: E exp(s/tau) is a finite sum, so CE_inf is known exactly.
    values, probs, tau, positive = np.array([-0.2, 0.1, 0.4]), np.array([0.5, 0.3, 0.2]), 0.2, 0.7
    mean_w = (probs * np.exp(values / tau)).sum()
    var_w = (probs * np.exp(2 * values / tau)).sum() - mean_w**2
    ce_inf = -positive / tau + math.log(mean_w)
    rng = np.random.default_rng(0)
    negatives = rng.choice(values, size=(200, 2048), p=probs)
    result = k_sweep(np.full(200, positive), negatives, temperature=tau, n_draws=4)
    assert result.ks == [2**i for i in range(12)]
    assert result.fit_ks == [256, 512, 1024, 2048]
    assert abs(result.ce_inf_fit - ce_inf) < 2 * result.ce_inf_fit_se
    assert abs(result.ce_inf_direct - ce_inf) < 2 * result.ce_inf_direct_se
    assert abs(result.dcl_ce_inf_fit - ce_inf) < 2 * result.dcl_ce_inf_fit_se
    # The DCL leading coefficient: predicted from the pool vs analytic, and the fitted slope agrees.
    assert result.dcl_predicted_slope == pytest.approx(-0.5 * var_w / mean_w**2, rel=0.03)
    assert abs(result.dcl_slope - result.dcl_predicted_slope) < 3 * result.dcl_slope_se
    # Decoupled R~_k sits below CE_inf; R_k decreases towards it; Proposition 1 holds.
    assert all(d < ce_inf + 0.01 for d in result.dcl_k)
    assert result.within_bounds and result.large_k_regime
    assert result.k_scale == pytest.approx(math.exp(-ce_inf), rel=0.05)


def test_k_sweep_flags_a_sweep_far_from_the_large_k_limit():
    rng = np.random.default_rng(1)
    negatives = rng.uniform(-0.1, 0.4, size=(50, 512))
    result = k_sweep(np.full(50, 0.85), negatives, temperature=0.05, n_draws=2)
    assert not result.large_k_regime and result.k_scale > 1e4
    assert result.r_k[-1] == pytest.approx(-math.log(512), abs=0.2)  # the positive's own term dominates
    table = result.table()
    assert [row["k"] for row in table] == result.ks and table[-1]["r_k"] == result.r_k[-1]
    summary = result.to_dict()
    assert summary["n_anchors"] == 50 and len(summary["bound_upper"]) == len(summary["ks"])


def test_proposition1_bounds_are_finite_where_they_should_be():
    lower, upper = proposition1_bounds([1, 10, 100], 0.5)
    assert np.all(lower < 0) and np.all(upper > 0)
    assert upper[0] == pytest.approx((math.exp(4) - 1) ** 2 / 8)
    assert lower[2] == pytest.approx(-math.log(1 + math.exp(4) / 100))
    lower, upper = proposition1_bounds([64], 0.001)  # e^{2000} overflows: inf, not NaN
    assert np.isinf(upper).all() and np.isfinite(lower).all()


def test_k_sweep_degenerate_inputs_raise_clear_errors():
    negatives = np.random.default_rng(0).uniform(-0.2, 0.4, size=(10, 64))
    with pytest.raises(ValueError, match="NaN"):
        k_sweep(np.r_[np.nan, np.zeros(9)], negatives)
    with pytest.raises(ValueError, match="one per anchor"):
        k_sweep(np.zeros(9), negatives)
    with pytest.raises(ValueError, match="temperature"):
        k_sweep(np.zeros(10), negatives, temperature=0.0)
    with pytest.raises(ValueError, match="two ks"):
        k_sweep(np.zeros(10), negatives, ks=[1, 2, 64])
    with pytest.raises(ValueError, match="anchors x pool"):
        k_sweep(np.zeros(10), negatives[0])


@pytest.mark.parametrize("module", ["pot", "link", "ksweep"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    results = doctest.testmod(importlib.import_module(f"simcse_weince.diagnostics.{module}"))
    assert results.attempted > 0 and results.failed == 0


def test_tail_agreement_summarises_the_core_statistics():
    sims = np.random.default_rng(0).uniform(-0.3, 0.9, size=(16, 400))
    summary = tail_agreement(sims)
    assert summary["anchors"] == 16 and summary["negatives_per_anchor"] == 400
    assert 0.0 <= summary["share_weibull_favoured"] <= 1.0
    assert summary["beta_hat_mean"] > 0
