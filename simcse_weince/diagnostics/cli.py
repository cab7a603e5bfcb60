"""``simcse-weince diagnose``: the extreme-value diagnostics and the negatives-count sweep for a frozen encoder.

    simcse-weince diagnose MODEL --data sentences.txt [--pairs sts-train.csv] [--pot] [--link] [--k-sweep]
        [--output-dir DIR] [--max-sentences N] [--batch-size B] [--temperature T] [--training-log metrics.csv]

* ``--pot``: negative similarities of all pairs of distinct ``--data`` sentences -> GPD fit, threshold
  stability, the core's per-anchor tail statistics; figures ``pot_exceedances.png``, ``pot_qq.png``,
  ``pot_threshold_stability.png``.
* ``--link``: candidate sets of ``--batch-size`` candidates (the positive and ``B - 1`` pool negatives) -> the
  nested-link fit; ``link_profile.png``.
* ``--k-sweep``: R_k on a sweep of k from the pool -> CE_inf; ``k_sweep.png``.
  (No flag: all three.)
* ``--training-log FILE``: also plot a training run's per-step lambda statistics (``lambda_statistics.png``).

Positives. With ``--pairs`` (e.g. the STS Benchmark), anchors and positives are the pairs scored at least
``--min-score``, and the negative pool is the *other* distinct sentences of the same file (in-domain,
held out). Without it, the positive is a second, dropout view of each of the first ``--max-pairs`` data
sentences (unsupervised SimCSE's positive) and the pool is the remaining data sentences; for a good encoder
that positive nearly always wins, which makes the link fit degenerate (it then reports why).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="extreme-value diagnostics (POT, link selection) and the InfoNCE negatives-count sweep",
        description=__doc__.split("\n\n", 2)[-1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="SentenceTransformer (or Hugging Face encoder) path or name")
    parser.add_argument("--data", required=True, metavar="FILE", help="text file, one sentence per line")
    parser.add_argument("--pot", action="store_true", help="peaks-over-threshold GPD fit of negative similarities")
    parser.add_argument("--link", action="store_true", help="nested-link fit to the positives' wins")
    parser.add_argument("--k-sweep", action="store_true", help="R_k over a sweep of k and CE_inf")
    parser.add_argument("--output-dir", default="diagnostics", metavar="DIR", help="where report.json and PNGs go")
    parser.add_argument(
        "--max-sentences",
        type=int,
        default=2000,
        metavar="N",
        help="distinct data sentences to encode (default 2000: ~2M negative pairs)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=128,
        metavar="B",
        help="contrastive batch size: candidates per link observation, marked on the k plot",
    )
    parser.add_argument("--temperature", type=float, default=0.05, metavar="T", help="tau of the k-sweep")
    parser.add_argument("--pairs", metavar="FILE", help="positive pairs (STS-B csv or 2-3 column TSV)")
    parser.add_argument("--min-score", type=float, default=4.0, help="keep pairs scored at least this (--pairs)")
    parser.add_argument("--max-pairs", type=int, default=1000, metavar="N", help="anchors for link and k-sweep")
    parser.add_argument("--pool-size", type=int, default=2000, metavar="N", help="held-out negatives in the pool")
    parser.add_argument("--quantile", type=float, default=0.99, help="POT threshold quantile")
    parser.add_argument("--n-bootstrap", type=int, default=0, help="bootstrap SEs for the GPD (0: information)")
    parser.add_argument("--max-scores", type=int, default=4_000_000, help="cap on stored negative similarities")
    parser.add_argument("--encode-batch-size", type=int, default=64, help="sentences per forward pass")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--training-log",
        metavar="FILE",
        help="also plot the trainer's per-step lambda statistics (its logs/metrics.csv) to lambda_statistics.png",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def _validate(args) -> None:
    for name in ("max_sentences", "max_pairs", "pool_size", "encode_batch_size", "max_scores"):
        if getattr(args, name) < 2:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 2, got {getattr(args, name)}")
    if args.batch_size < 2:
        raise ValueError(f"--batch-size must be at least 2, got {args.batch_size}")
    if not (args.temperature > 0 and math.isfinite(args.temperature)):
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    if not 0 < args.quantile < 1:
        raise ValueError(f"--quantile must be in (0, 1), got {args.quantile}")
    if not Path(args.data).is_file():
        raise FileNotFoundError(f"--data file not found: {args.data}")
    if args.pairs and not Path(args.pairs).is_file():
        raise FileNotFoundError(f"--pairs file not found: {args.pairs}")
    if args.training_log and not Path(args.training_log).is_file():
        raise FileNotFoundError(f"--training-log file not found: {args.training_log}")
    from simcse_weince.validation import check_utf8_text_file

    check_utf8_text_file(args.data, "--data file")  # before the model loads, like `train` does
    if args.pairs:
        check_utf8_text_file(args.pairs, "--pairs file")
    for name in ("n_bootstrap", "seed"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not math.isfinite(args.min_score):
        raise ValueError(f"--min-score must be a finite number, got {args.min_score}")
    from simcse_weince.paths import looks_like_local_path

    if looks_like_local_path(args.model) and not Path(args.model).expanduser().exists():
        raise FileNotFoundError(f"model folder {args.model} not found; pass an existing folder or a Hub id")
    if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise FileExistsError(f"--output-dir {args.output_dir} is a file; choose a folder")


def _load_model(name: str, device: str | None):
    import torch
    from sentence_transformers import SentenceTransformer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return SentenceTransformer(name, device=device)
    except OSError as error:
        raise FileNotFoundError(f"cannot load the model {name!r}: {error}") from error


def _positives_from_pairs(args, encode):
    """Anchors/positives from the pairs file; the pool is its other distinct sentences (held out, in-domain)."""
    from simcse_weince.diagnostics import read_sentence_pairs

    pairs, _ = read_sentence_pairs(args.pairs, min_score=args.min_score, max_pairs=args.max_pairs)
    all_pairs, _ = read_sentence_pairs(args.pairs)
    used = {sentence for pair in pairs for sentence in pair}
    pool = [s for s in dict.fromkeys(s for pair in all_pairs for s in pair) if s not in used][: args.pool_size]
    if len(pool) < 2:
        raise ValueError(f"{args.pairs} leaves {len(pool)} sentences outside the selected pairs for the pool")
    anchors = encode([a for a, _ in pairs])
    positives = encode([p for _, p in pairs])
    description = f"pairs of {args.pairs} with score >= {args.min_score}; pool: its other distinct sentences"
    return anchors, positives, encode(pool), description


def run(args) -> int:
    _validate(args)
    import numpy as np
    import torch

    from simcse_weince import diagnostics as dx
    from simcse_weince.diagnostics import plots

    run_pot, run_link, run_sweep = args.pot, args.link, args.k_sweep
    if not (run_pot or run_link or run_sweep):
        run_pot = run_link = run_sweep = True
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    report: dict = {
        "model": args.model,
        "data": str(args.data),
        "settings": {key: value for key, value in vars(args).items() if key != "func"},
        "figures": [],
    }

    model = _load_model(args.model, args.device)
    progress = not args.no_progress

    def encode(sentences, dropout=False):
        return dx.encode_sentences(
            model, sentences, batch_size=args.encode_batch_size, dropout=dropout, show_progress_bar=progress
        )

    def figure(name, draw, *draw_args, **draw_kwargs):
        import matplotlib.pyplot as plt

        fig = draw(*draw_args, path=output_dir / name, **draw_kwargs)
        plt.close(fig)
        report["figures"].append(name)

    need_data = run_pot or not args.pairs
    sentences, embeddings = None, None
    if need_data:
        clock = time.perf_counter()
        sentences = dx.read_sentences(args.data, args.max_sentences)
        embeddings = encode(sentences)
        keep = dx.distinct_rows(embeddings)
        sentences = [sentences[i] for i in keep.tolist()]
        embeddings = embeddings[keep]
        report["sentences"] = len(sentences)
        timings["encode_data"] = time.perf_counter() - clock

    if run_pot:
        clock = time.perf_counter()
        scores = dx.negative_similarities(
            embeddings, max_scores=args.max_scores, seed=args.seed, show_progress_bar=progress
        )
        fit = dx.fit_gpd(scores, args.quantile, n_bootstrap=args.n_bootstrap, seed=args.seed)
        stability = dx.threshold_stability(scores)
        # The core's online tail statistics, per anchor, for (up to) 1000 anchors against every other item.
        sims = dx.cosine_matrix(embeddings[:1000], embeddings)
        np.fill_diagonal(sims, -np.inf)  # an item is not its own negative
        report["pot"] = {
            **fit.to_dict(),
            "negative_pairs": int(scores.size),
            "score_quantiles": {str(q): float(np.quantile(scores, q)) for q in (0.5, 0.9, 0.99, 0.999)},
            "max_score": float(scores.max()),
            "threshold_stability": stability,
            "per_anchor_tail_statistics": dx.tail_agreement(sims),
        }
        figure("pot_exceedances.png", plots.plot_exceedances, fit)
        figure("pot_qq.png", plots.plot_qq, fit)
        figure("pot_threshold_stability.png", plots.plot_threshold_stability, stability)
        timings["pot"] = time.perf_counter() - clock
        print(
            f"POT: xi = {fit.xi:.4f} ± {fit.xi_se:.4f}, endpoint {fit.endpoint:.4f} ± {fit.endpoint_se:.4f}, "
            f"{fit.n_exceedances} exceedances over u = {fit.threshold:.4f}; LR vs xi = 0: {fit.lr_statistic:.1f} "
            f"(p = {fit.lr_pvalue:.2g})"
        )

    if run_link or run_sweep:
        clock = time.perf_counter()
        if args.pairs:
            anchors, positives, pool, description = _positives_from_pairs(args, encode)
        else:
            count = min(args.max_pairs, len(sentences) // 2)
            anchors = embeddings[:count]
            positives = encode(sentences[:count], dropout=True)
            pool = embeddings[count : count + args.pool_size]
            description = "dropout second views of the data sentences; pool: the other data sentences"
        report["positives"] = {"source": description, "anchors": len(anchors), "pool": len(pool)}
        timings["encode_pairs"] = time.perf_counter() - clock

    if run_link:
        clock = time.perf_counter()
        try:
            candidates = dx.candidate_sets(
                anchors, positives, pool, num_candidates=min(args.batch_size, len(pool) + 1), seed=args.seed
            )
            link = dx.fit_link(candidates)
        except ValueError as error:
            report["link"] = {"error": str(error)}
            print(f"link: not fitted: {error}")
        else:
            report["link"] = link.to_dict()
            figure("link_profile.png", plots.plot_link_profile, link)
            print(
                f"link: lambda = {link.mixing:.3f} [{link.mixing_ci[0]:.3f}, {link.mixing_ci[1]:.3f}], "
                f"theta = {link.scale:.2f}; LR vs lambda = 0: {link.lr_statistic:.2f} (p = {link.lr_pvalue:.2g})"
            )
        timings["link"] = time.perf_counter() - clock

    if run_sweep:
        clock = time.perf_counter()
        sweep = dx.k_sweep(
            dx.paired_cosines(anchors, positives),
            dx.cosine_matrix(anchors, pool),
            temperature=args.temperature,
            seed=args.seed,
        )
        report["k_sweep"] = sweep.to_dict()
        figure("k_sweep.png", plots.plot_k_sweep, sweep, batch_size=args.batch_size)
        timings["k_sweep"] = time.perf_counter() - clock
        print(
            f"k-sweep: CE_inf = {sweep.ce_inf_fit:.3f} ± {sweep.ce_inf_fit_se:.3f} (fit), "
            f"{sweep.ce_inf_direct:.3f} ± {sweep.ce_inf_direct_se:.3f} (direct); "
            f"DCL slope {sweep.dcl_slope:.3g} ± {sweep.dcl_slope_se:.2g} vs predicted {sweep.dcl_predicted_slope:.3g}"
        )

    if args.training_log:
        figure("lambda_statistics.png", plots.plot_lambda_statistics, args.training_log)
        report["training_log"] = str(args.training_log)

    timings["total"] = time.perf_counter() - started
    report["seconds"] = {key: round(value, 2) for key, value in timings.items()}
    path = output_dir / "report.json"
    path.write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {path} and {len(report['figures'])} figures in {timings['total']:.0f} s")
    return 0


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
