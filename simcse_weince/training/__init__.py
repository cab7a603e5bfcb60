"""What every trainer (text and vision) shares.

=============================  ==========================================================================
``training/loop.py``           :func:`run_training`: the one training loop, driven by a recipe per trainer
``training/run_folder.py``     the run folder: its lock, identity and manifest, --overwrite, --resume's checks
``training/checkpoints.py``    atomic checkpoints verified by sha256, safe loads, one trainer state and its settings
``training/folder_io.py``      every write, move and removal in a run folder, none through a link
``training/tracking.py``       metrics.csv + TensorBoard, progress postfix, Ctrl-C, stop on a non-finite loss
``training/accelerator.py``    the Accelerator: processes, device, ``--mixed-precision auto``
``training/flops.py``          model FLOPs of a step's real tokens and the measured matmul peak: FLOP utilisation
``training/kernel_caches.py``  bounds on the CPU kernel caches that grow with every new batch shape
=============================  ==========================================================================

The loss both trainers optimise sits with the other losses, on the path from embeddings to the loss:
:class:`~simcse_weince.losses.from_embeddings.ContrastiveObjective`.
"""
