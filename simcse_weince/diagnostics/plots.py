"""Figures for the diagnostics (matplotlib, headless): each function returns a Figure and, given ``path``,
saves it as a small PNG.

* :func:`plot_exceedances` — exceedance density, linear and log-log, with the GPD and exponential fits and the
  implied endpoint (the "cap").
* :func:`plot_qq` — QQ plots of both fits.
* :func:`plot_threshold_stability` — xi-hat with 95% intervals across thresholds.
* :func:`plot_link_profile` — profile log-likelihood of lambda with its interval.
* :func:`plot_k_sweep` — R_k and the decoupled R~_k against 1/k with the fitted lines and CE_inf.
* :func:`plot_lambda_statistics` — the trainer's per-step WEINCE statistics over training.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy import stats

from simcse_weince.records import RecordError, check_count, read_metrics_log
from simcse_weince.weince.config import STATISTIC_KEYS

__all__ = [
    "load_training_log",
    "plot_exceedances",
    "plot_k_sweep",
    "plot_lambda_statistics",
    "plot_link_profile",
    "plot_qq",
    "plot_threshold_stability",
]

# Axis labels of the statistics simcse_weince.weince.STATISTIC_KEYS names (a test checks both name the same set).
_LABELS = {
    "lambda_mean": "mean mixing weight λ",
    "lambda_above_half": "share of anchors with λ > 0.5",
    "rho0": "ρ₀ (hardness reference)",
    "delta_aic_mean": "mean ΔAIC (Gumbel − Weibull)",
    "beta_hat_mean": "mean β̂ (tail index)",
}
_DPI = 90


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _finish(figure, path):
    figure.tight_layout()
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=_DPI)
    return figure


def _gpd_pdf(y, xi, sigma):
    return stats.genpareto.pdf(y, xi, scale=sigma)


def plot_exceedances(fit, path=None, bins: int = 60):
    """Histogram density of the exceedances ``y = s - u`` with the GPD and exponential (xi = 0) densities.

    Left: linear axes. Right: log-log axes (a Weibull-domain tail bends down before its endpoint, an
    exponential one does so more gently). Vertical lines: the implied GPD endpoint ``u - sigma/xi`` (when
    xi < 0 and it lies within reach) and the cosine cap ``s = 1``.
    """
    plt = _pyplot()
    y = fit.exceedances
    cap = 1.0 - fit.threshold
    endpoint = fit.endpoint - fit.threshold if math.isfinite(fit.endpoint) else math.inf
    right = 1.05 * max(y.max(), cap if cap < 2 * y.max() else y.max(), endpoint if endpoint < 1.5 * cap else 0)
    figure, (linear, loglog) = plt.subplots(1, 2, figsize=(10, 3.8))
    grid = np.linspace(0, right, 400)
    linear.hist(y, bins=bins, density=True, color="0.8", edgecolor="0.6", label=f"exceedances (n={y.size})")
    linear.plot(grid, _gpd_pdf(grid, fit.xi, fit.sigma), color="C0", lw=2, label=f"GPD, ξ̂ = {fit.xi:.3f}")
    linear.plot(
        grid,
        stats.expon.pdf(grid, scale=fit.exponential_sigma),
        color="C3",
        lw=1.5,
        ls="--",
        label="exponential (ξ = 0)",
    )
    endpoint_label = f"GPD endpoint {fit.endpoint:.3f}" if math.isfinite(endpoint) else "no GPD endpoint (ξ̂ ≥ 0)"
    for axis in (linear, loglog):
        if endpoint <= right:
            axis.axvline(endpoint, color="k", ls=":", label=endpoint_label)
        if cap <= right:
            axis.axvline(cap, color="0.5", ls="-.", lw=1, label="cosine cap s = 1")
    if endpoint > right:
        linear.plot([], [], " ", label=endpoint_label)  # named in the legend even when off the axis
    linear.set_xlim(0, right)
    linear.set_xlabel(f"exceedance s − u   (u = {fit.threshold:.3f})")
    linear.set_ylabel("density")
    linear.set_title("Exceedances over the threshold")
    linear.legend(fontsize=8)

    edges = np.geomspace(max(y.min(), y.max() * 1e-3), y.max(), bins // 2)
    counts, edges = np.histogram(y, bins=edges)
    centres = np.sqrt(edges[:-1] * edges[1:])
    density = counts / (y.size * np.diff(edges))
    shown = counts > 0
    loglog.loglog(centres[shown], density[shown], "o", color="0.4", ms=4, label="empirical")
    xs = np.geomspace(edges[0], right, 300)
    loglog.loglog(xs, _gpd_pdf(xs, fit.xi, fit.sigma), color="C0", lw=2, label="GPD")
    loglog.loglog(
        xs, stats.expon.pdf(xs, scale=fit.exponential_sigma), color="C3", ls="--", label="exponential (ξ = 0)"
    )
    loglog.set_ylim(bottom=max(density[shown].min() / 10, 1e-6))
    loglog.set_xlabel("exceedance s − u")
    loglog.set_ylabel("density")
    loglog.set_title("Log-log")
    loglog.legend(fontsize=8, loc="lower left")
    return _finish(figure, path)


def plot_qq(fit, path=None):
    """Empirical exceedance quantiles against the fitted GPD and exponential quantiles (plotting positions
    ``i / (n + 1)``); points on the diagonal mean a good fit."""
    plt = _pyplot()
    y = fit.exceedances
    positions = np.arange(1, y.size + 1) / (y.size + 1)
    figure, axes = plt.subplots(1, 2, figsize=(8, 3.8), sharey=True)
    models = [
        (f"GPD (ξ̂ = {fit.xi:.3f})", stats.genpareto.ppf(positions, fit.xi, scale=fit.sigma), "C0"),
        ("exponential (ξ = 0)", stats.expon.ppf(positions, scale=fit.exponential_sigma), "C3"),
    ]
    cap = 1.0 - fit.threshold  # cosine similarity cannot exceed 1
    limit = 1.15 * max(y.max(), cap)
    for axis, (name, theoretical, colour) in zip(axes, models):
        inside = theoretical <= limit
        axis.plot(theoretical[inside], y[inside], ".", color=colour, ms=3, label="exceedances")
        axis.plot([0, limit], [0, limit], color="k", lw=1, label="y = x")
        axis.axhline(cap, color="0.5", ls=":", lw=1, label="cosine cap s = 1")
        clipped = int((~inside).sum())
        axis.set_xlim(0, limit)
        axis.set_xlabel(f"{name} quantile" + (f"  ({clipped} beyond the axis)" if clipped else ""))
        axis.set_title(f"QQ: {name}")
        axis.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("empirical exceedance quantile")
    return _finish(figure, path)


def plot_threshold_stability(rows, path=None):
    """xi-hat ± 1.96 se against the threshold quantile (``rows`` from :func:`threshold_stability`)."""
    plt = _pyplot()
    rows = [row for row in rows if "xi" in row]
    if not rows:
        raise ValueError("no threshold produced a fit; nothing to plot")
    quantiles = np.array([row["quantile"] for row in rows])
    xis = np.array([row["xi"] for row in rows])
    errors = 1.96 * np.array([row["xi_se"] for row in rows])
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    axis.errorbar(quantiles, xis, yerr=errors, fmt="o-", capsize=3, color="C0", label="ξ̂ ± 1.96 se")
    axis.axhline(0.0, color="C3", ls="--", lw=1, label="ξ = 0 (Gumbel domain)")
    axis.set_xlabel("threshold quantile")
    axis.set_ylabel("GPD shape ξ̂")
    axis.set_title("Threshold stability")
    axis.legend(fontsize=8)
    return _finish(figure, path)


def plot_link_profile(link_fit, path=None):
    """Profile deviance ``2 (l_max - l_p(lambda))`` with the chi-square cut-off and the interval."""
    plt = _pyplot()
    deviance = 2.0 * (link_fit.loglik - link_fit.profile_loglik)
    critical = stats.chi2.ppf(link_fit.confidence_level, df=1)
    figure, axis = plt.subplots(figsize=(5.5, 3.6))
    axis.plot(link_fit.profile_mixing, deviance, "-", color="C0", label="profile deviance")
    axis.axhline(critical, color="k", ls=":", lw=1, label=f"χ²₁ {link_fit.confidence_level:.0%} cut-off")
    low, high = link_fit.mixing_ci
    axis.axvspan(low, high, color="C0", alpha=0.15, label=f"CI [{low:.2f}, {high:.2f}]")
    axis.axvline(link_fit.mixing, color="C0", ls="--", lw=1, label=f"λ̂ = {link_fit.mixing:.3f}")
    axis.set_xlabel("λ (0 = softmax link, 1 = shortfall link)")
    axis.set_ylabel("2 (ℓ̂ − ℓ_p(λ))")
    axis.set_ylim(0, max(3 * critical, min(float(deviance.max()), 10 * critical)))
    axis.set_title(f"Link selection (n = {link_fit.n_observations}, {link_fit.n_candidates} candidates)")
    axis.legend(fontsize=8)
    return _finish(figure, path)


def plot_k_sweep(result, path=None, batch_size: int | None = None):
    """R_k (InfoNCE − log k) and the decoupled R~_k against 1/k, with the CE_inf + b/k fits and the direct
    CE_inf (band: ± 1.96 se). Left: every k, 1/k on a log axis. Right: the fit range on a linear 1/k axis.
    ``batch_size`` marks a training batch (k = batch_size − 1 negatives)."""
    plt = _pyplot()
    inverse = 1.0 / np.asarray(result.ks, dtype=float)
    in_fit = np.isin(result.ks, result.fit_ks)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, zoom in zip(axes, (False, True)):
        shown = in_fit if zoom else np.ones_like(in_fit)
        _draw_k_sweep_points(axis, result, inverse, shown)
        # the fitted lines span the fit range, and reach 1/k = 0 (k -> infinity) on the zoomed panel
        line = np.linspace(0 if zoom else inverse[in_fit].min(), inverse[in_fit].max(), 50)
        _draw_k_sweep_fits(axis, result, line)
        if not zoom:
            axis.set_xscale("log")
            if batch_size and batch_size > 1:
                axis.axvline(1.0 / (batch_size - 1), color="k", ls=":", lw=1, label=f"batch size {batch_size}")
            axis.set_title("all k (log 1/k axis)", fontsize=10)
        else:
            axis.set_xlim(left=0)
            axis.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
            axis.set_title(f"fit range k ≥ {min(result.fit_ks)}", fontsize=10)
        axis.set_xlabel("1 / k   (k = number of negatives)")
        axis.set_ylabel("nats")
    axes[0].legend(fontsize=7, loc="best")
    regime = (
        "large-k regime reached"
        if result.large_k_regime
        else (f"NOT in the large-k regime: needs k ≫ e^(−CE∞) ≈ {result.k_scale:.3g}")
    )
    figure.suptitle(
        f"InfoNCE vs the number of negatives: τ = {result.temperature:g}, {result.n_anchors} anchors, "
        f"pool {result.pool_size}; {regime}",
        fontsize=10,
    )
    return _finish(figure, path)


def _draw_k_sweep_points(axis, result, inverse, shown) -> None:
    """The measured R_k and R~_k at the ``shown`` ks, with ± 1.96 se bars."""
    r_k, r_se = np.asarray(result.r_k), 1.96 * np.asarray(result.r_k_se)
    dcl, dcl_se = np.asarray(result.dcl_k), 1.96 * np.asarray(result.dcl_k_se)
    axis.errorbar(
        inverse[shown], r_k[shown], yerr=r_se[shown], fmt="o", color="C0", ms=4, capsize=2,
        label="R_k = InfoNCE − log k",
    )  # fmt: skip
    axis.errorbar(
        inverse[shown], dcl[shown], yerr=dcl_se[shown], fmt="s", color="C2", ms=4, capsize=2,
        label="R̃_k (decoupled, no 1+)",
    )  # fmt: skip


def _draw_k_sweep_fits(axis, result, line) -> None:
    """Over ``line`` (values of 1/k): the fitted CE_inf + b/k of R_k and R~_k, the line with DCL's predicted slope
    through the direct CE_inf, and the direct CE_inf with its ± 1.96 se band."""
    fit_label = f"fit CE∞ + b/k → {result.ce_inf_fit:.3f} ± {result.ce_inf_fit_se:.3f}"
    axis.plot(line, result.ce_inf_fit + result.slope * line, color="C0", lw=1, label=fit_label)
    dcl_fit_label = f"DCL fit, slope {result.dcl_slope:.3g}"
    axis.plot(line, result.dcl_ce_inf_fit + result.dcl_slope * line, color="C2", lw=1, label=dcl_fit_label)
    predicted_label = f"DCL predicted slope {result.dcl_predicted_slope:.3g}"
    predicted = result.ce_inf_direct + result.dcl_predicted_slope * line
    axis.plot(line, predicted, color="C2", lw=1, ls=":", label=predicted_label)
    band = 1.96 * result.ce_inf_direct_se
    axis.axhspan(result.ce_inf_direct - band, result.ce_inf_direct + band, color="C1", alpha=0.25)
    direct_label = f"direct CE∞ = {result.ce_inf_direct:.3f} ± {result.ce_inf_direct_se:.3f}"
    axis.axhline(result.ce_inf_direct, color="C1", lw=1, label=direct_label)


def load_training_log(source) -> list[dict]:
    """Per-step statistics as a list of dicts (one per step, with a ``step`` key).

    ``source``: the trainers' log, ``<run>/logs/metrics.csv`` (long format ``step,name,value``, written by both
    the text and the vision trainer; a run folder stands for its log), or a list of dicts (e.g. the ``history``
    of ``results.json``).
    """
    if isinstance(source, (list, tuple)):
        rows, seen = [dict(row) for row in source], set()
        for index, row in enumerate(rows):
            if "step" in row:  # the same rule as the CSV log's: a step is a count, logged once
                step = check_count(row["step"], f"entry {index}'s step", "the training log")
                if step in seen:
                    raise RecordError(f"the training log holds step {step} twice (entry {index}); give one run's log")
                seen.add(step)
        return rows
    path = Path(source)
    if path.is_dir():
        path = path / "logs" / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(f"training log not found: {path} (a run's logs/metrics.csv)")
    by_step: dict[int, dict] = {}  # long format: one dict per step
    for step, name, value in read_metrics_log(path):  # refuses a negative or repeated step, naming it
        by_step.setdefault(step, {"step": step})[name] = value
    return list(by_step.values())


def lambda_series(log, keys=None) -> dict:
    """The per-step statistics of a training log that :func:`plot_lambda_statistics` plots: key -> an array of
    (step, value) rows, sorted by step. Raises ValueError naming the log when it is empty or has none of ``keys``
    (``diagnose`` calls it before its analysis, so that a bad ``--training-log`` changes nothing)."""
    if keys is None:
        keys = STATISTIC_KEYS
    rows = load_training_log(log)
    where = "" if isinstance(log, (list, tuple)) else f" {log}"
    if not rows:
        raise ValueError(f"the training log{where} is empty")
    series, only_nan = {}, []
    for key in keys:
        points, logged = [], False
        for index, row in enumerate(rows):
            value = row.get(key)
            try:
                value = float(value)
                step = float(row.get("step", index))
            except (TypeError, ValueError):
                continue
            logged = True
            if math.isfinite(value):
                points.append((step, value))
        if points:
            series[key] = np.array(sorted(points))
        elif logged:
            only_nan.append(key)
    if not series and only_nan:
        raise ValueError(
            f"the training log{where} holds only NaN (or infinite) values in {', '.join(only_nan)}: the statistics "
            f"were not finite at any logged step; look at the run's loss and learning rate"
        )
    if not series:
        raise ValueError(f"the training log{where} has none of the columns {', '.join(keys)}")
    return series


def plot_lambda_statistics(log, path=None, keys=None):
    """The trainer's per-step WEINCE statistics against the step, one panel per statistic.

    ``log``: a list of dicts, a run folder or its ``logs/metrics.csv`` (:func:`load_training_log`), with any of
    ``lambda_mean``, ``lambda_above_half``, ``rho0``, ``delta_aic_mean``, ``beta_hat_mean`` (missing or empty
    values are skipped; rows without a number for a key, e.g. evaluation rows, are ignored for it).
    ``keys``: the columns to plot (default: all of :data:`simcse_weince.weince.STATISTIC_KEYS`).
    """
    series = lambda_series(log, keys)
    plt = _pyplot()
    columns = min(3, len(series))
    lines = math.ceil(len(series) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(3.6 * columns, 2.8 * lines), squeeze=False)
    for axis, (key, points) in zip(axes.flat, series.items()):
        axis.plot(points[:, 0], points[:, 1], color="C0", lw=1, alpha=0.5 if len(points) > 50 else 1.0)
        if len(points) > 50:  # a running mean makes the trend readable
            window = max(5, len(points) // 25)
            smooth = np.convolve(points[:, 1], np.ones(window) / window, mode="valid")
            axis.plot(points[window - 1 :, 0], smooth, color="C1", lw=1.5, label=f"running mean ({window})")
            axis.legend(fontsize=7)
        axis.set_xlabel("training step")
        axis.set_ylabel(_LABELS.get(key, key), fontsize=8)
        axis.set_title(key, fontsize=9)
    for axis in list(axes.flat)[len(series) :]:
        axis.set_visible(False)
    return _finish(figure, path)
