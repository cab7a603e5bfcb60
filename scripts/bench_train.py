"""Training throughput: our SimCSE trainer vs sentence-transformers' trainer with MultipleNegativesRankingLoss.

Both train the same model on the same sentences with batch 64, length 32, lr 3e-5, dropout on, for ``--steps``
optimizer steps after ``--warmup`` untimed ones, in alternating order within one process (interleaved rounds,
so that a busy machine slows both alike). Unsupervised SimCSE in sentence-transformers is MNRL on
(sentence, sentence) pairs: two forward passes of 64; our trainer runs one forward over the doubled batch.
The reported rate counts sentences per second of steady-state training steps (each sentence is encoded twice
in both); setup, model export and evaluation are excluded.

Usage::

    python scripts/bench_train.py --steps 10            # a few minutes on 2 CPU cores
    python scripts/bench_train.py --steps 30 --rounds 3 --loss infonce
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


def run_ours(model: str, sentences_file: Path, args, workdir: Path) -> float:
    from simcse_weince.train import preset, train

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
        output_dir=str(workdir / "ours"),
    )
    results = train(config, overwrite=True)
    # history holds the cumulative training time after each step
    return steady_rate([entry["train_seconds"] for entry in results["history"]], args.warmup, args.batch_size)


def run_sentence_transformers(model_path: str, sentences: list[str], args, workdir: Path) -> float:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times = []

        def on_step_end(self, *unused, **kwargs):
            self.times.append(time.perf_counter())

    model = SentenceTransformer(model_path, device="cpu")
    model.max_seq_length = args.max_length
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
    return steady_rate(timer.times, args.warmup, args.batch_size)


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
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")

    import torch

    from simcse_weince.modeling import resolve_model_path
    from simcse_weince.paths import resolve_data_dir

    model_path = resolve_model_path(args.model)
    needed = (args.warmup + args.steps) * args.batch_size
    lines = (resolve_data_dir(args.data_dir) / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()][:needed]
    if len(sentences) < needed:
        parser.error(f"need {needed} sentences, wiki1m_head.txt has {len(sentences)}: lower --steps")
    print(
        f"model {args.model}, batch {args.batch_size}, length {args.max_length}, {args.steps} timed steps "
        f"(+{args.warmup} warm-up) x {args.rounds} rounds, torch threads {torch.get_num_threads()}"
    )
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sentences_file = workdir / "sentences.txt"
        sentences_file.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        for round_index in range(args.rounds):
            # alternate who goes first, so a drift in machine load does not favour one side
            order = ("st", "ours") if round_index % 2 == 0 else ("ours", "st")
            for name in order:
                if name == "ours":
                    ours.append(run_ours(args.model, sentences_file, args, workdir))
                else:
                    theirs.append(run_sentence_transformers(model_path, sentences, args, workdir))
            print(
                f"round {round_index + 1}: simcse-weince ({args.loss}) {ours[-1]:.1f} sentences/s, "
                f"sentence-transformers MNRL {theirs[-1]:.1f} sentences/s, ratio {ours[-1] / theirs[-1]:.2f}x"
            )
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(
        f"median: simcse-weince {statistics.median(ours):.1f} sentences/s, sentence-transformers "
        f"{statistics.median(theirs):.1f} sentences/s, ratio {statistics.median(ratios):.2f}x (goal >= 1.0x)"
    )


if __name__ == "__main__":
    main()
