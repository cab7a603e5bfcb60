"""Gathering embeddings across processes, so that negatives and WEINCE's batch statistics span the global batch."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor):
        ctx.rank, ctx.rows = dist.get_rank(), tensor.shape[0]
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        # Every process's loss depends on every gathered row: sum their gradients, keep this process's rows.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, keeping the gradient path.

    Without a process group (or with one process) the tensor is returned as is. Every process must pass the
    same shape (drop the last incomplete batch).

    Every process then computes the *same* global loss. The backward pass sums the gradients of all processes
    (world_size times the gradient of the global loss w.r.t. the local rows), and DDP averages parameter gradients
    over processes: the two factors cancel, so the update is the gradient of the global-batch loss, exactly as on
    one device with the whole batch.
    """
    if world_size() == 1:
        return tensor
    return _GatherWithGrad.apply(tensor)
