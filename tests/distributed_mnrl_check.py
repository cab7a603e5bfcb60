"""Run by tests/test_mnrl_equivalence.py under ``torchrun --nproc_per_node 2`` (gloo, CPU); not a test module.

``gather_across_devices=True`` on two processes: each process embeds its half of every column with a tiny BERT
(dropout off) and :func:`mnrl_grid.compare_grid` compares our losses at λ = 0 with sentence-transformers' MNRL /
CachedMNRL, the losses and the parameter gradients averaged over the processes as DDP averages them (MNRL computes
its local anchors' share of the loss, ours the global batch's on every process: the averages are the same).

Without ``full``: the grid's cross-section (``mnrl_grid.SAMPLE``), plain on every shape and cached on triplets.

Usage: torchrun --nproc_per_node 2 tests/distributed_mnrl_check.py TINY_MODEL SENTENCES_FILE OUTPUT_JSON [full]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mnrl_grid
import torch
import torch.distributed as dist
from sentence_transformers import SentenceTransformer

LOCAL_BATCH = 5  # above mnrl_grid.MINI_BATCH_SIZE


def _mean_over_processes(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor / dist.get_world_size()


def main() -> None:
    model_path, sentences_file, output = sys.argv[1:4]
    full = len(sys.argv) > 4 and sys.argv[4] == "full"
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = SentenceTransformer(model_path, device="cpu")
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    sentences = Path(sentences_file).read_text(encoding="utf-8").splitlines()
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    report = {"world": world}
    for cached in (False, True):
        for shape, num_columns in mnrl_grid.SHAPES.items():
            if cached and not full and shape != "triplets":  # the default suite's run: cached on one shape
                continue
            features = mnrl_grid.column_features(model, sentences, num_columns, world * LOCAL_BATCH, rows)
            report[f"{'cached' if cached else 'plain'}_{shape}"] = mnrl_grid.compare_grid(
                model, features, cached=cached, gather=True, average=_mean_over_processes,
                options_list=None if full else mnrl_grid.SAMPLE,
            )  # fmt: skip
    if rank == 0:
        Path(output).write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
