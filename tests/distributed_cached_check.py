"""Run by tests/test_train_distributed.py under ``torchrun --nproc_per_node 2`` (gloo, CPU); not a test module.

GradCache with two processes and gathered negatives, dropout off:

1. ``CachedWeinceLoss(gather_across_devices=True)`` inside DDP, each process embedding its half of the batch in
   mini-batches that do not divide it, gives the loss and (DDP-averaged) gradients of ``WeinceLoss`` on the
   whole batch in one process; for 1 and 2 text columns.
2. The trainer's ``forward_backward`` with a mini-batch size, inside DDP, gives the loss and gradients of the
   uncached step on the whole batch in one process.
3. ``train()`` with ``mini_batch_size`` on two processes (the test compares its losses with one process
   without it).

Usage: torchrun --nproc_per_node 2 tests/distributed_cached_check.py TINY_MODEL TRAIN_FILE OUTPUT_DIR
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from sentence_transformers import SentenceTransformer

from simcse_weince import CachedWeinceLoss, WeinceLoss
from simcse_weince.losses.from_embeddings import ContrastiveObjective
from simcse_weince.text.config import preset
from simcse_weince.text.data import PaddingCollator
from simcse_weince.text.model import SimCSEModel
from simcse_weince.text.trainer import forward_backward, train
from simcse_weince.weince.loss import WeinceConfig

LOCAL_BATCH = 6
CONFIG = WeinceConfig(quantile=0.3)


def _gradient_difference(model, reference) -> dict:
    pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()) if q.grad is not None]
    return {
        "max_grad_difference": max((p - q).abs().max().item() for p, q in pairs),
        "max_grad": max(q.abs().max().item() for _, q in pairs),
        "num_grads": len(pairs),
    }


def check_sentence_transformers_loss(accelerator, model_path, sentences) -> dict:
    rank, world = accelerator.process_index, accelerator.num_processes
    model = SentenceTransformer(model_path, device="cpu")
    model[0].auto_model.pooler.requires_grad_(False)  # unused by mean pooling; DDP rejects unused parameters
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    reference = copy.deepcopy(model)
    loss_fn = CachedWeinceLoss(model, weince=CONFIG, mini_batch_size=4, gather_across_devices=True)
    ddp_model = accelerator.prepare(model)
    # what SentenceTransformerTrainer does: the loss calls the wrapped model
    loss_fn.model = loss_fn.loss.model = ddp_model
    report = {}
    for num_columns in (1, 2):
        columns = [sentences[c * world * LOCAL_BATCH : (c + 1) * world * LOCAL_BATCH] for c in range(num_columns)]
        local = [model.preprocess(column[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]) for column in columns]
        everything = [reference.preprocess(column) for column in columns]
        ddp_model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        loss = loss_fn(local)
        loss.backward()
        expected = WeinceLoss(reference, weince=CONFIG)(everything)
        expected.backward()
        report[f"{num_columns}_columns"] = {
            "loss": loss.item(),
            "single_process_loss": expected.item(),
            **_gradient_difference(accelerator.unwrap_model(ddp_model), reference),
        }
    return report


def check_trainer_step(accelerator, model_path, sentences) -> dict:
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = SimCSEModel.from_pretrained(model_path, pooler="avg", dropout=0.0)
    reference = copy.deepcopy(model)
    collate = PaddingCollator(model.tokenizer.pad_token_id)
    tokenize = lambda texts: collate([model.tokenizer(t, truncation=True, max_length=32) for t in texts])  # noqa: E731
    global_batch = sentences[: world * LOCAL_BATCH]
    local = tokenize(global_batch[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH])
    ddp_model = accelerator.prepare(model)
    report = {}
    for loss_name in ("weince", "infonce"):
        ddp_model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        objective = ContrastiveObjective(loss_name, 0.05, weince=CONFIG, gather=True)
        loss, _ = forward_backward(ddp_model, local, objective, accelerator, mini_batch_size=4)
        expected, _ = forward_backward(
            reference,
            tokenize(global_batch),
            ContrastiveObjective(loss_name, 0.05, weince=CONFIG, gather=False),
            accelerator,
        )
        report[loss_name] = {
            "loss": loss.item(),
            "single_process_loss": expected.item(),
            **_gradient_difference(accelerator.unwrap_model(ddp_model), reference),
        }
    # triplets (supervised SimCSE): each process holds its rows' three columns; every column is gathered on its
    # own, so the loss is the one-process loss of all rows with all hard negatives as extra candidates
    rows = world * LOCAL_BATCH
    triplets = [[sentences[i], sentences[rows + i], sentences[2 * rows + i]] for i in range(rows)]

    def tokenize_rows(batch_rows):
        return collate([
            {key: [encoded[key] for encoded in (model.tokenizer(t, truncation=True, max_length=32) for t in row)]
             for key in ("input_ids", "attention_mask", "token_type_ids")}
            for row in batch_rows
        ])  # fmt: skip

    local_rows = tokenize_rows(triplets[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH])
    for loss_name in ("weince", "infonce"):
        ddp_model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        objective = ContrastiveObjective(loss_name, 0.05, weince=CONFIG, gather=True)
        loss, _ = forward_backward(ddp_model, local_rows, objective, accelerator, mini_batch_size=3, num_columns=3)
        expected, _ = forward_backward(reference, tokenize_rows(triplets),
                                       ContrastiveObjective(loss_name, 0.05, weince=CONFIG, gather=False),
                                       accelerator, num_columns=3)  # fmt: skip
        report[f"{loss_name}_triplets"] = {
            "loss": loss.item(),
            "single_process_loss": expected.item(),
            **_gradient_difference(accelerator.unwrap_model(ddp_model), reference),
        }
    return report


def main(model_path: str, train_file: str, output_dir: str) -> None:
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == 2, f"expected 2 processes, got {accelerator.num_processes}"
    sentences = [line for line in Path(train_file).read_text().splitlines() if line.strip()]
    report = {
        "world": accelerator.num_processes,
        "sentence_transformers": check_sentence_transformers_loss(accelerator, model_path, sentences),
        "trainer_step": check_trainer_step(accelerator, model_path, sentences),
    }
    # one train() per process group: it ends the group when it finishes
    config = preset(
        "paper", model=model_path, train_file=train_file, pooler="avg", dropout=0.0, batch_size=16, mini_batch_size=3,
        max_steps=3, eval_steps=0, save_steps=0, final_evaluation=False, report_to=["csv"],
        output_dir=str(Path(output_dir) / "cached"), cpu=True, learning_rate=1e-3, mixed_precision="no",
    )  # fmt: skip
    results = train(config)
    if results:  # the main process
        report["train"] = {"history": results["history"], "num_processes": results["num_processes"]}
        Path(output_dir, "distributed_cached_report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
