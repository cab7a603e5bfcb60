"""Throughput of one SimCLR training step with WEINCE vs InfoNCE, measured side by side.

A step = forward of both views through ResNet-18 + projection head, the loss, backward, Adam. The two losses
share one model and one batch of random images and alternate (A B, B A, ...) so that machine noise hits both
alike; the medians are compared. The loss alone (forward + backward on fixed projections) is timed the same
way, which isolates what WEINCE adds. Goal: WEINCE adds <= 2% to the step.

    python scripts/benchmarks/bench_vision_step.py                       # ResNet-18, 32 px, batch 128, CPU
    python scripts/benchmarks/bench_vision_step.py --batch-size 256 --repeats 5

Timings on a shared machine are noisy: read the ratios, not the absolute numbers.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.vision.backbones import SimCLRModel


def timed(function, *args) -> float:
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=128, help="images per view (2x this go through)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per loss (after one warm-up each)")
    parser.add_argument("--loss-repeats", type=int, default=50, help="timed loss-only calls per loss")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: a shared 2-core machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    model = SimCLRModel.build(args.backbone, args.image_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    images = torch.randn(2 * args.batch_size, 3, args.image_size, args.image_size)
    objectives = {name: ContrastiveObjective(name, 0.5, geometry="simclr") for name in ("infonce", "weince")}

    def train_step(objective):
        z1, z2 = model(images).chunk(2)
        loss, _ = objective(z1, z2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    projections = torch.randn(2 * args.batch_size, 64)

    def loss_only(objective):
        z = projections.clone().requires_grad_(True)
        loss, _ = objective(*z.chunk(2))
        loss.backward()

    step_times = {name: [] for name in objectives}
    loss_times = {name: [] for name in objectives}
    for objective in objectives.values():  # warm-up
        train_step(objective)
        loss_only(objective)
    order = list(objectives)
    for repeat in range(args.repeats):
        for name in order if repeat % 2 == 0 else order[::-1]:
            step_times[name].append(timed(train_step, objectives[name]))
    for repeat in range(args.loss_repeats):
        for name in order if repeat % 2 == 0 else order[::-1]:
            loss_times[name].append(timed(loss_only, objectives[name]))

    step = {name: statistics.median(times) for name, times in step_times.items()}
    loss = {name: statistics.median(times) for name, times in loss_times.items()}
    print(
        f"{args.backbone}, {args.image_size} px, batch {args.batch_size} (2 x {args.batch_size} images), "
        f"{torch.get_num_threads()} threads, {args.repeats} interleaved steps per loss (median)\n"
    )
    print("| loss | train step (s) | loss fwd+bwd (ms) |")
    print("| --- | ---: | ---: |")
    for name in order:
        print(f"| {name} | {step[name]:.3f} | {1000 * loss[name]:.2f} |")
    added = loss["weince"] - loss["infonce"]
    print()
    print(f"step time ratio weince / infonce: {step['weince'] / step['infonce']:.4f} (noisy end to end)")
    print(
        f"WEINCE adds {1000 * added:.2f} ms to the loss = {100 * added / step['infonce']:.2f}% of an InfoNCE step "
        "(goal: <= 2%)"
    )


if __name__ == "__main__":
    main()
