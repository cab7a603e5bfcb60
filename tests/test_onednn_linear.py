"""fp32 linear layers through oneDNN (``text/fast_path/onednn_linear.py``): the values and gradients of the
linear layer to fp32 rounding (against a float64 reference), taken only where it applies, no random draws, and
``auto``'s rule."""

from __future__ import annotations

import logging
import platform
from pathlib import Path

import pytest
import torch
from torch import nn

from simcse_weince.text.fast_path import onednn_linear as onednn_module
from simcse_weince.text.fast_path.onednn_linear import (
    cpu_vendor,
    linear,
    onednn_linear_available,
    resolve_onednn_linear,
)

needs_onednn = pytest.mark.skipif(not onednn_linear_available(), reason="this torch has no usable oneDNN linear op")
ONEDNN_NODE = "_OneDNNLinearBackward"


def _layer_and_rows(bias=True, num_rows=37, width=32, out=48):
    generator = torch.Generator().manual_seed(0)
    layer = nn.Linear(width, out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out, width, generator=generator) / width**0.5)
        if bias:
            layer.bias.copy_(torch.randn(out, generator=generator))
    rows = torch.randn(num_rows, width, generator=generator).requires_grad_()
    upstream = torch.randn(num_rows, out, generator=generator)
    return layer, rows, upstream


def _node(tensor: torch.Tensor) -> str:
    return type(tensor.grad_fn).__name__


@needs_onednn
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_values_and_gradients_match_a_float64_reference(bias):
    layer, rows, upstream = _layer_and_rows(bias=bias)
    out = linear(layer, rows, onednn=True)
    assert _node(out) == ONEDNN_NODE  # it really took the oneDNN path
    out.backward(upstream)
    weight, x, g = layer.weight.detach().double(), rows.detach().double(), upstream.double()
    expected = {
        "output": x @ weight.T + (layer.bias.detach().double() if bias else 0),
        "input gradient": g @ weight,
        "weight gradient": g.T @ x,
    }
    got = {"output": out.detach(), "input gradient": rows.grad, "weight gradient": layer.weight.grad}
    if bias:
        expected["bias gradient"], got["bias gradient"] = g.sum(0), layer.bias.grad
    else:
        assert layer.bias is None
    for name, reference in expected.items():
        error = (got[name].double() - reference).abs().max().item()
        assert error <= 1e-5 * reference.abs().max().item(), name


@needs_onednn
def test_gradients_only_where_asked():
    layer, rows, upstream = _layer_and_rows()
    layer.requires_grad_(False)  # frozen layer: only the input gradient
    linear(layer, rows, onednn=True).backward(upstream)
    assert layer.weight.grad is None and layer.bias.grad is None
    torch.testing.assert_close(rows.grad, upstream @ layer.weight)
    layer.requires_grad_(True)
    frozen_rows = rows.detach()  # inputs without a gradient (the first layer's embeddings when frozen)
    linear(layer, frozen_rows, onednn=True).backward(upstream)
    torch.testing.assert_close(layer.weight.grad, upstream.T @ frozen_rows, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.bias.grad, upstream.sum(0))


def test_where_it_does_not_apply_the_module_runs_itself():
    layer, rows, _ = _layer_and_rows()
    assert _node(linear(layer, rows, onednn=False)) != ONEDNN_NODE
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast keeps torch's own bf16 kernels
        out = linear(layer, rows, onednn=True)
    assert out.dtype == torch.bfloat16 and _node(out) != ONEDNN_NODE
    assert _node(linear(layer, rows.unsqueeze(0), onednn=True)) != ONEDNN_NODE  # not 2-D
    assert linear(layer, rows[:0], onednn=True).shape == (0, 48)  # no rows
    double = nn.Linear(32, 48).double()
    assert linear(double, rows.double(), onednn=True).dtype == torch.float64

    class Doubled(nn.Linear):  # a subclass (LoRA-style wrappers) has its own forward: it must run
        def forward(self, x):
            return 2 * super().forward(x)

    doubled = Doubled(32, 48)
    doubled.load_state_dict(layer.state_dict())
    torch.testing.assert_close(linear(doubled, rows, onednn=True), 2 * layer(rows))
    calls = []
    for register in (layer.register_forward_hook, nn.modules.module.register_module_forward_hook):
        hook = register(lambda *unused: calls.append(1))  # hooks, the module's own or global ones, must fire
        try:
            linear(layer, rows, onednn=True)
        finally:
            hook.remove()
    assert calls == [1, 1]


def test_no_random_draws():
    """The trainer's dropout masks follow one random stream: neither the check nor the layer may draw from it."""
    layer, rows, upstream = _layer_and_rows()
    state = torch.get_rng_state()
    onednn_linear_available.cache_clear()
    available = onednn_linear_available()
    linear(layer, rows, onednn=available).backward(upstream)
    assert torch.equal(torch.get_rng_state(), state)


def test_auto_turns_it_on_for_amd_cpus_only(monkeypatch, caplog):
    monkeypatch.setattr(onednn_module, "onednn_linear_available", lambda: True)
    monkeypatch.setattr(onednn_module, "cpu_vendor", lambda: "AuthenticAMD")
    assert resolve_onednn_linear("auto", "cpu") is True
    assert resolve_onednn_linear("auto", "cuda") is False
    assert resolve_onednn_linear(False, "cpu") is False
    monkeypatch.setattr(onednn_module, "cpu_vendor", lambda: "GenuineIntel")  # MKL's own path: not measured
    assert resolve_onednn_linear("auto", "cpu") is False
    assert resolve_onednn_linear(True, "cpu") is True  # asked for explicitly
    monkeypatch.setattr(onednn_module, "cpu_vendor", lambda: None)  # not x86 Linux: unknown
    assert resolve_onednn_linear("auto", "cpu") is False
    monkeypatch.setattr(onednn_module, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(onednn_module, "onednn_linear_available", lambda: False)  # a torch without the op
    assert resolve_onednn_linear("auto", "cpu") is False
    with caplog.at_level(logging.WARNING, logger=onednn_module.__name__):
        assert resolve_onednn_linear(True, "cpu") is False
    assert "no usable oneDNN linear op" in caplog.text


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").is_file(), reason="reads x86 Linux's /proc/cpuinfo"
)
def test_cpu_vendor_reads_the_vendor_id():
    vendors = {line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("vendor_id")}  # fmt: skip
    assert cpu_vendor() in vendors and len(vendors) == 1


@needs_onednn
def test_the_benchmark_script_runs_at_a_small_size(data_dir):
    import subprocess
    import sys

    from train_helpers import REPO_ROOT, subprocess_env

    command = [sys.executable, str(REPO_ROOT / "scripts" / "benchmarks" / "bench_onednn_linear.py"), "--pairs", "1",
               "--rows", "16", "--layer-repeats", "2", "--data-dir", str(data_dir)]  # fmt: skip
    result = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "layers alone (16 rows, forward + backward): torch / oneDNN" in result.stdout
    assert "our forward + backward (1 pairs)" in result.stdout and "ahead in" in result.stdout
