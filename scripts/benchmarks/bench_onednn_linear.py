"""fp32 linear layers through oneDNN against torch's own (MKL's sgemm), measured side by side in one process.

    HF_HUB_OFFLINE=1 SIMCSE_WEINCE_DATA_DIR=../shared/data \\
        python scripts/benchmarks/bench_onednn_linear.py [--pairs 20] [--rows 640]

Two measurements, each alternating the two ways (the order flipped every pair, so machine drift hits both alike):

1. **The layers alone**: MiniLM's six linear shapes (query, key, value and attention output 384 -> 384, the
   feed-forward 384 -> 1536 and 1536 -> 384) at ``--rows`` rows (a length chunk's real tokens), forward and
   backward; the ratio of the summed times.
2. **Our forward and backward**: ``SimCSEModel`` with the unpadded layers, the doubled batch of 64 wiki sentences
   in 4 length-sorted chunks, WEINCE, ``--pairs`` pairs, each on a fresh batch (new chunk shapes, as in training);
   median of the per-pair ratios and the pairs where oneDNN was ahead.

The trainer's choice (``--onednn-linear auto``) is printed too. ``bench_train.py`` measures whole steps against
sentence-transformers (its ``ours fp32 no onednn`` configuration).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHAPES = ((384, 384), (384, 384), (384, 384), (384, 384), (384, 1536), (1536, 384))  # (in, out), one BERT layer


def layers_alone(rows: int, repeats: int) -> float:
    """torch's time / oneDNN's for one layer's six linear layers, forward and backward, fp32."""
    import torch
    from torch import nn

    from simcse_weince.text.fast_path.onednn_linear import linear

    generator = torch.Generator().manual_seed(0)
    layers = [nn.Linear(width, out) for width, out in SHAPES]
    inputs = [torch.randn(rows, width, generator=generator).requires_grad_() for width, _ in SHAPES]
    upstream = [torch.randn(rows, out, generator=generator) for _, out in SHAPES]

    def run(onednn: bool) -> float:
        start = time.perf_counter()
        for layer, x, g in zip(layers, inputs, upstream):
            linear(layer, x, onednn=onednn).backward(g)
        return time.perf_counter() - start

    run(True), run(False)  # warm-up
    totals = {True: 0.0, False: 0.0}
    for index in range(repeats):
        for onednn in (True, False) if index % 2 == 0 else (False, True):
            totals[onednn] += run(onednn)
    return totals[False] / totals[True]


def forward_backward_pairs(pairs: int, data_dir) -> tuple[list[float], list[float]]:
    """(oneDNN's, torch's) seconds of our forward and backward, one pair a fresh batch."""
    import torch
    from accelerate import Accelerator

    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.text.data import PaddingCollator
    from simcse_weince.text.fast_path import TrainingForward
    from simcse_weince.text.model import SimCSEModel
    from simcse_weince.text.trainer import forward_backward

    model = SimCSEModel.from_pretrained("bundled:all-MiniLM-L6-v2", pooler="avg").train()
    lines = [line.strip() for line in (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()]
    sentences = [line for line in lines if line]
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    batches = [
        collate([model.tokenizer(text, truncation=True, max_length=32) for text in sentences[i * 64 : (i + 1) * 64]])
        for i in range(pairs + 1)
    ]
    accelerator, objective = Accelerator(cpu=True), ContrastiveObjective("weince", 0.05, geometry="simcse")

    def step(batch, onednn: bool) -> float:
        model.training_forward = TrainingForward(length_chunks=4, unpadded_layers=True, onednn_linear=onednn)
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        forward_backward(model, batch, objective, accelerator)
        return time.perf_counter() - start

    step(batches[0], True), step(batches[0], False)  # warm-up
    times = {True: [], False: []}
    for index, batch in enumerate(batches[1:]):
        torch.manual_seed(index)
        for onednn in (True, False) if index % 2 == 0 else (False, True):
            times[onednn].append(step(batch, onednn))
    return times[True], times[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20, help="forward+backward pairs (fresh batches)")
    parser.add_argument("--rows", type=int, default=640, help="rows of the layers-alone measurement")
    parser.add_argument("--layer-repeats", type=int, default=30)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()

    import torch

    from simcse_weince.paths import resolve_data_dir
    from simcse_weince.text.fast_path.onednn_linear import cpu_vendor, onednn_linear_available, resolve_onednn_linear

    if not onednn_linear_available():
        parser.error("this torch has no usable oneDNN linear op")
    auto = resolve_onednn_linear("auto", "cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU vendor {cpu_vendor()}; "
          f"--onednn-linear auto -> {'on' if auto else 'off'}")  # fmt: skip
    ratio = layers_alone(args.rows, args.layer_repeats)
    print(f"layers alone ({args.rows} rows, forward + backward): torch / oneDNN {ratio:.3f}x")
    onednn, own = forward_backward_pairs(args.pairs, resolve_data_dir(args.data_dir))
    ratios = [b / a for a, b in zip(onednn, own)]
    print(
        f"our forward + backward ({args.pairs} pairs): oneDNN {1000 * statistics.mean(onednn):.0f} ms, torch "
        f"{1000 * statistics.mean(own):.0f} ms; torch / oneDNN median {statistics.median(ratios):.3f}x, oneDNN "
        f"ahead in {sum(r > 1 for r in ratios)} of {len(ratios)}"
    )


if __name__ == "__main__":
    main()
