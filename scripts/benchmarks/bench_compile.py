"""Does ``torch.compile`` of the encoder pay for our training step? Eager and compiled, side by side.

    HF_HUB_OFFLINE=1 SIMCSE_WEINCE_DATA_DIR=../shared/data \\
        python scripts/benchmarks/bench_compile.py [--steps 10] [--bf16] [--length-chunks 4]

Two copies of all-MiniLM-L6-v2 with our SimCSE step (collate, one forward over the doubled batch in length-sorted
chunks, WEINCE, backward, clip, fused AdamW; batch 64, length 32, the same wiki sentences): one eager, one whose
encoder is ``torch.compile(dynamic=True)`` (inductor; dynamic shapes, so the chunks' varying lengths do not
recompile). The compiled copy's first steps are its compilation: they are timed apart (``compile seconds``).
Then the steps alternate between the two copies, so machine load hits both alike, and the script prints the
median step time of each, their ratio, and how many steps of the 186-step cpu-demo epoch the compile time costs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each copy, alternating")
    parser.add_argument("--compile-steps", type=int, default=3, help="untimed first steps of the compiled copy")
    parser.add_argument("--bf16", action="store_true", help="under bf16 autocast")
    parser.add_argument("--length-chunks", type=int, default=4)
    args = parser.parse_args()
    if args.steps < 1 or args.compile_steps < 1 or args.length_chunks < 1:
        parser.error("--steps, --compile-steps and --length-chunks must be >= 1")

    import torch

    from simcse_weince.losses.from_embeddings import ContrastiveObjective
    from simcse_weince.paths import resolve_data_dir
    from simcse_weince.text.data import PaddingCollator
    from simcse_weince.text.fast_path import TrainingForward
    from simcse_weince.text.model import SimCSEModel

    torch.manual_seed(0)
    lines = (resolve_data_dir(None) / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()]
    total = args.compile_steps + 2 * args.steps + 1
    batches = [sentences[64 * i : 64 * (i + 1)] for i in range(total)]
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.bf16 else contextlib.nullcontext
    objective = ContrastiveObjective("weince", 0.05, geometry="simcse")

    def make(compiled: bool):
        model = SimCSEModel.from_pretrained("bundled:all-MiniLM-L6-v2", pooler="avg", dropout=0.1).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)
        if compiled:
            model.encoder = torch.compile(model.encoder, dynamic=True)
        model.training_forward = TrainingForward(length_chunks=args.length_chunks)
        collate = PaddingCollator(model.tokenizer.pad_token_id)
        features = [model.tokenizer(batch, truncation=True, max_length=32) for batch in batches]

        def step(index: int) -> float:
            start = time.perf_counter()
            encoded = features[index]
            batch = collate([{name: encoded[name][i] for name in encoded} for i in range(len(encoded["input_ids"]))])
            with autocast():
                first, second = model(**batch, num_views=2)
            loss, _ = objective(first, second)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - start

        return step

    eager, compiled = make(False), make(True)
    eager(0)  # warm-up
    start = time.perf_counter()
    for index in range(args.compile_steps):
        compiled(index)
    compile_seconds = time.perf_counter() - start
    times = {"eager": [], "compiled": []}
    index = args.compile_steps
    for round_index in range(args.steps):  # alternating, in alternating order
        order = ("eager", "compiled") if round_index % 2 == 0 else ("compiled", "eager")
        for label in order:
            times[label].append((eager if label == "eager" else compiled)(index))
            index += 1
    median = {label: statistics.median(values) for label, values in times.items()}
    paired = statistics.median(e / c for e, c in zip(times["eager"], times["compiled"]))
    saved_per_step = median["eager"] - median["compiled"]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {'bf16' if args.bf16 else 'fp32'}, "
        f"{args.length_chunks} chunks, {args.steps} timed steps each\n"
        f"first {args.compile_steps} compiled steps (compilation): {compile_seconds:.1f} s\n"
        f"median step: eager {median['eager'] * 1e3:.0f} ms, compiled {median['compiled'] * 1e3:.0f} ms; "
        f"eager / compiled (median of paired ratios) {paired:.2f}x\n"
        + (
            f"the compilation costs {compile_seconds / median['eager']:.0f} eager steps and pays back after "
            f"{compile_seconds / saved_per_step:.0f} steps (the cpu-demo epoch has 186)"
            if saved_per_step > 0
            else "the compiled step is not faster: compilation never pays back"
        )
    )


if __name__ == "__main__":
    main()
