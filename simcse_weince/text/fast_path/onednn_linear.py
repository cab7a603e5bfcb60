"""fp32 linear layers through oneDNN, for the unpadded training forward on CPUs where that is faster.

torch computes an fp32 ``nn.Linear`` on the CPU with MKL's sgemm. On AMD CPUs MKL runs a generic code path, while
oneDNN (part of every x86 torch build: torch's bf16 matmuls and inductor's CPU kernels use it) picks its kernels by
instruction set. On the AMD CPUs measured, MiniLM's linear layers ran faster with the forward and the input
gradient through oneDNN; the weight gradient stays with torch's mm, as fast as oneDNN's for that product
(docs/performance.md#fp32-linear-layers-through-onednn-zen-4-2026-12-03).

The products are the same; oneDNN sums them in another order, so results move at fp32 rounding, as they do between
CPUs whose kernels differ (``tests/test_step_losses.py``'s tolerance). Nothing else changes: the weights are the
modules' own, and under autocast, on other dtypes or devices, and for anything but a plain ``nn.Linear`` without
hooks, :func:`linear` calls the module itself.

``auto`` (the trainers' default, :func:`resolve_onednn_linear`) turns it on for AMD x86 CPUs only: on Intel CPUs
MKL takes its own tuned path, and this was not measured there.
"""

from __future__ import annotations

import functools
import logging
import platform

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _linear_pointwise(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``rows @ weight.T + bias`` by oneDNN (the op inductor uses for CPU linear layers); strided views are read in
    place."""
    return torch.ops.mkldnn._linear_pointwise(rows, weight, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """``F.linear`` on 2-D fp32 CPU rows: forward and input gradient by oneDNN, weight gradient by torch's mm."""

    @staticmethod
    def forward(ctx, rows, weight, bias):
        ctx.save_for_backward(rows, weight)
        ctx.has_bias = bias is not None
        return _linear_pointwise(rows, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_rows = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_rows = _linear_pointwise(grad, weight.t(), None)
        if ctx.needs_input_grad[1]:
            grad_weight = grad.t().mm(rows)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0)
        return grad_rows, grad_weight, grad_bias


def _has_hooks(layer: nn.Module) -> bool:
    """Whether calling ``layer`` would run hooks (its own or global ones), which bypassing it would skip."""
    from torch.nn.modules import module as torch_module

    return bool(
        layer._forward_hooks
        or layer._forward_pre_hooks
        or getattr(torch_module, "_global_forward_hooks", None)
        or getattr(torch_module, "_global_forward_pre_hooks", None)
    )


def linear(layer: nn.Module, rows: torch.Tensor, *, onednn: bool) -> torch.Tensor:
    """``layer(rows)``; through oneDNN when ``onednn`` and it applies (a plain ``nn.Linear`` and no hooks, fp32
    rows and weights on the CPU, 2-D and non-empty, no autocast)."""
    if (
        onednn
        and type(layer) is nn.Linear
        and not _has_hooks(layer)
        and rows.dim() == 2
        and rows.shape[0] > 0
        and rows.device.type == "cpu"
        and rows.dtype == torch.float32
        and layer.weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    ):
        return _OneDNNLinear.apply(rows, layer.weight, layer.bias)
    return layer(rows)


@functools.cache
def onednn_linear_available() -> bool:
    """Whether this torch has oneDNN's linear op and it computes ``F.linear`` (checked once, on fixed inputs: it
    draws nothing from the random stream)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        rows = torch.linspace(-1, 1, 24).reshape(4, 6)
        weight = torch.linspace(-0.5, 0.7, 30).reshape(5, 6)
        bias = torch.linspace(0, 1, 5)
        return bool(torch.allclose(_linear_pointwise(rows, weight, bias), nn.functional.linear(rows, weight, bias)))
    except Exception as error:  # noqa: BLE001 - a torch whose op is missing or changed: use the module itself
        logger.info("oneDNN linear unavailable: %s", error)
        return False


def cpu_vendor() -> str | None:
    """The CPU's vendor id on x86 Linux (``AuthenticAMD``, ``GenuineIntel``), None where unknown."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def resolve_onednn_linear(setting: bool | str, device_type: str = "cpu") -> bool:
    """Whether fp32 training runs its linear layers through oneDNN: ``True``/``False`` as asked (True falls back,
    with a warning, where this torch lacks the op); ``auto``: on AMD CPUs, where it was measured faster."""
    if setting == "auto":
        return device_type == "cpu" and cpu_vendor() == "AuthenticAMD" and onednn_linear_available()
    if setting and not onednn_linear_available():
        logger.warning("onednn_linear: this torch has no usable oneDNN linear op; using torch's own linear layers")
        return False
    return bool(setting) and device_type == "cpu"
