"""The 🤗 Accelerator every trainer starts from: processes, device and precision."""

from __future__ import annotations

import os
from pathlib import Path

from simcse_weince.compat import reset_accelerate_state
from simcse_weince.precision import resolve_mixed_precision


def make_accelerator(
    *,
    cpu: bool,
    mixed_precision: str,
    dataloader_config,
    project_dir: Path,
    log_with=None,
    gradient_accumulation_steps: int = 1,
):
    """``(accelerator, the precision used)``. ``mixed_precision="auto"`` becomes bf16 where the device computes it
    natively and fp32 elsewhere; fp16 on a CPU is refused (Accelerate would silently train in fp32)."""
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from accelerate.utils import ProjectConfiguration

    # Accelerate keeps its settings in process-wide singletons: a second run in the same process (a notebook, a
    # benchmark, the tests) may bring other settings (mixed precision, cpu), so start from a clean state. A
    # launched multi-process job keeps its PartialState (the process group lives there).
    reset_accelerate_state(reset_partial_state=int(os.environ.get("WORLD_SIZE", "1")) == 1)
    # the device is the one the Accelerator below will use (the same process-wide state)
    resolved = resolve_mixed_precision(mixed_precision, PartialState(cpu=cpu).device.type)
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=resolved,
        gradient_accumulation_steps=gradient_accumulation_steps,
        dataloader_config=dataloader_config,
        log_with=log_with or None,
        project_config=ProjectConfiguration(project_dir=str(project_dir), logging_dir=str(Path(project_dir) / "logs")),
    )
    return accelerator, resolved
