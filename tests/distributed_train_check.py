"""Run by tests/test_train_distributed.py under ``torchrun --nproc_per_node 2`` (gloo, CPU); not a test module.

1. With dropout off, the loss over the gathered batch (each process encodes its half) equals the loss of one
   process encoding the whole global batch, for WEINCE and InfoNCE; after DDP's averaging, the gradients equal
   the single-process gradients of the global-batch loss.
2. ``train()`` runs a few steps on two processes with gathered negatives.

Usage: torchrun --nproc_per_node 2 tests/distributed_train_check.py TINY_MODEL TRAIN_FILE OUTPUT_DIR
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.config import preset
from simcse_weince.text.data import PaddingCollator
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import train
from simcse_weince.weince.loss import WeinceConfig


def main(model_path: str, train_file: str, output_dir: str) -> None:
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    assert world == 2, f"expected 2 processes, got {world}"
    torch.manual_seed(0)
    model = SimCSEModel.from_pretrained(model_path, pooler="cls")  # same weights on both ranks (seeded MLP)
    reference = copy.deepcopy(model).eval()  # dropout off: the two views coincide, the check is exact
    sentences = Path(train_file).read_text().splitlines()[:32]  # global batch 32, 16 per process
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    tokenize = lambda texts: collate([model.tokenizer(t, truncation=True, max_length=32) for t in texts])  # noqa: E731
    everything = tokenize(sentences)
    local = tokenize(sentences[rank * 16 : (rank + 1) * 16])
    ddp_model = accelerator.prepare(model)
    ddp_model.eval()
    report = {"world": world}
    for loss_name in ("weince", "infonce"):
        ddp_model.zero_grad()
        reference.zero_grad()
        config = WeinceConfig(quantile=0.3)
        first, second = ddp_model(**local, num_views=2)
        loss, _ = ContrastiveObjective(loss_name, 0.05, weince=config, gather=True)(first, second)
        loss.backward()
        first, second = reference(**everything, num_views=2)
        expected, _ = ContrastiveObjective(loss_name, 0.05, weince=config, gather=False)(first, second)
        expected.backward()
        grads = [
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(accelerator.unwrap_model(ddp_model).parameters(), reference.parameters())
            if p.grad is not None
        ]
        report[loss_name] = {
            "loss": loss.item(),
            "single_process_loss": expected.item(),
            "max_grad_difference": max(grads),
            "max_grad": max(q.grad.abs().max().item() for q in reference.parameters() if q.grad is not None),
        }
    # 2. the trainer itself on two processes
    config = preset(
        "paper", model=model_path, train_file=train_file, batch_size=16, max_steps=4, eval_steps=0, save_steps=2,
        final_tasks=[], report_to=["csv"], output_dir=output_dir, cpu=True, learning_rate=1e-3, mixed_precision="no",
    )  # fmt: skip
    results = train(config)
    if rank == 0:
        report["train"] = {key: results[key] for key in ("num_processes", "total_steps", "stsb_test_spearman")}
        report["train"]["history"] = results["history"]
        Path(output_dir, "distributed_report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
