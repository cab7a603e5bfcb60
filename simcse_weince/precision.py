"""Which mixed precision a run uses: ``auto`` picks bf16 where the device computes it natively, else fp32.

The rule (``--mixed-precision auto``, the trainers' default):

- a CUDA device that supports bf16 natively (Ampere and later: ``torch.cuda.is_bf16_supported``, emulation not
  counted) -> ``bf16``;
- a CPU with AVX512-BF16 or AMX tiles (Intel Cooper Lake, Sapphire Rapids and later; AMD Zen 4 and later)
  -> ``bf16``; torch exposes both through private helpers in ``torch.cpu``, so a torch without them counts as
  "no native bf16";
- anything else (older CPUs and GPUs, Apple MPS, other accelerators) -> ``no`` (fp32).

Where bf16 is emulated it is far slower than fp32, so ``auto`` never picks it there: on an AMD EPYC (Zen 3, AVX2
only) a MiniLM training step of 64 sentences took 52 s under bf16 autocast against 2.1 s in fp32. fp16 is never picked
automatically (it needs loss scaling and a GPU); ask for it with ``--mixed-precision fp16``.

WEINCE's tail statistics and logits are computed in float32 or higher under any autocast (see
:mod:`simcse_weince.weince`), so bf16 changes the encoder's arithmetic, not the loss's.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

MIXED_PRECISION = ("auto", "no", "fp16", "bf16")


def _cpu_feature(name: str) -> bool:
    """A private ``torch.cpu`` feature probe, False where this torch does not have it or it fails."""
    import torch  # here, not at the top: the configs import MIXED_PRECISION, and --help must not load torch

    probe = getattr(torch.cpu, name, None)
    if probe is None:
        return False
    try:
        return bool(probe())
    except Exception:  # noqa: BLE001 - a probe that cannot answer means "not known to be there"
        return False


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
        return _cpu_feature("_is_avx512_bf16_supported") or amx_tiles()
    return False


def amx_tiles() -> bool:
    """True on a CPU with AMX tiles (Intel Sapphire Rapids and later), whose bf16 matmuls are fastest."""
    return _cpu_feature("_is_amx_tile_supported")


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
