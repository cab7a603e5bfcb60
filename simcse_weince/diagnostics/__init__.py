"""Extreme-value diagnostics and the negatives-count theory, for any frozen encoder (docs/method.md#diagnostics).

* :func:`fit_gpd` / :func:`threshold_stability` — peaks over threshold: is the similarity tail Weibull-type
  (xi < 0, a finite endpoint) or Gumbel-type (xi = 0)?
* :func:`fit_link` — likelihood-based link selection: how much of the shortfall link ``-log(1 - s)`` do the
  observed winners call for (lambda-hat, its interval, the LR test against the softmax link)?
* :func:`k_sweep` — how far is a batch of k negatives from the k -> infinity limit ``CE_inf`` of InfoNCE?
* :mod:`~simcse_weince.diagnostics.collect` — embeddings, negative similarities and candidate sets from a
  SentenceTransformer, a raw Hugging Face encoder or an image ``nn.Module``.
* :mod:`~simcse_weince.diagnostics.plots` — the figures (matplotlib), including the trainer's per-step lambda
  statistics over training.

:func:`diagnose` (:mod:`~simcse_weince.diagnostics.pipeline`) runs all of it and writes ``report.json`` and PNGs;
so does the command ``simcse-weince diagnose MODEL --data FILE``.
"""

from simcse_weince._lazy import lazy_exports

# Names -> submodule. Imported lazily so that `simcse-weince --help` (which imports diagnostics.cli) stays fast.
_EXPORTS = {
    "collect": (
        "candidate_sets",
        "cosine_matrix",
        "distinct_rows",
        "encode_images",
        "encode_sentences",
        "negative_similarities",
        "paired_cosines",
        "read_sentence_pairs",
        "read_sentences",
    ),
    "ksweep": ("KSweepResult", "k_sweep", "proposition1_bounds"),
    "link": ("LinkFit", "fit_link", "shortfall_transform"),
    "pot": ("GPDFit", "exceedances_above", "fit_gpd", "gpd_loglik", "threshold_stability"),
    "pipeline": ("DiagnoseSettings", "diagnose"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)


__all__ = [
    "DiagnoseSettings",
    "GPDFit",
    "KSweepResult",
    "LinkFit",
    "candidate_sets",
    "cosine_matrix",
    "diagnose",
    "distinct_rows",
    "encode_images",
    "encode_sentences",
    "exceedances_above",
    "fit_gpd",
    "fit_link",
    "gpd_loglik",
    "k_sweep",
    "negative_similarities",
    "paired_cosines",
    "proposition1_bounds",
    "read_sentence_pairs",
    "read_sentences",
    "shortfall_transform",
    "tail_agreement",
    "threshold_stability",
]


def tail_agreement(negative_similarities_matrix, weince=None) -> dict:
    """The core's per-anchor tail statistics (docs/method.md#tail-statistics) summarised over anchors, for the
    report.

    ``negative_similarities_matrix``: ``A x K`` similarities of anchors to negatives (numpy or torch). Returns
    the share of anchors whose Delta-AIC favours the Weibull line, the mean Delta-AIC, the mean beta-hat and
    the median hardness rho — the online statistics that WEINCE's mixing weight uses, next to the offline fits.
    ``weince``: the :class:`~simcse_weince.WeinceConfig` (the paper's for None).
    """
    import torch

    from simcse_weince import WeinceConfig, tail_statistics

    sims = torch.as_tensor(negative_similarities_matrix, dtype=torch.float64)
    weince = weince or WeinceConfig()
    stats = tail_statistics(sims, weince)
    return {
        "anchors": int(sims.shape[0]),
        "negatives_per_anchor": int(sims.shape[1]),
        "share_weibull_favoured": float((stats.delta_aic > 0).double().mean()),
        "share_above_aic_margin": float((stats.delta_aic > weince.aic_margin).double().mean()),
        "delta_aic_mean": float(stats.delta_aic.mean()),
        "beta_hat_mean": float(stats.beta_hat.mean()),
        "beta_hat_median": float(stats.beta_hat.median()),
        "rho_median": float(stats.rho.median()),
    }
