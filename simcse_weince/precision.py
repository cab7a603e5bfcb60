"""Which mixed precision a run uses: ``auto`` picks bf16 where the device computes it natively, else fp32.

The rule (``--mixed-precision auto``, the trainers' default):

- a CUDA device that supports bf16 natively (Ampere and later: ``torch.cuda.is_bf16_supported``, emulation not
  counted) -> ``bf16``;
- a CPU with AVX512-BF16 or AMX tiles (Intel Cooper Lake, Sapphire Rapids and later; AMD Zen 4 and later)
  -> ``bf16``; torch exposes both through private helpers in ``torch.cpu``, so :mod:`simcse_weince.compat` checks
  them and a torch without them counts as "no native bf16";
- anything else (older CPUs and GPUs, Apple MPS, other accelerators) -> ``no`` (fp32).

Where bf16 is emulated it is many times slower than fp32 (why: docs/performance.md#emulated-bf16), so ``auto`` never
picks it there. fp16 is never picked automatically (it needs loss scaling and a GPU); ask for it with
``--mixed-precision fp16``.

WEINCE's tail statistics and logits are computed in float32 or higher under any autocast (see
:mod:`simcse_weince.weince`), so bf16 changes the encoder's arithmetic, not the loss's.
"""

from __future__ import annotations

import logging

from simcse_weince import compat

logger = logging.getLogger(__name__)

MIXED_PRECISION = ("auto", "no", "fp16", "bf16")


def native_bf16(device_type: str) -> bool:
    """True when ``device_type`` ("cpu", "cuda", ...) computes bf16 natively on this machine."""
    import torch

    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch without the including_emulation argument
            return bool(torch.cuda.is_bf16_supported())
    if device_type == "cpu":
        return compat.cpu_has_avx512_bf16() or amx_tiles()
    return False


def amx_tiles() -> bool:
    """True on a CPU with AMX tiles (Intel Sapphire Rapids and later), whose bf16 matmuls are fastest."""
    return compat.cpu_has_amx_tiles()


def resolve_mixed_precision(requested: str, device_type: str) -> str:
    """The precision a run uses: ``requested`` itself, or for ``auto`` ``bf16`` / ``no`` by the rule above.

    Raises ValueError for an unknown name and for fp16 on a CPU (Accelerate would silently train in fp32).
    """
    if requested not in MIXED_PRECISION:
        raise ValueError(f"mixed_precision must be one of {', '.join(MIXED_PRECISION)}, got {requested!r}")
    if requested == "fp16" and device_type == "cpu":
        raise ValueError("mixed_precision fp16 needs a GPU; on the CPU use --mixed-precision bf16 (or auto, or no)")
    if requested != "auto":
        return requested
    resolved = "bf16" if native_bf16(device_type) else "no"
    logger.info("mixed precision auto -> %s on %s", resolved, device_type)
    return resolved


def precision_label(mixed_precision: str) -> str:
    """How a resolved precision is shown to people: ``bf16``, ``fp16`` or ``fp32``."""
    return "fp32" if mixed_precision == "no" else mixed_precision
