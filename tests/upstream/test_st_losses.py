"""sentence-transformers' loss test files (``conftest.py`` says where they come from), loaded with this package's
classes bound to the names ``MultipleNegativesRankingLoss`` and ``CachedMultipleNegativesRankingLoss``: their test
functions and classes are collected here as ``<file>__<test>``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import sentence_transformers.sentence_transformer.losses as st_losses

from simcse_weince import CachedInfoNCELoss, CachedWeinceLoss, InfoNCELoss, WeinceLoss

FILES = ("test_cmnrl", "test_gradcache", "test_adaptive_layer", "test_matryoshka")  # tests/sentence_transformer/losses
LOSS = os.environ.get("SIMCSE_WEINCE_UPSTREAM_LOSS", "infonce")
BOUND = {"infonce": (InfoNCELoss, CachedInfoNCELoss), "weince": (WeinceLoss, CachedWeinceLoss)}
if LOSS not in BOUND:
    raise ValueError(f"SIMCSE_WEINCE_UPSTREAM_LOSS must be one of {sorted(BOUND)}, got {LOSS!r}")
st_losses.MultipleNegativesRankingLoss, st_losses.CachedMultipleNegativesRankingLoss = BOUND[LOSS]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


upstream = Path(os.environ["SIMCSE_WEINCE_UPSTREAM_TESTS"])  # conftest.py skips this file without it
# their helpers, under the module names their test files import them by
_load("tests.utils", upstream / "utils.py")
_load("tests.sentence_transformer.losses.utils", upstream / "sentence_transformer" / "losses" / "utils.py")
for stem in FILES:
    module = _load(f"upstream_{stem}", upstream / "sentence_transformer" / "losses" / f"{stem}.py")
    for attribute, value in vars(module).items():
        if attribute.startswith("test_") and callable(value):
            globals()[f"test_{stem.removeprefix('test_')}__{attribute}"] = value
        elif attribute.startswith("Test") and isinstance(value, type):
            globals()[f"Test_{stem.removeprefix('test_')}__{attribute}"] = value
        elif type(value).__name__ == "FixtureFunctionDefinition":  # the file's own fixtures, under their names
            globals()[attribute] = value
