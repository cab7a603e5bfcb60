"""WEINCE vs InfoNCE (NT-Xent) SimCLR pretraining on a real small image set, on CPU.

scikit-learn's 1,797 handwritten digits (8x8, upscaled to 16 px; stratified 80/20 train/test split), ResNet-18
with the CIFAR stem, Adam 3e-4, tau 0.5, a few epochs, 3 pretraining seeds per loss (the losses alternate, so
machine noise hits both alike). Each checkpoint is evaluated on frozen backbone features: linear probe (mean of
3 probe seeds) and weighted kNN (k = 1, 5, 20; T = 0.1) with label recall@1. The table gives the mean over the
pretraining seeds and its 95% t-interval. The untrained backbone (same seeds) is the reference row: digits are
easy, so random ResNet features already separate them well.

    python scripts/benchmarks/bench_vision.py                    # ~12 min on one CPU core (--threads 1)
    python scripts/benchmarks/bench_vision.py --epochs 1 --seeds 0   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from simcse_weince.vision.config import VisionTrainConfig
from simcse_weince.vision.evaluate import LinearProbeConfig, evaluate_checkpoint, evaluate_model, mean_interval
from simcse_weince.vision.trainer import build_model, train

KS = (1, 5, 20)


def summarise(rows: list[dict]) -> dict:
    """Mean and 95% interval over pretraining seeds of the headline metrics."""
    metrics = {"linear": [row["linear_accuracy"]["mean"] for row in rows]}
    for k in KS:
        metrics[f"knn@{k}"] = [row["knn_accuracy"][str(k)] for row in rows]
    metrics["recall@1"] = [row["recall_at_k"]["1"] for row in rows]
    return {name: mean_interval(values) for name, values in metrics.items()}


def cell(summary: dict) -> str:
    return f"{100 * summary['mean']:.1f} [{100 * summary['ci95_low']:.1f}, {100 * summary['ci95_high']:.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--probe-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--output-dir", default=None, help="where runs go (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="also write all results to this file")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: faster than 2 on a shared 2-core machine)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    output_dir = Path(args.output_dir or tempfile.mkdtemp(prefix="bench_vision_"))
    probe = LinearProbeConfig(seeds=tuple(args.probe_seeds))
    evaluation = {"probe": probe, "ks": KS}
    results: dict[str, list[dict]] = {"untrained": [], "infonce": [], "weince": []}
    lambdas = []
    for seed in args.seeds:
        config = VisionTrainConfig(dataset="digits", image_size=args.image_size, seed=seed)
        torch.manual_seed(seed)
        untrained = evaluate_model(build_model(config), "digits", image_size=args.image_size, **evaluation)
        results["untrained"].append(untrained)
        for loss in ("infonce", "weince") if seed % 2 == 0 else ("weince", "infonce"):
            config = VisionTrainConfig(
                dataset="digits",
                backbone="resnet18",
                loss=loss,
                image_size=args.image_size,
                num_epochs=args.epochs,
                batch_size=args.batch_size,
                seed=seed,
                output_dir=str(output_dir / f"{loss}-seed{seed}"),
            )
            run = train(config)
            if loss == "weince":
                lambdas += [record["lambda_mean"] for record in run["history"] if "lambda_mean" in record]
            results[loss].append(evaluate_checkpoint(run["checkpoint"], **evaluation))
            steps = run["step"]
            print(f"seed {seed} {loss}: linear {results[loss][-1]['linear_accuracy']['mean']:.4f}", flush=True)

    minutes = (time.perf_counter() - started) / 60
    print(
        f"\ndigits ({results['weince'][0]['num_train']} train / {results['weince'][0]['num_test']} test), "
        f"{args.image_size} px, ResNet-18 (CIFAR stem), batch {args.batch_size}, {args.epochs} epochs "
        f"({steps} steps), Adam 3e-4, tau 0.5; {len(args.seeds)} pretraining seeds, "
        f"{len(args.probe_seeds)} probe seeds; mean [95% interval] in %; {minutes:.1f} min\n"
    )
    header = "| backbone | linear probe | kNN@1 | kNN@5 | kNN@20 | recall@1 |"
    print(header)
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, label in (("untrained", "untrained"), ("infonce", "InfoNCE (NT-Xent)"), ("weince", "WEINCE")):
        summary = summarise(results[name])
        metrics = ["linear", *(f"knn@{k}" for k in KS), "recall@1"]
        print(f"| {label} | " + " | ".join(cell(summary[metric]) for metric in metrics) + " |")
    if lambdas:
        print(f"\nWEINCE mean lambda over logged steps: {sum(lambdas) / len(lambdas):.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
