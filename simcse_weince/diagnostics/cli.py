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
from dataclasses import fields
from pathlib import Path

from simcse_weince.diagnostics.pipeline import DiagnoseSettings

#: the settings' defaults, shown by --help (one source: DiagnoseSettings)
DEFAULTS = {field.name: field.default for field in fields(DiagnoseSettings)}


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
    parser.add_argument(
        "--output-dir", default=DEFAULTS["output_dir"], metavar="DIR", help="where report.json and PNGs go"
    )
    parser.add_argument(
        "--max-sentences",
        type=int,
        default=DEFAULTS["max_sentences"],
        metavar="N",
        help="distinct data sentences to encode (default 2000: ~2M negative pairs)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULTS["batch_size"],
        metavar="B",
        help="contrastive batch size: candidates per link observation, marked on the k plot",
    )
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"], metavar="T",
                        help="tau of the k-sweep")  # fmt: skip
    parser.add_argument("--pairs", metavar="FILE", help="positive pairs (STS-B csv or 2-3 column TSV)")
    parser.add_argument("--min-score", type=float, default=DEFAULTS["min_score"],
                        help="keep pairs scored at least this (--pairs)")  # fmt: skip
    parser.add_argument("--max-pairs", type=int, default=DEFAULTS["max_pairs"], metavar="N",
                        help="anchors for link and k-sweep")  # fmt: skip
    parser.add_argument("--pool-size", type=int, default=DEFAULTS["pool_size"], metavar="N",
                        help="held-out negatives in the pool")  # fmt: skip
    parser.add_argument("--quantile", type=float, default=DEFAULTS["quantile"], help="POT threshold quantile")
    parser.add_argument("--n-bootstrap", type=int, default=DEFAULTS["n_bootstrap"],
                        help="bootstrap SEs for the GPD (0: information)")  # fmt: skip
    parser.add_argument("--max-scores", type=int, default=DEFAULTS["max_scores"],
                        help="cap on stored negative similarities")  # fmt: skip
    parser.add_argument("--encode-batch-size", type=int, default=DEFAULTS["encode_batch_size"],
                        help="sentences per forward pass")  # fmt: skip
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--training-log",
        metavar="FILE",
        help="also plot the trainer's per-step lambda statistics (its logs/metrics.csv) to lambda_statistics.png",
    )
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Parse, call :func:`~simcse_weince.diagnostics.pipeline.diagnose`, say where the report went."""
    from simcse_weince.diagnostics.pipeline import diagnose

    settings = {name: getattr(args, name) for name in DEFAULTS if name not in ("model", "data")}
    report = diagnose(args.model, args.data, **settings)
    path = Path(args.output_dir) / "report.json"
    print(f"wrote {path} and {len(report['figures'])} figures in {report['seconds']['total']:.0f} s")
    return 0
