"""The diagnose pipeline: a frozen encoder's extreme-value diagnostics and negatives-count sweep, written to
``report.json`` and PNGs. :func:`diagnose` is the Python entry point; ``simcse-weince diagnose`` only parses.

Example::

    from simcse_weince.diagnostics import diagnose

    report = diagnose("runs/cpu-demo", "sentences.txt", pairs="sts-train.csv", output_dir="diagnostics")
    report["pot"]["xi"], report["link"]["mixing"], report["k_sweep"]["ce_inf_fit"]
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from simcse_weince.paths import looks_like_local_path
from simcse_weince.training import folder_io
from simcse_weince.validation import check_utf8_text_file

# `simcse-weince --help` reads this module (the diagnose command's settings); the steps import torch, scipy,
# matplotlib and sentence-transformers where they run, so that --help does not wait for them

logger = logging.getLogger(__name__)


@dataclass
class DiagnoseSettings:
    """Every setting of :func:`diagnose` (the flags of ``simcse-weince diagnose``, same names); ``report.json``
    records them."""

    model: str  # SentenceTransformer (or Hugging Face encoder) path or name
    data: str  # text file, one sentence per line
    pot: bool = False  # peaks-over-threshold GPD fit of negative similarities
    link: bool = False  # nested-link fit to the positives' wins
    k_sweep: bool = False  # R_k over a sweep of k and CE_inf (none of the three: all three)
    output_dir: str = "diagnostics"
    max_sentences: int = 2000  # distinct data sentences to encode (2000: ~2M negative pairs)
    batch_size: int = 128  # contrastive batch size: candidates per link observation, marked on the k plot
    temperature: float = 0.05  # tau of the k-sweep
    pairs: str | None = None  # positive pairs (STS-B csv or 2-3 column TSV)
    min_score: float = 4.0  # keep pairs scored at least this
    max_pairs: int = 1000  # anchors for link and k-sweep
    pool_size: int = 2000  # held-out negatives in the pool
    quantile: float = 0.99  # POT threshold quantile
    n_bootstrap: int = 0  # bootstrap SEs for the GPD (0: information)
    max_scores: int = 4_000_000  # cap on stored negative similarities
    encode_batch_size: int = 64  # sentences per forward pass
    device: str | None = None  # torch device (default: cuda if available, else cpu)
    training_log: str | None = None  # also plot a trainer's per-step lambda statistics (its logs/metrics.csv)
    seed: int = 0
    no_progress: bool = False  # no progress bars

    def validate(self) -> None:
        """Every setting and input file checked before the model loads, one clear message each."""
        for name in ("max_sentences", "max_pairs", "pool_size", "encode_batch_size", "max_scores"):
            if getattr(self, name) < 2:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 2, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(f"--batch-size must be at least 2, got {self.batch_size}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"--temperature must be > 0, got {self.temperature}")
        if not 0 < self.quantile < 1:
            raise ValueError(f"--quantile must be in (0, 1), got {self.quantile}")
        for flag, path in (("--data", self.data), ("--pairs", self.pairs), ("--training-log", self.training_log)):
            if path and not Path(path).is_file():
                raise FileNotFoundError(f"{flag} file not found: {path}")

        check_utf8_text_file(self.data, "--data file")  # before the model loads, like `train` does
        if self.pairs:
            check_utf8_text_file(self.pairs, "--pairs file")
        for name in ("n_bootstrap", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not math.isfinite(self.min_score):
            raise ValueError(f"--min-score must be a finite number, got {self.min_score}")

        if looks_like_local_path(self.model) and not Path(self.model).expanduser().exists():
            raise FileNotFoundError(f"model folder {self.model} not found; pass an existing folder or a Hub id")
        if Path(self.output_dir).exists() and not Path(self.output_dir).is_dir():
            raise FileExistsError(f"--output-dir {self.output_dir} is a file; choose a folder")
        if self.training_log:  # read now, not after the analysis: a bad log must leave the folder as it was
            from simcse_weince.diagnostics.plots import lambda_series

            try:
                lambda_series(self.training_log)
            except UnicodeDecodeError as error:
                raise ValueError(f"--training-log {self.training_log} is not UTF-8 text ({error.reason})") from None
            except (ValueError, KeyError) as error:
                raise ValueError(f"--training-log: {error}") from None


def diagnose(model: str, data, **settings) -> dict:
    """Run the diagnostics of a frozen encoder and write ``report.json`` and the figures to ``output_dir``.

    Args:
        model: a SentenceTransformer (or Hugging Face encoder) path or Hub id.
        data: a text file, one sentence per line (the negatives).
        settings: any field of :class:`DiagnoseSettings` (``pot``, ``link``, ``k_sweep``: which parts; none of
            them: all three; ``pairs``, ``output_dir``, ``batch_size``, ``temperature``, ``training_log``, ...).

    Returns the report (also in ``<output_dir>/report.json``); its ``figures`` name the PNGs written.
    """
    config = DiagnoseSettings(model=model, data=str(data), **settings)
    config.validate()
    run_all = not (config.pot or config.link or config.k_sweep)
    output_dir = Path(config.output_dir)
    created = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = _diagnose(config, run_all, output_dir)
    except BaseException:
        for staged in output_dir.glob(f"{STAGING_PREFIX}*"):  # the earlier report and figures stay as they were
            staged.unlink(missing_ok=True)
        if created and not any(output_dir.iterdir()):
            output_dir.rmdir()
        raise
    return report


#: the report and the figures are written under this prefix, then renamed together once all are written
STAGING_PREFIX = ".staging-"


def _diagnose(config: DiagnoseSettings, run_all: bool, output_dir: Path) -> dict:
    import torch

    torch.manual_seed(config.seed)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    report: dict = {"model": config.model, "data": config.data, "settings": asdict(config), "figures": []}
    steps = _Steps(config, _load_model(config.model, config.device), output_dir, report)

    sentences = embeddings = None
    if config.pot or run_all or not config.pairs:
        sentences, embeddings = steps.timed(timings, "encode_data", steps.encode_data)
    if config.pot or run_all:
        steps.timed(timings, "pot", steps.pot, embeddings)
    if config.link or config.k_sweep or run_all:
        positives = steps.timed(timings, "encode_pairs", steps.positives, sentences, embeddings)
        if config.link or run_all:
            steps.timed(timings, "link", steps.link, *positives)
        if config.k_sweep or run_all:
            steps.timed(timings, "k_sweep", steps.k_sweep, *positives)
    if config.training_log:
        from simcse_weince.diagnostics import plots

        steps.figure("lambda_statistics.png", plots.plot_lambda_statistics, config.training_log)
        report["training_log"] = str(config.training_log)

    timings["total"] = time.perf_counter() - started
    report["seconds"] = {key: round(value, 2) for key, value in timings.items()}
    path = output_dir / "report.json"
    staged = output_dir / f"{STAGING_PREFIX}report.json"
    folder_io.write_text(output_dir, staged, json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")
    for name in [*report["figures"], "report.json"]:  # all written: replace the earlier outputs together
        os.replace(output_dir / f"{STAGING_PREFIX}{name}", output_dir / name)
    logger.debug("wrote %s and %d figures", path, len(report["figures"]))
    return report


class _Steps:
    """The parts of :func:`diagnose`, each adding its section and figures to the report."""

    def __init__(self, config: DiagnoseSettings, model, output_dir: Path, report: dict):
        self.config, self.model, self.output_dir, self.report = config, model, output_dir, report

    @staticmethod
    def timed(timings: dict, name: str, step, *args):
        clock = time.perf_counter()
        result = step(*args)
        timings[name] = time.perf_counter() - clock
        return result

    def encode(self, sentences, dropout=False):
        from simcse_weince import diagnostics as dx

        return dx.encode_sentences(
            self.model, sentences, batch_size=self.config.encode_batch_size, dropout=dropout,
            show_progress_bar=not self.config.no_progress,
        )  # fmt: skip

    def figure(self, name, draw, *draw_args, **draw_kwargs):
        import matplotlib.pyplot as plt

        # staged (the suffix stays: matplotlib picks the format by it); diagnose renames them all at the end
        fig = draw(*draw_args, path=self.output_dir / f"{STAGING_PREFIX}{name}", **draw_kwargs)
        plt.close(fig)
        self.report["figures"].append(name)

    def encode_data(self):
        from simcse_weince import diagnostics as dx

        sentences = dx.read_sentences(self.config.data, self.config.max_sentences)
        embeddings = self.encode(sentences)
        keep = dx.distinct_rows(embeddings)
        self.report["sentences"] = len(keep)
        return [sentences[i] for i in keep.tolist()], embeddings[keep]

    def pot(self, embeddings):
        import numpy as np

        from simcse_weince import diagnostics as dx
        from simcse_weince.diagnostics import plots

        config = self.config
        scores = dx.negative_similarities(
            embeddings, max_scores=config.max_scores, seed=config.seed, show_progress_bar=not config.no_progress
        )
        fit = dx.fit_gpd(scores, config.quantile, n_bootstrap=config.n_bootstrap, seed=config.seed)
        stability = dx.threshold_stability(scores)
        # The core's online tail statistics, per anchor, for (up to) 1000 anchors against every other item.
        sims = dx.cosine_matrix(embeddings[:1000], embeddings)
        np.fill_diagonal(sims, -np.inf)  # an item is not its own negative
        self.report["pot"] = {
            **fit.to_dict(),
            "negative_pairs": int(scores.size),
            "score_quantiles": {str(q): float(np.quantile(scores, q)) for q in (0.5, 0.9, 0.99, 0.999)},
            "max_score": float(scores.max()),
            "threshold_stability": stability,
            "per_anchor_tail_statistics": dx.tail_agreement(sims),
        }
        self.figure("pot_exceedances.png", plots.plot_exceedances, fit)
        self.figure("pot_qq.png", plots.plot_qq, fit)
        self.figure("pot_threshold_stability.png", plots.plot_threshold_stability, stability)
        logger.info(
            "POT: xi = %.4f ± %.4f, endpoint %.4f ± %.4f, %d exceedances over u = %.4f; LR vs xi = 0: %.1f (p = %.2g)",
            fit.xi, fit.xi_se, fit.endpoint, fit.endpoint_se, fit.n_exceedances, fit.threshold, fit.lr_statistic,
            fit.lr_pvalue,
        )  # fmt: skip

    def positives(self, sentences, embeddings):
        """``(anchors, positives, pool)``: from the pairs file, or dropout second views of the data sentences."""
        config = self.config
        if config.pairs:
            anchors, positives, pool, description = self._positives_from_pairs()
        else:
            count = min(config.max_pairs, len(sentences) // 2)
            anchors = embeddings[:count]
            positives = self.encode(sentences[:count], dropout=True)
            pool = embeddings[count : count + config.pool_size]
            description = "dropout second views of the data sentences; pool: the other data sentences"
        self.report["positives"] = {"source": description, "anchors": len(anchors), "pool": len(pool)}
        return anchors, positives, pool

    def _positives_from_pairs(self):
        """Anchors/positives from the pairs file; the pool is its other distinct sentences (held out, in-domain)."""
        from simcse_weince.diagnostics import read_sentence_pairs

        config = self.config
        pairs, _ = read_sentence_pairs(config.pairs, min_score=config.min_score, max_pairs=config.max_pairs)
        all_pairs, _ = read_sentence_pairs(config.pairs)
        used = {sentence for pair in pairs for sentence in pair}
        pool = [s for s in dict.fromkeys(s for pair in all_pairs for s in pair) if s not in used][: config.pool_size]
        if len(pool) < 2:
            raise ValueError(f"{config.pairs} leaves {len(pool)} sentences outside the selected pairs for the pool")
        anchors = self.encode([a for a, _ in pairs])
        positives = self.encode([p for _, p in pairs])
        description = f"pairs of {config.pairs} with score >= {config.min_score}; pool: its other distinct sentences"
        return anchors, positives, self.encode(pool), description

    def link(self, anchors, positives, pool):
        from simcse_weince import diagnostics as dx
        from simcse_weince.diagnostics import plots

        config = self.config
        try:
            candidates = dx.candidate_sets(
                anchors, positives, pool, num_candidates=min(config.batch_size, len(pool) + 1), seed=config.seed
            )
            link = dx.fit_link(candidates)
        except ValueError as error:
            self.report["link"] = {"error": str(error)}
            logger.info("link: not fitted: %s", error)
            return
        self.report["link"] = link.to_dict()
        self.figure("link_profile.png", plots.plot_link_profile, link)
        logger.info(
            "link: lambda = %.3f [%.3f, %.3f], theta = %.2f; LR vs lambda = 0: %.2f (p = %.2g)",
            link.mixing, link.mixing_ci[0], link.mixing_ci[1], link.scale, link.lr_statistic, link.lr_pvalue,
        )  # fmt: skip

    def k_sweep(self, anchors, positives, pool):
        from simcse_weince import diagnostics as dx
        from simcse_weince.diagnostics import plots

        config = self.config
        sweep = dx.k_sweep(
            dx.paired_cosines(anchors, positives), dx.cosine_matrix(anchors, pool),
            temperature=config.temperature, seed=config.seed,
        )  # fmt: skip
        self.report["k_sweep"] = sweep.to_dict()
        self.figure("k_sweep.png", plots.plot_k_sweep, sweep, batch_size=config.batch_size)
        logger.info(
            "k-sweep: CE_inf = %.3f ± %.3f (fit), %.3f ± %.3f (direct); DCL slope %.3g ± %.2g vs predicted %.3g",
            sweep.ce_inf_fit, sweep.ce_inf_fit_se, sweep.ce_inf_direct, sweep.ce_inf_direct_se, sweep.dcl_slope,
            sweep.dcl_slope_se, sweep.dcl_predicted_slope,
        )  # fmt: skip


def _load_model(name: str, device: str | None):
    import torch
    from sentence_transformers import SentenceTransformer

    from simcse_weince.encoder_checks import check_sentence_transformer, naming_missing_tokenizer_package
    from simcse_weince.safe_load import refusing_pickles

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        with refusing_pickles(name), naming_missing_tokenizer_package(name, name):
            model = SentenceTransformer(name, device=device)
    except OSError as error:
        raise FileNotFoundError(f"cannot load the model {name!r}: {error}") from error
    check_sentence_transformer(model, name)  # a tokenizer that does not fit the model is refused, naming its file
    return model


def _finite(value):
    """JSON-ready copy: numpy scalars to Python, paths to str, NaN/inf to None (strict JSON has neither)."""
    import numpy as np

    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Path):
        return str(value)
    return value
