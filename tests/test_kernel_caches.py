"""The CPU kernel caches that gain an entry for every new batch shape are bounded by every training run, before its
first kernel is built, and a capacity the user set is kept (simcse_weince/training/kernel_caches.py)."""

from __future__ import annotations

import os

from simcse_weince.text.config import preset
from simcse_weince.text.trainer import train
from simcse_weince.training.kernel_caches import KERNEL_CACHE_CAPACITY, KERNEL_CACHE_VARIABLES, bound_kernel_caches


def test_bound_kernel_caches_sets_the_capacity_and_keeps_the_users(monkeypatch):
    for name in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")
    assert bound_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(KERNEL_CACHE_CAPACITY),
                                     "LRU_CACHE_CAPACITY": "1024"}  # fmt: skip
    assert 40 <= KERNEL_CACHE_CAPACITY <= 1024  # above one step's kernels, below torch's default


def test_a_training_run_bounds_both_caches(monkeypatch, tiny_model_one_layer, train_file, tmp_path, one_thread):
    for name in KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    config = preset(
        "paper", model=tiny_model_one_layer, train_file=train_file, batch_size=8, max_length=16, max_steps=1,
        eval_steps=0, final_evaluation=False, save_steps=0, report_to=[], cpu=True, output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    train(config)
    assert {name: os.environ.get(name) for name in KERNEL_CACHE_VARIABLES} == dict.fromkeys(
        KERNEL_CACHE_VARIABLES, str(KERNEL_CACHE_CAPACITY)
    )
