"""``simcse-weince evaluate MODEL``: the SimCSE STS table (7 tasks + Avg.) for a model, optionally as JSON.

Examples::

    simcse-weince evaluate sentence-transformers/all-MiniLM-L6-v2
    simcse-weince evaluate princeton-nlp/unsup-simcse-bert-base-uncased --pooler cls_before_pooler --output sts.json
    simcse-weince evaluate outputs/my-model --split dev            # STS-B + SICK-R dev
    simcse-weince evaluate outputs/my-model --tasks stsb-raw       # original STS-B (sentence-transformers' number)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from simcse_weince.poolers import POOLERS

# Not imported from encoders/data, so that registering the sub-command imports nothing heavy (poolers is torch-free).
POOLER_CHOICES = tuple(POOLERS)
ALL_TASKS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
DEV_TASKS = ("stsb", "sickr")
RAW_STSB = "stsb-raw"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="STS evaluation (SentEval STS12-16, STS-B, SICK-R) of a sentence encoder",
        description=(
            "Cosine-similarity Spearman x100 on SimCSE's 7 STS tasks (SentEval data and protocol), printed as "
            "SimCSE's table. MODEL is a SentenceTransformer folder/name, or with --pooler a raw Hugging Face "
            "encoder pooled SimCSE's way."
        ),
    )
    parser.add_argument("model", help="SentenceTransformer folder or name, or a Hugging Face encoder with --pooler")
    parser.add_argument(
        "--tasks",
        default=None,
        help=f"comma-separated tasks among {','.join(ALL_TASKS)},{RAW_STSB} "
        f"(default: all 7 for --split test, {','.join(DEV_TASKS)} for dev); "
        f"{RAW_STSB} is the original STS Benchmark (sentence-transformers' protocol)",
    )
    parser.add_argument("--split", choices=("test", "dev"), default="test", help="data split (default: test)")
    parser.add_argument(
        "--pooler",
        choices=POOLER_CHOICES,
        default=None,
        help="SimCSE pooler over the raw Hugging Face encoder (default: the SentenceTransformer's own pooling)",
    )
    parser.add_argument(
        "--aggregation",
        choices=("all", "mean", "wmean"),
        default="all",
        help="how STS12-16 combine their subsets (default: all, SimCSE's setting)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass (default: 64)")
    parser.add_argument(
        "--max-length", type=int, default=None, help="truncate to this many tokens (default: no truncation)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: best available)")
    parser.add_argument("--data-dir", default=None, help="data folder (default: $SIMCSE_WEINCE_DATA_DIR or cache)")
    parser.add_argument("--output", default=None, help="also write the results as JSON to this file")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def _parse_tasks(text: str | None, split: str) -> list[str]:
    if text is None:
        return list(ALL_TASKS if split == "test" else DEV_TASKS)
    from simcse_weince.evaluation.data import _normalise_task

    tasks = [task.strip().lower() for task in text.split(",") if task.strip()]
    if not tasks:
        raise ValueError("--tasks is empty")
    # Validate names before the (slow) model load; stsb-raw is the CLI's name for the original STS-B.
    return [RAW_STSB if task in (RAW_STSB, "stsb_raw") else _normalise_task(task) for task in tasks]


def run(args: argparse.Namespace) -> int:
    from simcse_weince.evaluation.encoders import as_encoder
    from simcse_weince.evaluation.suite import evaluate_sts, format_sts_table, stsb_spearman

    tasks = _parse_tasks(args.tasks, args.split)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    if args.max_length is not None and args.max_length < 1:
        raise ValueError(f"--max-length must be a positive number of tokens, got {args.max_length}")
    from simcse_weince.paths import looks_like_local_path

    if looks_like_local_path(args.model) and not Path(args.model).expanduser().exists():
        raise FileNotFoundError(f"model folder {args.model} not found; pass an existing folder or a Hub id")
    if args.output and Path(args.output).is_dir():
        raise ValueError(f"--output {args.output} is a folder; give a file name")
    try:
        encoder = as_encoder(
            args.model,
            pooler=args.pooler,
            batch_size=args.batch_size,
            max_length=args.max_length,
            device=args.device,
            show_progress_bar=not args.no_progress,
        )
    except OSError as error:  # transformers / huggingface_hub: not a folder, not on the Hub, offline
        raise FileNotFoundError(f"cannot load the model {args.model!r}: {error}") from error
    started = time.perf_counter()
    senteval_tasks = [task for task in tasks if task != RAW_STSB]
    results: dict = {}
    if senteval_tasks:
        results = evaluate_sts(
            encoder, tasks=senteval_tasks, split=args.split, aggregation=args.aggregation, data_dir=args.data_dir
        )
    if RAW_STSB in tasks:
        raw = stsb_spearman(encoder, split=args.split, data_dir=args.data_dir)
        details = results.pop("details", {"split": args.split, "aggregation": args.aggregation, "tasks": {}})
        results["stsb_raw"] = raw
        results["details"] = details
    seconds = time.perf_counter() - started

    if senteval_tasks:
        print(format_sts_table(results))
    if "stsb_raw" in results:
        print(f"STS-B (original, {args.split}) cosine Spearman: {results['stsb_raw']:.2f}")
    print(f"({seconds:.1f} s)")
    if args.output:
        results["details"]["config"] = {
            "model": args.model,
            "pooler": args.pooler,
            "split": args.split,
            "aggregation": args.aggregation,
            "tasks": tasks,
            "max_length": args.max_length,
            "batch_size": args.batch_size,
        }
        results["details"]["seconds"] = seconds
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {output}")
    return 0
