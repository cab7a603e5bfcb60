"""--mixed-precision auto: bf16 where the device computes it natively, fp32 elsewhere; what a run records, and
evaluation in fp32 unless asked otherwise."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from simcse_weince import precision
from simcse_weince.precision import native_bf16, resolve_mixed_precision
from simcse_weince.settings import apply_overrides
from simcse_weince.text.config import TrainConfig, preset, resolve_eval_bf16
from simcse_weince.text.fast_path.onednn_linear import resolve_onednn_linear
from simcse_weince.text.trainer import train

TRAIN_LINES = 100  # the train_file fixture's sentences (conftest.py)


# ------------------------------------------------------------------------------------------- the rule


def _cpu_probes(monkeypatch, avx512_bf16, amx):
    for name, answer in (("_is_avx512_bf16_supported", avx512_bf16), ("_is_amx_tile_supported", amx)):
        if answer is None:
            monkeypatch.delattr(torch.cpu, name, raising=False)
        elif isinstance(answer, Exception):

            def probe(error=answer):
                raise error

            monkeypatch.setattr(torch.cpu, name, probe, raising=False)
        else:
            monkeypatch.setattr(torch.cpu, name, lambda answer=answer: answer, raising=False)


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"),
    [
        (True, False, "bf16"),
        (False, True, "bf16"),
        (False, False, "no"),
        (None, None, "no"),  # a torch without the private probes: not known to be native
        (RuntimeError("cpuinfo failed"), False, "no"),  # a probe that fails counts as absent
        (RuntimeError("cpuinfo failed"), True, "bf16"),
    ],
)
def test_auto_on_the_cpu_follows_the_cpu_features(monkeypatch, avx512_bf16, amx, expected):
    _cpu_probes(monkeypatch, avx512_bf16, amx)
    assert resolve_mixed_precision("auto", "cpu") == expected
    for explicit in ("no", "bf16"):  # an explicit choice is never second-guessed
        assert resolve_mixed_precision(explicit, "cpu") == explicit


def test_auto_on_cuda_needs_native_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return not including_emulation  # emulated bf16 must not count

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert resolve_mixed_precision("auto", "cuda") == "no"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert resolve_mixed_precision("auto", "cuda") == "bf16" and calls == [False]
    assert resolve_mixed_precision("fp16", "cuda") == "fp16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not native_bf16("cuda")
    assert not native_bf16("mps")  # other accelerators stay in fp32 under auto


def test_bad_precisions_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="fp16 needs a GPU; on the CPU use --mixed-precision bf16"):
        resolve_mixed_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="mixed_precision must be one of auto, no, fp16, bf16, got 'fp8'"):
        resolve_mixed_precision("fp8", "cpu")
    with pytest.raises(ValueError, match="mixed_precision must be one of auto, no, fp16, bf16"):
        preset("cpu-demo", mixed_precision="bf32")
    assert preset("cpu-demo").mixed_precision == "auto" and preset("paper").mixed_precision == "auto"


# -------------------------------------------------------------------------------------- what a run does


class EncoderDtypes:
    """The dtypes the encoder's linear layers compute in (their outputs), split by mode: training steps vs
    evaluation encodes. Under bf16 autocast the matmuls give bf16; LayerNorm outputs stay float32 either way."""

    def __init__(self):
        self.training: set[torch.dtype] = set()
        self.evaluation: set[torch.dtype] = set()
        self.paused = False  # during the fast path's start-up check (fp32, eval mode), which is not evaluation

    def __call__(self, module, args, output):
        if isinstance(module, torch.nn.Linear) and not self.paused:
            (self.training if module.training else self.evaluation).add(output.dtype)

    def __enter__(self):
        self.handle = torch.nn.modules.module.register_module_forward_hook(self)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def _run(tiny_model, train_file, output_dir: Path, monkeypatch, **overrides):
    from simcse_weince.text import fast_path
    from simcse_weince.text import trainer as text_trainer

    def unrecorded(module, name):
        """The start-up checks (the fast path's, and that dropout makes two views) are not training."""
        check = getattr(module, name)

        def paused_check(*args, **kwargs):
            dtypes.paused = True
            try:
                return check(*args, **kwargs)
            finally:
                dtypes.paused = False

        monkeypatch.setattr(module, name, paused_check)

    unrecorded(fast_path, "check_training_forward")
    unrecorded(text_trainer, "check_views_differ")
    config = preset(
        "paper", model=tiny_model, train_file=train_file, pooler="avg", batch_size=16, max_steps=2, eval_steps=2,
        save_steps=0, eval_max_length=32, final_tasks=["stsb"], report_to=["csv"], output_dir=str(output_dir),
        **overrides,
    )  # fmt: skip
    with EncoderDtypes() as dtypes:
        results = train(config)
    return results, dtypes


def test_the_default_trains_in_the_native_precision_and_says_so(tiny_model, train_file, tmp_path, caplog, monkeypatch):
    used = resolve_mixed_precision("auto", "cpu")  # bf16 on a CPU with AVX512-BF16 or AMX (this project's CI)
    with caplog.at_level(logging.INFO, logger="simcse_weince"):  # the trainer logs; the CLI prints it
        results, dtypes = _run(tiny_model, train_file, tmp_path / "auto", monkeypatch)
    assert results["config"]["mixed_precision"] == "auto" and results["mixed_precision"] == used
    assert json.loads((tmp_path / "auto" / "results.json").read_text())["mixed_precision"] == used
    expected = torch.bfloat16 if used == "bf16" else torch.float32
    assert dtypes.training == {expected}
    # eval_bf16 auto: evaluation follows a bf16 run on the CPU (a task moves by <= 0.01), else stays fp32
    assert dtypes.evaluation == {expected}
    assert results["evaluation_precision"] == label_of(expected)
    label = precision.precision_label(used)
    assert f"{label} (mixed precision auto)" in caplog.text
    card = (tmp_path / "auto" / "README.md").read_text()
    assert f"precision `{label}` (chosen by `--mixed-precision auto`)" in card


def label_of(dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def test_eval_bf16_auto_follows_a_bf16_run_on_the_cpu_only():
    assert resolve_eval_bf16("auto", "bf16", "cpu") is True
    assert resolve_eval_bf16("auto", "no", "cpu") is False
    assert resolve_eval_bf16("auto", "bf16", "cuda") is False  # a GPU evaluates in fp32, where it costs little
    assert resolve_eval_bf16("auto", "fp16", "cuda") is False
    assert resolve_eval_bf16(False, "bf16", "cpu") is False and resolve_eval_bf16(True, "no", "cuda") is True
    with pytest.raises(ValueError, match="eval_bf16"):
        apply_overrides(TrainConfig(), {"eval_bf16": "sometimes"})


@pytest.mark.skipif(resolve_mixed_precision("auto", "cpu") != "bf16", reason="needs a CPU with native bf16")
def test_a_bf16_run_evaluates_in_fp32_when_asked(tiny_model, train_file, tmp_path, monkeypatch):
    results, dtypes = _run(tiny_model, train_file, tmp_path / "bf16-fp32", monkeypatch, eval_bf16=False)
    assert dtypes.training == {torch.bfloat16} and dtypes.evaluation == {torch.float32}
    assert results["evaluation_precision"] == "fp32"


def test_no_trains_in_fp32_and_eval_bf16_evaluates_in_bf16(tiny_model, train_file, tmp_path, monkeypatch):
    results, dtypes = _run(tiny_model, train_file, tmp_path / "fp32", monkeypatch, mixed_precision="no")
    assert results["mixed_precision"] == "no" and results["evaluation_precision"] == "fp32"
    assert dtypes.training == {torch.float32} and dtypes.evaluation == {torch.float32}
    card = (tmp_path / "fp32" / "README.md").read_text()
    assert "precision `fp32`" in card and "bf16 autocast" not in card
    # fp32 steps of the unpadded forward: oneDNN's linear layers where auto says so (AMD CPUs)
    assert results["unpadded_layers"] and results["onednn_linear"] is resolve_onednn_linear("auto", "cpu")

    results, dtypes = _run(
        tiny_model,
        train_file,
        tmp_path / "eval-bf16",
        monkeypatch,
        mixed_precision="no",
        eval_bf16=True,
        onednn_linear=False,
    )
    assert results["evaluation_precision"] == "bf16" and results["onednn_linear"] is False  # turned off
    assert dtypes.training == {torch.float32} and dtypes.evaluation == {torch.bfloat16}
    assert "encoded under bf16 autocast" in (tmp_path / "eval-bf16" / "README.md").read_text()  # the card says so
