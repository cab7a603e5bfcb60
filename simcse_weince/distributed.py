"""Gathering embeddings across processes, so that negatives and WEINCE's batch statistics span the global batch."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0, keeping the gradient path (sentence-transformers'
    ``all_gather_with_grad``: torch's differentiable ``all_gather``, whose backward sums the gradients of every
    process and keeps this process's rows).

    Without a process group (or with one process) the tensor is returned as is. Every process must pass the
    same shape (drop the last incomplete batch).

    Every process then computes the *same* global loss. The backward pass sums the gradients of all processes
    (world_size times the gradient of the global loss w.r.t. the local rows), and DDP averages parameter gradients
    over processes: the two factors cancel, so the update is the gradient of the global-batch loss, exactly as on
    one device with the whole batch.
    """
    if world_size() == 1:
        return tensor
    from sentence_transformers.util import all_gather_with_grad

    return all_gather_with_grad(tensor.contiguous())
