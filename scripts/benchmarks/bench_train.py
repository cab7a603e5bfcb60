"""Training throughput: our SimCSE trainer vs sentence-transformers' trainer with MultipleNegativesRankingLoss.

Both train the same model on the same sentences with batch 64, length 32, lr 3e-5, dropout on, for ``--steps``
optimizer steps after ``--warmup`` untimed ones, in alternating order within one process (interleaved rounds,
so that a busy machine slows every configuration alike). Each round trains on sentences of its own (the same for
every configuration of the round): a real run meets new batch shapes every step, and oneDNN, which builds and
caches a kernel per shape, would otherwise serve repeated batches from its cache. Unsupervised SimCSE in sentence-transformers is MNRL
on (sentence, sentence) pairs: two forward passes of 64, each padded to its longest sentence; our trainer runs
one forward over the doubled batch, in ``length_chunks`` length-sorted chunks. The rate counts sentences per
second of steady-state training steps (each sentence is encoded twice in both); setup, model export and
evaluation are excluded.

Each round measures eleven configurations:

- ``st fp32`` / ``st bf16``: sentence-transformers' trainer, fp32 (its default) and ``bf16=True``;
- ``ours fp32 padded`` / ``ours bf16 padded``: our trainer with one forward padded to the longest sentence and the
  Hugging Face forward (``length_chunks=1``, ``unpadded_layers=False``);
- ``ours fp32 chunked`` / ``ours bf16 chunked``: fp32's number of length-sorted chunks (4), still the Hugging Face
  forward in each (``unpadded_layers=False``: the default before the unpadded layers);
- ``ours fp32`` / ``ours bf16``: our trainer's defaults (``length_chunks`` ``auto``, ``unpadded_layers``: the
  linear layers on the real tokens only; ``onednn_linear`` ``auto``: fp32 linear layers through oneDNN on AMD
  CPUs), ``--mixed-precision no`` / ``bf16``;
- ``ours fp32 exact rows`` / ``ours bf16 exact rows``: the defaults with the linear layers on exactly the real
  tokens' rows, not a row count rounded up to a multiple of 64 (a new kernel shape almost every step);
- ``ours fp32 no onednn``: ``ours fp32`` with ``onednn_linear=False`` (torch's own fp32 linear layers, MKL's sgemm).

and prints, as medians over rounds of the per-round ratios: ours vs sentence-transformers at equal precision
(fp32 and bf16), the gain of length-sorted chunks alone and of the unpadded linear layers alone (fp32 and bf16),
of the oneDNN linear layers alone (fp32), of bf16 alone, and out of the box against out of the box (our default
``--mixed-precision auto`` against sentence-transformers' default fp32).

**FLOP utilisation.** Each configuration's model FLOPs are counted from the model's configuration and the *real*
tokens of each timed step (``simcse_weince/training/flops.py``: the same count for both trainers, whatever they
pad), and divided by its time: the achieved FLOP/s, printed with its fraction of this machine's matmul peak at the
same precision (a 2048 x 2048 GEMM, ``torch.mm``, at the same thread count, measured in every round; the best
round is the peak). Before the rounds, the formula is checked against ``torch.utils.flop_counter`` on one step of
the stock forward and backward (eager attention, padded to the longest sentence).

Usage::

    python scripts/benchmarks/bench_train.py --steps 10 --rounds 3     # about 15 minutes on 2 CPU cores
    python scripts/benchmarks/bench_train.py --steps 8 --rounds 3 --loss infonce
    python scripts/benchmarks/bench_train.py --steps 8 --rounds 6 --configs "st fp32,ours fp32,st bf16,ours bf16"
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def steady_rate(step_end_times: list[float], warmup: int, batch_size: int) -> float:
    """Sentences per second between the end of warm-up step ``warmup`` and the last step."""
    timed_steps = len(step_end_times) - warmup
    return timed_steps * batch_size / (step_end_times[-1] - step_end_times[warmup - 1])


def steady_flops(step_end_times: list[float], cumulative_flops: list[float], warmup: int) -> float:
    """Model FLOP/s between the end of warm-up step ``warmup`` and the last step (cumulative counts per step)."""
    return (cumulative_flops[-1] - cumulative_flops[warmup - 1]) / (step_end_times[-1] - step_end_times[warmup - 1])


def check_flop_formula(model_path: str, sentences: list[str], max_length: int) -> str:
    """The formula against ``torch.utils.flop_counter`` on one forward and backward of the stock encoder (eager
    attention: flash attention's backward recomputes the scores, FLOPs the model count leaves out) over one batch
    padded to its longest sentence; and how much of that batch is padding."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModel, AutoTokenizer

    from simcse_weince.training.flops import encoder_training_flops

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    encoder = AutoModel.from_pretrained(model_path, attn_implementation="eager", add_pooling_layer=False)
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with FlopCounterMode(display=False) as counter:
        encoder(**batch).last_hidden_state.sum().backward()
    rows, padded_length = batch["input_ids"].shape
    formula = encoder_training_flops(encoder.config, [padded_length] * rows)
    real = encoder_training_flops(encoder.config, batch["attention_mask"].sum(dim=1).tolist())
    return (
        f"FLOP formula check ({rows} sentences padded to {padded_length}, stock forward + backward): formula "
        f"{formula / 1e9:.3f} GFLOP, torch.utils.flop_counter {counter.get_total_flops() / 1e9:.3f} GFLOP "
        f"(ratio {counter.get_total_flops() / formula:.6f}); on the real tokens only {real / 1e9:.3f} GFLOP "
        f"({100 * real / formula:.1f}% of the padded batch's)"
    )


def training_sentences(args, parser: argparse.ArgumentParser) -> list[str]:
    """The first ``rounds x (warmup + steps) x batch_size`` non-empty lines of wiki1m_head.txt (each round trains on
    its own); a parser error if short."""
    from simcse_weince.paths import resolve_data_dir

    needed = args.rounds * (args.warmup + args.steps) * args.batch_size
    lines = (resolve_data_dir(args.data_dir) / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()][:needed]
    if len(sentences) < needed:
        parser.error(f"need {needed} sentences, wiki1m_head.txt has {len(sentences)}: lower --steps")
    return sentences


def run_ours(
    model: str,
    sentences_file: Path,
    args,
    workdir: Path,
    mixed_precision: str,
    length_chunks: int,
    compile=False,
    unpadded_layers=True,
    onednn_linear="auto",
) -> tuple[float, float]:
    from simcse_weince.text.config import preset
    from simcse_weince.text.trainer import train

    config = preset(
        "paper",
        model=model,
        pooler="avg",
        train_file=str(sentences_file),
        batch_size=args.batch_size,
        max_length=args.max_length,
        loss=args.loss,
        max_steps=args.warmup + args.steps,
        eval_steps=0,
        save_steps=0,
        final_evaluation=False,
        report_to=[],
        cpu=True,
        seed=args.seed,
        mixed_precision=mixed_precision,
        length_chunks=length_chunks,
        compile=compile,
        unpadded_layers=unpadded_layers,
        onednn_linear=onednn_linear,
        output_dir=str(workdir / "ours"),
    )
    results = train(config, overwrite=True)
    # history holds the cumulative training time and model FLOPs after each step
    times = [entry["train_seconds"] for entry in results["history"]]
    flops = [entry["model_flops"] for entry in results["history"]]
    return steady_rate(times, args.warmup, args.batch_size), steady_flops(times, flops, args.warmup)


def exact_rows(run):
    """``run`` with the linear layers on exactly the real tokens' rows (``ROW_MULTIPLE`` 1): a chunk's row count,
    and so oneDNN's kernel shapes, are new almost every step."""

    def run_exact() -> tuple[float, float]:
        from simcse_weince.text.fast_path import unpadded

        kept, unpadded.ROW_MULTIPLE = unpadded.ROW_MULTIPLE, 1
        try:
            return run()
        finally:
            unpadded.ROW_MULTIPLE = kept

    return run_exact


def run_sentence_transformers(
    model_path: str, sentences: list[str], args, workdir: Path, bf16: bool
) -> tuple[float, float]:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from simcse_weince.training.flops import encoder_training_flops

    model = SentenceTransformer(model_path, device="cpu")
    model.max_seq_length = args.max_length
    transformer = model[0]
    counted = [0]  # model FLOPs of the forwards so far (each of MNRL's two columns is one forward)

    def count_tokens(module, inputs, kwargs):
        features = inputs[0] if inputs else kwargs["features"]
        lengths = features["attention_mask"].sum(dim=1).tolist()
        counted[0] += encoder_training_flops(transformer.auto_model.config, lengths)

    transformer.register_forward_pre_hook(count_tokens, with_kwargs=True)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.flops = [], []

        def on_step_end(self, *unused, **kwargs):
            self.times.append(time.perf_counter())
            self.flops.append(counted[0])

    dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    training_args = SentenceTransformerTrainingArguments(
        output_dir=str(workdir / "st"),
        per_device_train_batch_size=args.batch_size,
        max_steps=args.warmup + args.steps,
        learning_rate=3e-5,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        dataloader_drop_last=True,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=10_000,
        report_to="none",
        use_cpu=True,
        bf16=bf16,
        seed=args.seed,
        disable_tqdm=True,
    )
    timer = StepTimes()
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        loss=MultipleNegativesRankingLoss(model, scale=1 / 0.05),  # SimCSE's temperature
        callbacks=[timer],
    )
    trainer.train()
    return steady_rate(timer.times, args.warmup, args.batch_size), steady_flops(timer.times, timer.flops, args.warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per trainer and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--loss", choices=["weince", "infonce"], default="weince", help="our trainer's loss")
    parser.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", default=None, help="folder with wiki1m_head.txt ($SIMCSE_WEINCE_DATA_DIR)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also run ours under bf16 with --compile (the compilation falls in the warm-up: use --warmup >= 2)",
    )
    parser.add_argument(
        "--bf16",
        choices=("native", "always", "never"),
        default="native",
        help="measure the bf16 configurations only where this CPU computes bf16 natively (default), always, never",
    )
    parser.add_argument(
        "--configs",
        default=None,
        help="comma-separated configurations to run (default: all), e.g. 'st fp32,ours fp32,st bf16,ours bf16' for "
        "the two acceptance ratios only: more rounds in the same time, so a median that noise moves less",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")

    import torch

    from simcse_weince.paths import resolve_model_path

    model_path = resolve_model_path(args.model)
    every_round = training_sentences(args, parser)
    per_round = len(every_round) // args.rounds
    sentences = every_round[:per_round]  # the round's sentences (the runs below read this name when called)
    print(
        f"model {args.model}, batch {args.batch_size}, length {args.max_length}, {args.steps} timed steps "
        f"(+{args.warmup} warm-up) x {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    from simcse_weince.precision import resolve_mixed_precision
    from simcse_weince.text.config import SpeedConfig, resolve_length_chunks
    from simcse_weince.text.fast_path.onednn_linear import resolve_onednn_linear

    chunks = SpeedConfig.length_chunks  # the trainer's default ("auto": by precision and CPU)
    auto = resolve_mixed_precision("auto", "cpu")
    onednn_auto = "on" if resolve_onednn_linear("auto", "cpu") else "off"
    fp32_chunks = resolve_length_chunks(chunks, "no")
    bf16_chunks = resolve_length_chunks(chunks, "bf16", "cpu")  # auto's choice: one of the two bf16 runs below
    # "padded" and "chunked" run the linear layers on the padding too (the Hugging Face forward, unpadded_layers
    # off); "ours fp32" / "ours bf16" are the trainer's defaults (auto's chunks, linear layers on real tokens only)
    same_chunks_padded_layers = "ours bf16 padded" if bf16_chunks == 1 else "ours bf16 chunked"
    runs = {
        "st fp32": lambda: run_sentence_transformers(model_path, sentences, args, workdir, bf16=False),
        "st bf16": lambda: run_sentence_transformers(model_path, sentences, args, workdir, bf16=True),
        "ours fp32 padded": lambda: run_ours(args.model, sentences_file, args, workdir, "no", 1, unpadded_layers=False),
        "ours fp32 chunked": lambda: run_ours(
            args.model, sentences_file, args, workdir, "no", fp32_chunks, unpadded_layers=False
        ),
        "ours fp32": lambda: run_ours(args.model, sentences_file, args, workdir, "no", chunks),
        "ours fp32 no onednn": lambda: run_ours(
            args.model, sentences_file, args, workdir, "no", chunks, onednn_linear=False
        ),
        "ours bf16 padded": lambda: run_ours(
            args.model, sentences_file, args, workdir, "bf16", 1, unpadded_layers=False
        ),
        "ours bf16 chunked": lambda: run_ours(
            args.model, sentences_file, args, workdir, "bf16", fp32_chunks, unpadded_layers=False
        ),
        "ours bf16": lambda: run_ours(args.model, sentences_file, args, workdir, "bf16", chunks),
        "ours fp32 exact rows": exact_rows(lambda: run_ours(args.model, sentences_file, args, workdir, "no", chunks)),
        "ours bf16 exact rows": exact_rows(lambda: run_ours(args.model, sentences_file, args, workdir, "bf16", chunks)),
    }
    if args.compile:  # auto's bf16 configuration with the encoder compiled (its compilation in the warm-up steps)
        runs["ours bf16 compiled"] = lambda: run_ours(
            args.model, sentences_file, args, workdir, "bf16", bf16_chunks, compile=True,
        )  # fmt: skip
    if args.bf16 == "never" or (args.bf16 == "native" and auto != "bf16"):
        # emulated bf16 (no AVX512-BF16 / AMX) runs many times slower than fp32: nobody would train that way
        print(f"bf16 is not native on this CPU (--mixed-precision auto -> {auto}): bf16 configurations skipped")
        runs = {name: run for name, run in runs.items() if "bf16" not in name}
    if args.configs:
        wanted = [name.strip() for name in args.configs.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in runs]
        if unknown:
            parser.error(f"--configs: unknown or skipped {unknown}; choose from {list(runs)}")
        runs = {name: runs[name] for name in wanted}
    print(check_flop_formula(model_path, sentences[: args.batch_size], args.max_length))
    from simcse_weince.training.flops import matmul_peak_flops

    precisions = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if any("bf16" in name for name in runs) else {})}
    rates: dict[str, list[float]] = {name: [] for name in runs}
    flop_rates: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, list[float]] = {precision: [] for precision in precisions}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sentences_file = workdir / "sentences.txt"
        for round_index in range(args.rounds):
            # each round trains on new sentences, as a run meets new batch shapes every step: repeating the same
            # batches would let oneDNN's kernels, cached by shape, hide a cost that every real step pays
            sentences = every_round[round_index * per_round : (round_index + 1) * per_round]
            sentences_file.write_text("\n".join(sentences) + "\n", encoding="utf-8")
            # alternate the order, so that a drift in machine load does not favour one configuration
            order = list(runs) if round_index % 2 == 0 else list(reversed(runs))
            for precision, dtype in precisions.items():  # the peak at this thread count, once a round
                peaks[precision].append(matmul_peak_flops(dtype, seconds=1.0))
            for name in order:
                rate, flop_rate = runs[name]()
                rates[name].append(rate)
                flop_rates[name].append(flop_rate)
            print(
                f"round {round_index + 1}: "
                + ", ".join(f"{name} {rates[name][-1]:.1f}" for name in runs)
                + " sentences/s; matmul peak "
                + ", ".join(f"{precision} {values[-1] / 1e9:.0f}" for precision, values in peaks.items())
                + " GFLOP/s"
            )

    # out of the box: our default (--mixed-precision auto, default length_chunks) vs sentence-transformers' (fp32)
    ours_default = "ours bf16" if auto == "bf16" else "ours fp32"
    comparisons = [
        ("ours / sentence-transformers, both fp32", "ours fp32", "st fp32", 1.5),
        (f"ours / sentence-transformers, both bf16 (ours: auto's {bf16_chunks} chunk(s))", "ours bf16", "st bf16", 1.3),
        (
            f"length-sorted chunks alone (fp32, {fp32_chunks} chunks vs 1)",
            "ours fp32 chunked",
            "ours fp32 padded",
            None,
        ),
        (
            f"length-sorted chunks alone (bf16, {fp32_chunks} chunks vs 1)",
            "ours bf16 chunked",
            "ours bf16 padded",
            None,
        ),
        (
            f"unpadded linear layers alone (fp32, {fp32_chunks} chunks)",
            "ours fp32 no onednn",
            "ours fp32 chunked",
            None,
        ),
        (f"oneDNN linear layers alone (fp32; auto -> {onednn_auto} here)", "ours fp32", "ours fp32 no onednn", None),
        (f"unpadded linear layers alone (bf16, {bf16_chunks} chunk(s))", "ours bf16", same_chunks_padded_layers, None),
        ("bf16 alone (ours, bf16 vs fp32, defaults)", "ours bf16", "ours fp32", None),
        ("row counts rounded to 64 alone (fp32)", "ours fp32", "ours fp32 exact rows", None),
        ("row counts rounded to 64 alone (bf16)", "ours bf16", "ours bf16 exact rows", None),
        ("ours compiled / sentence-transformers, both bf16 (steady state)", "ours bf16 compiled", "st bf16", 1.3),
        ("compile alone (ours bf16, steady state)", "ours bf16 compiled", same_chunks_padded_layers, None),
        (f"out of the box: ours (auto -> {auto}) / sentence-transformers (fp32)", ours_default, "st fp32", None),
    ]
    peak = {precision: max(values) for precision, values in peaks.items()}
    print(
        f"\nmeasured matmul peak (best of {args.rounds} rounds, {torch.get_num_threads()} threads): "
        + ", ".join(f"{precision} {value / 1e9:.0f} GFLOP/s" for precision, value in peak.items())
    )
    print(f"medians over {args.rounds} interleaved rounds: sentences/s, model GFLOP/s, FLOP utilisation (MFU)")
    for name, values in rates.items():
        precision = "bf16" if "bf16" in name else "fp32"
        flops = statistics.median(flop_rates[name])
        print(
            f"  {name:<26} {statistics.median(values):7.1f} sent/s {flops / 1e9:7.1f} GFLOP/s "
            f"{100 * flops / peak[precision]:5.1f}% of the {precision} peak"
        )
    side_by_side = [
        f"{precision} ours {100 * statistics.median(flop_rates[f'ours {precision}']) / peak[precision]:.1f}% / "
        f"sentence-transformers {100 * statistics.median(flop_rates[f'st {precision}']) / peak[precision]:.1f}%"
        for precision in peak
        if f"ours {precision}" in flop_rates and f"st {precision}" in flop_rates
    ]
    if side_by_side:
        print("FLOP utilisation of the measured peak, defaults: " + "; ".join(side_by_side))
    print("ratios (median of the per-round ratios):")
    for label, numerator, denominator, goal in comparisons:
        if numerator not in rates or denominator not in rates:
            continue
        per_round = [a / b for a, b in zip(rates[numerator], rates[denominator])]
        print(
            f"  {label}: {statistics.median(per_round):.2f}x"
            + (f" (goal >= {goal}x)" if goal else "")
            + f"; rounds {', '.join(f'{ratio:.2f}' for ratio in per_round)}"
        )


if __name__ == "__main__":
    main()
