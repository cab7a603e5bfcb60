"""Batches as a pure function of (seed, batch index), shared by the text and vision trainers.

A resumed run asks for the batches from its step on and gets exactly those of the uninterrupted run, with no
sampler state to save and no batches to skip. The loader is a plain ``torch.utils.data.DataLoader`` (not
prepared by Accelerate, whose loader reads one batch ahead: data augmentations drawn from the global RNG would
then run before the checkpoint that should precede them, and a mid-epoch resume would draw other ones).
"""

from __future__ import annotations

import torch


class StepBatchSampler(torch.utils.data.Sampler):
    """Batches as a pure function of (seed, batch index): exact resumption needs no sampler state.

    Epoch ``e`` visits the sentences in the order ``randperm(n, seed + e)``, in consecutive batches of
    ``batch_size`` (the incomplete last batch is dropped). Iteration starts at ``start_batch`` and stops after
    ``num_batches``; each process takes its ``batch_size / num_processes`` share of every global batch, so the
    global data order does not depend on the number of processes.
    """

    def __init__(self, num_examples, batch_size, seed, start_batch, num_batches, process_index=0, num_processes=1):
        if num_examples < batch_size:
            raise ValueError(f"the training data hold {num_examples} examples, fewer than one batch of {batch_size}")
        if batch_size % num_processes:
            raise ValueError(f"batch_size {batch_size} must be divisible by the number of processes {num_processes}")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.start_batch, self.num_batches = start_batch, num_batches
        self.local_size = batch_size // num_processes
        self.local_offset = process_index * self.local_size
        self.batches_per_epoch = num_examples // batch_size

    def global_batch(self, index: int) -> list[int]:
        epoch, position = divmod(index, self.batches_per_epoch)
        order = torch.randperm(self.num_examples, generator=torch.Generator().manual_seed(self.seed + epoch))
        return order[position * self.batch_size : (position + 1) * self.batch_size].tolist()

    def __iter__(self):
        cached_epoch, order = None, None
        for index in range(self.start_batch, self.num_batches):
            epoch, position = divmod(index, self.batches_per_epoch)
            if epoch != cached_epoch:  # one permutation per epoch
                cached_epoch = epoch
                order = torch.randperm(self.num_examples, generator=torch.Generator().manual_seed(self.seed + epoch))
            start = position * self.batch_size + self.local_offset
            yield order[start : start + self.local_size].tolist()

    def __len__(self):
        return self.num_batches - self.start_batch
