"""Training memory (resident set size) of our trainer and of sentence-transformers' trainer, and where ours goes.

Both trainers train the same model on the same sentences (wiki1m_head.txt) with batch 64, length 32 and lr 3e-5
for ``--steps`` optimizer steps, at each of ``--precisions`` (``fp32``: ``--mixed-precision no`` / the
sentence-transformers default; ``bf16``: ``--mixed-precision bf16`` / ``bf16=True``), without evaluation or
checkpoints: our trainer is ``cpu-demo``'s recipe (two dropout views of each sentence, one forward over the doubled
batch, WEINCE), theirs MultipleNegativesRankingLoss on (sentence, sentence) pairs. Each run is a fresh process
(its peak is its own), in interleaved order: ours then theirs at each precision, ``--rounds`` times.

Per run it prints the RSS after steps 20, 50, 100 and 200 (those up to ``--steps``), the peak RSS (``VmHWM``)
after step 50 and at the end, and their ratio: a trainer whose memory is flat after warm-up stays within a few
percent. For our trainer it also measures where the memory goes, as RSS deltas at phase boundaries of the same
run (``/proc/self/status``; the peak is reset before a step with ``/proc/self/clear_refs`` where the kernel allows):

- ``runtime``: the process before the model (Python, torch, transformers, datasets);
- ``data``: the training rows loaded (the 🤗 datasets cache, memory-mapped pages touched);
- ``model``: the model, tokenizer and optimizer built (the build step of the trainer, data excluded);
- ``optimizer state``: AdamW's two moments, allocated by the first step (their tensors' bytes, exact);
- ``activations``: the peak during a late step above the RSS before it (what a step holds while it runs);
- ``kernel caches and other growth``: RSS after the last step minus after the first step (oneDNN kernels built
  for new shapes, allocator fragmentation);
- ``evaluation`` (``--evaluation``): the peak of one STS-B dev evaluation above the RSS before it.

``--kernel-caches default`` runs our trainer with torch's kernel-cache capacities (1,024 entries each), as before
:mod:`simcse_weince.training.kernel_caches` bounded them: the before/after comparison.

Usage::

    python scripts/benchmarks/bench_train_memory.py                              # 200 steps, fp32 and bf16
    python scripts/benchmarks/bench_train_memory.py --steps 60 --precisions bf16 --kernel-caches default
    python scripts/benchmarks/bench_train_memory.py --steps 200 --encoder-layers 1 --threads 1   # the growth, faster
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKS = (20, 50, 100, 200)
#: torch's own capacities of oneDNN's primitive cache and ideep's LRU cache (``--kernel-caches default``)
TORCH_DEFAULT_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}


def memory_mib() -> tuple[float, float]:
    """``(RSS, peak RSS)`` of this process in MiB (``VmRSS``, ``VmHWM`` of /proc/self/status)."""
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values["VmRSS"], values["VmHWM"]


def reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux ``clear_refs`` 5); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class StepMemory:
    """RSS and peak RSS after every step."""

    def __init__(self, trace: str | None = None):
        self.rss, self.peak, self.trace = [], [], trace

    def record(self) -> None:
        rss, peak = memory_mib()
        self.rss.append(rss)
        self.peak.append(peak)
        if self.trace:  # step by step, so that a long run's curve can be read while it runs
            with open(self.trace, "a") as handle:
                handle.write(f"{len(self.rss)} {rss:.0f} {peak:.0f} {time.time():.1f}\n")

    def summary(self) -> dict:
        """The RSS at the marks and the peak by step 50 and by the end (a running maximum: the activations'
        measurement resets ``VmHWM`` before a step, after the step before it was recorded)."""
        steps = len(self.rss)
        marks = [mark for mark in MARKS if mark <= steps] or [steps]
        early = min(50, steps)
        peak, early_peak = max(self.peak), max(self.peak[:early])
        return {
            "steps": steps,
            "rss_mib": {str(mark): round(self.rss[mark - 1]) for mark in marks},
            "peak_mib": round(peak),
            "peak_after_early_mib": round(early_peak),
            "early_step": early,
            "late_over_early": round(peak / early_peak, 4),
        }


def worker_ours(args) -> dict:
    import torch

    from simcse_weince.text.config import preset
    from simcse_weince.text.data import load_training_data
    from simcse_weince.text.trainer import TextRecipe
    from simcse_weince.training.loop import run_training

    if args.threads:
        torch.set_num_threads(args.threads)
    breakdown, memory = {}, StepMemory(args.trace)
    runtime = memory_mib()[0]
    breakdown["runtime"] = runtime
    load_training_data(Path(args.data_dir) / "wiki1m_head.txt", None)
    after_data = memory_mib()[0]
    breakdown["data"] = after_data - runtime
    phases = {}

    class MeasuredRecipe(TextRecipe):
        def build(self, run):
            before = memory_mib()[0]
            built = super().build(run)
            phases["model"] = memory_mib()[0] - before
            if args.encoder_layers:  # the same shapes each step, on fewer layers: the growth at a fraction of the time
                encoder = self.unwrapped.encoder
                encoder.encoder.layer = encoder.encoder.layer[: args.encoder_layers]
                encoder.config.num_hidden_layers = args.encoder_layers
            return built

        def train_step(self, step, batches, log_now):
            before = memory_mib()[0]
            measured = step == args.steps - 1 and reset_peak()
            entry = super().train_step(step, batches, log_now)
            memory.record()
            if step == 1:
                phases["after_first_step"] = memory.rss[-1]
                state = [t for s in self.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
                phases["optimizer state"] = sum(t.numel() * t.element_size() for t in state) / 2**20
            if measured:
                phases["activations"] = memory.peak[-1] - before
            return entry

        def evaluate(self, step, write):
            before = memory_mib()[0]
            measured = reset_peak()
            super().evaluate(step, write)
            if measured:
                phases["evaluation"] = memory_mib()[1] - before

    with tempfile.TemporaryDirectory() as workdir:
        config = preset(
            "cpu-demo", model=args.model, mixed_precision="bf16" if args.precision == "bf16" else "no",
            batch_size=args.batch_size, max_length=args.max_length, max_steps=args.steps, num_epochs=1000,
            eval_steps=args.steps if args.evaluation else 0, eval_before_training=False, final_evaluation=False,
            save_steps=0, report_to=[], cpu=True, data_dir=args.data_dir, output_dir=workdir, seed=42,
        )  # fmt: skip
        run_training(config, MeasuredRecipe(config), overwrite=True)
    breakdown["model"] = phases["model"]
    breakdown["optimizer state"] = phases["optimizer state"]
    breakdown["activations"] = phases.get("activations")
    breakdown["kernel caches and other growth"] = memory.rss[-1] - phases["after_first_step"]
    if args.evaluation:
        breakdown["evaluation"] = phases.get("evaluation")
    return {**memory.summary(), "breakdown_mib": {k: None if v is None else round(v) for k, v in breakdown.items()}}


def worker_sentence_transformers(args) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from simcse_weince.paths import resolve_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    memory = StepMemory(args.trace)

    class Record(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            memory.record()

    lines = (Path(args.data_dir) / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()]
    model = SentenceTransformer(resolve_model_path(args.model), device="cpu")
    model.max_seq_length = args.max_length
    with tempfile.TemporaryDirectory() as workdir:
        training_args = SentenceTransformerTrainingArguments(
            output_dir=workdir, per_device_train_batch_size=args.batch_size, max_steps=args.steps,
            learning_rate=3e-5, lr_scheduler_type="linear", warmup_steps=0, max_grad_norm=1.0,
            dataloader_drop_last=True, save_strategy="no", eval_strategy="no", logging_steps=10_000,
            report_to="none", use_cpu=True, bf16=args.precision == "bf16", seed=42, disable_tqdm=True,
        )  # fmt: skip
        dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
        loss = MultipleNegativesRankingLoss(model, scale=1 / 0.05)  # SimCSE's temperature
        trainer = SentenceTransformerTrainer(
            model=model, args=training_args, train_dataset=dataset, loss=loss, callbacks=[Record()]
        )
        trainer.train()
    return memory.summary()


def run_worker(args, trainer: str, precision: str) -> dict:
    command = [
        sys.executable, __file__, "--worker", trainer, "--precision", precision, "--steps", str(args.steps),
        "--batch-size", str(args.batch_size), "--max-length", str(args.max_length), "--model", args.model,
        "--data-dir", str(args.data_dir), "--threads", str(args.threads), "--encoder-layers", str(args.encoder_layers),
    ] + (["--evaluation"] if args.evaluation else [])  # fmt: skip
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
        layers = f"-{args.encoder_layers}layers" if args.encoder_layers else ""
        trace = Path(args.trace_dir) / f"{trainer}-{precision}-{args.kernel_caches}{layers}.txt"
        command += ["--trace", str(trace)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if trainer == "ours" and args.kernel_caches == "default":
        env.update(TORCH_DEFAULT_CACHES)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    row = {"trainer": trainer, "precision": precision, "seconds": round(time.perf_counter() - started),
           "load": round(os.getloadavg()[0], 1)}  # fmt: skip
    if result.returncode != 0:
        return {**row, "error": result.stderr.strip().splitlines()[-1:]}
    return {**row, **json.loads(result.stdout.strip().splitlines()[-1])}


def format_report(rows: list[dict], args) -> str:
    marks, early = [m for m in MARKS if m <= args.steps] or [args.steps], min(50, args.steps)
    lines = [
        f"{args.steps} steps, batch {args.batch_size}, length {args.max_length}, {args.model}, "
        f"kernel caches {args.kernel_caches}, threads {args.threads or 'default'}"
        + (f", ours on its first {args.encoder_layers} encoder layer(s)" if args.encoder_layers else "")
        + "; medians over rounds (MiB)",
        "",
        "| trainer | precision | " + " | ".join(f"RSS @{m}" for m in marks) + f" | peak @{early} | peak "
        f"| peak / peak @{early} |",
        "|---|---|" + "---:|" * (len(marks) + 3),
    ]  # fmt: skip
    medians = {}
    for trainer in ("ours", "sentence-transformers"):
        for precision in args.precisions:
            done = [r for r in rows if r["trainer"] == trainer and r["precision"] == precision and "error" not in r]
            if not done:
                lines.append(f"| {trainer} | {precision} | failed |")
                continue

            def median(get, done=done):
                return statistics.median(get(row) for row in done)

            at_marks = [f"{median(lambda r, m=m: r['rss_mib'][str(m)]):.0f}" for m in marks]
            peak = medians[trainer, precision] = median(lambda r: r["peak_mib"])
            early = median(lambda r: r["peak_after_early_mib"])
            ratio = median(lambda r: r["late_over_early"])
            lines.append(
                f"| {trainer} | {precision} | {' | '.join(at_marks)} | {early:.0f} | {peak:.0f} | {ratio:.3f} |"
            )
    lines.append("")
    for precision in args.precisions:
        if ("ours", precision) in medians and ("sentence-transformers", precision) in medians:
            ratio = medians["ours", precision] / medians["sentence-transformers", precision]
            lines.append(f"peak RSS ours / sentence-transformers, {precision}: {ratio:.2f}x")
    for precision in args.precisions:
        done = [r for r in rows if r["trainer"] == "ours" and r["precision"] == precision and "error" not in r]
        if done:
            parts = [f"{name} {statistics.median(r['breakdown_mib'][name] or 0 for r in done):.0f}"
                     for name in done[0]["breakdown_mib"]]  # fmt: skip
            lines.append(f"where ours goes, {precision} (MiB): " + ", ".join(parts))
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--model", default="bundled:all-MiniLM-L6-v2")
    parser.add_argument("--data-dir", default=None, help="folder with wiki1m_head.txt ($SIMCSE_WEINCE_DATA_DIR)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--encoder-layers", type=int, default=0,
        help="ours: train only the first N encoder layers (a step builds the same kernel shapes on fewer layers)",
    )  # fmt: skip
    parser.add_argument("--evaluation", action="store_true", help="ours: one STS-B dev evaluation after the steps")
    parser.add_argument("--kernel-caches", choices=["bounded", "default"], default="bounded")
    parser.add_argument("--trainers", nargs="+", choices=["ours", "sentence-transformers"],
                        default=["ours", "sentence-transformers"])  # fmt: skip
    parser.add_argument("--output", default=None, help="also write the rows as JSON here")
    parser.add_argument("--trace-dir", default=None, help="write each run's RSS after every step to a file here")
    parser.add_argument("--trace", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["ours", "sentence-transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker = worker_ours if args.worker == "ours" else worker_sentence_transformers
        print(json.dumps(worker(args)))
        return
    from simcse_weince.paths import resolve_data_dir

    args.data_dir = resolve_data_dir(args.data_dir)
    rows = []
    for _ in range(args.rounds):
        for precision in args.precisions:
            for trainer in args.trainers:
                rows.append(run_worker(args, trainer, precision))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(format_report(rows, args))
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
