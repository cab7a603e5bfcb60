"""Moving the trainers onto the shared training core changed no computation: 5 steps of ``cpu-demo`` and 5 steps of
``vision --dataset digits`` give the per-step losses recorded before the move (``tests/data/step_losses.json``,
written by ``scripts/record_step_losses.py`` at the commit it names), with the same flags as that script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDED = json.loads((REPO / "tests" / "data" / "step_losses.json").read_text())
sys.path.insert(0, str(REPO / "scripts"))
import record_step_losses  # noqa: E402 - the script that recorded them: the same flags


def _rows(tmp_path, monkeypatch, name: str, args: list[str]) -> list[float]:
    from simcse_weince.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*args, "--output-dir", str(tmp_path / name)]) == 0
    return record_step_losses._read_losses(tmp_path / name)


def test_five_cpu_demo_steps_give_the_recorded_losses(tmp_path, monkeypatch, data_dir):
    args = ["train", *record_step_losses.TEXT_ARGS, "--data-dir", str(data_dir)]
    losses = _rows(tmp_path, monkeypatch, "text", args)
    # the first loss is ~1e-3 and the next ones ~1e-6 (mean pooling of a model trained for similarity): relative
    # agreement on all of them; on this CPU they are bit-identical
    assert losses == pytest.approx(RECORDED["cpu-demo"], rel=1e-5, abs=1e-9)


def test_five_digits_steps_give_the_recorded_losses(tmp_path, monkeypatch):
    pytest.importorskip("torchvision")
    args = ["vision", "train", *record_step_losses.VISION_ARGS, *record_step_losses.VISION_LOG_EVERY]
    losses = _rows(tmp_path, monkeypatch, "vision", args)
    assert losses == pytest.approx(RECORDED["digits"], rel=1e-5)
