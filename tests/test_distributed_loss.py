"""Two processes (gloo, CPU): gathered WEINCE equals single-process WEINCE on the global batch."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simcse_weince import WeinceConfig, weince_loss
from simcse_weince.losses import WeinceLoss

WORLD_SIZE = 2
LOCAL_BATCH = 24
DIM = 16


def _global_batch():
    generator = torch.Generator().manual_seed(0)
    anchors = torch.randn(WORLD_SIZE * LOCAL_BATCH, DIM, generator=generator, dtype=torch.float64)
    positives = anchors + 0.3 * torch.randn(anchors.shape, generator=generator, dtype=torch.float64)
    return anchors, positives


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        anchors, positives = _global_batch()
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        local_anchors = anchors[rows].clone().requires_grad_(True)
        local_positives = positives[rows].clone().requires_grad_(True)
        loss_module = WeinceLoss(model=torch.nn.Identity(), gather_across_devices=True, weince=WeinceConfig())
        loss = loss_module.compute_loss_from_embeddings([local_anchors, local_positives])
        loss.backward()
        results[rank] = (
            loss.item(),
            local_anchors.grad / WORLD_SIZE,
            local_positives.grad / WORLD_SIZE,
            loss_module.last_statistics,
        )
    finally:
        dist.destroy_process_group()


def test_gathered_loss_equals_single_process_loss_on_the_global_batch():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(_free_port(), results), nprocs=WORLD_SIZE, join=True)

    anchors, positives = _global_batch()
    anchors.requires_grad_(True)
    positives.requires_grad_(True)
    expected, stats = weince_loss(anchors, positives, temperature=0.05, return_stats=True)
    expected.backward()
    for rank in range(WORLD_SIZE):
        loss, grad_anchors, grad_positives, diagnostics = results[rank]
        rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        assert abs(loss - expected.item()) <= 1e-12
        # Each process's gradient, averaged over processes as DDP does, is the global-batch gradient.
        torch.testing.assert_close(grad_anchors, anchors.grad[rows], rtol=0, atol=1e-12)
        torch.testing.assert_close(grad_positives, positives.grad[rows], rtol=0, atol=1e-12)
        assert abs(diagnostics["lambda_mean"] - stats["mixing_weight"].mean().item()) <= 1e-12
