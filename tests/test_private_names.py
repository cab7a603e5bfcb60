"""Private and unexported names of dependencies are used in one checked place (issue 55).

A dependency's private name can change in any release (transformers 5.25 broke the fast path's private mask
builder that way), so the package uses them only in ``simcse_weince/compat.py`` (each use checked by running, with
a fallback) and in the text trainer's fast path (``simcse_weince/text/fast_path/``, which checks itself at start-up).
This file reads every other module's syntax tree and fails on such a name, naming the file, the line and the name;
it shows the scan finds a planted use; and it runs every compat function on the installed versions and on a
dependency where the private name is gone (the fallback, or the one clear error).
"""

from __future__ import annotations

import ast
import functools
import logging
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from simcse_weince import compat

PACKAGE = "simcse_weince"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
#: where private names of dependencies may be used (each use checked there)
CHECKED_PLACES = ("simcse_weince/compat.py", "simcse_weince/text/fast_path/")
#: modules a dependency ships but does not export (their names are private though spelled without an underscore)
UNEXPORTED_MODULES = ("sentence_transformers.base.losses.merged_forward",)


def is_private(name: str) -> bool:
    """``_x``, not ``__x__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _checked(relative: str) -> bool:
    return relative == CHECKED_PLACES[0] or relative.startswith(CHECKED_PLACES[1])


def package_sources() -> dict[str, str]:
    """``"simcse_weince/..../x.py"`` -> source, every module of the package."""
    return {path.relative_to(ROOT.parent).as_posix(): path.read_text(encoding="utf-8") for path in ROOT.rglob("*.py")}


def own_names(sources: dict[str, str]) -> set[str]:
    """The names the package defines outside the checked places: functions, classes, module names, arguments,
    assigned variables and attributes (``self._last = ...``), import aliases."""
    names = set()
    for relative, source in sources.items():
        if _checked(relative):
            continue
        names.add(Path(relative).stem)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return names


def private_uses(relative: str, source: str, own: set[str]) -> list[str]:
    """``"file:line: name (how)"`` for each private or unexported name of a dependency that ``source`` uses:
    ``from dep import _x``, ``import dep._mod``, ``from dep._mod import ...``, an import of an unexported module,
    ``anything._x`` and a ``"_x"`` handed to a call (``getattr(module, "_x")``) where ``_x`` is not the package's
    own; none in the checked places."""
    if _checked(relative):
        return []
    found = []

    def report(node: ast.AST, name: str, how: str) -> None:
        found.append(f"{relative}:{node.lineno}: {name} ({how})")

    def module_is_private(module: str) -> bool:
        return any(is_private(part) for part in module.split(".")) or module.startswith(UNEXPORTED_MODULES)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.split(".")[0] != PACKAGE:
            if module_is_private(node.module):
                report(node, node.module, "import from a private or unexported module")
            for alias in node.names:
                if is_private(alias.name):
                    report(node, f"{node.module}.{alias.name}", "private name imported")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE and module_is_private(alias.name):
                    report(node, alias.name, "import of a private or unexported module")
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in own:
            report(node, ast.unparse(node), "private attribute")
        elif isinstance(node, ast.Call):
            for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
                if (
                    isinstance(argument, ast.Constant)
                    and isinstance(argument.value, str)
                    and re.fullmatch(r"_\w+", argument.value)
                    and is_private(argument.value)
                    and argument.value not in own
                ):
                    report(node, argument.value, "private name handed to a call")
    return found


@functools.cache
def _package() -> tuple[dict[str, str], set[str]]:
    """The package's sources and own names, read once per test session (copy the dict before changing it)."""
    sources = package_sources()
    return sources, own_names(sources)


def _scan() -> list[str]:
    sources, own = _package()
    return [use for relative, source in sorted(sources.items()) for use in private_uses(relative, source, own)]


def test_no_private_name_of_a_dependency_outside_the_checked_places():
    unexpected = _scan()
    assert not unexpected, (
        "private or unexported names of dependencies outside simcse_weince/compat.py and text/fast_path/ "
        "(move each into compat.py with a check that runs it and a fallback):\n" + "\n".join(unexpected)
    )


PLANTED = """
import numpy._core
from numpy._core import multiarray
from torch.cpu import _is_amx_tile_supported
from sentence_transformers.base.losses.merged_forward import embed_columns
from accelerate.state import AcceleratorState


def probe(np, parser, loss):
    loss._last  # the package's own attribute: fine
    parser.__dict__  # a dunder: fine
    AcceleratorState._reset_state()
    return getattr(np, "_core", None), parser._actions
"""


def test_the_scan_finds_a_planted_private_use_and_spares_own_names():
    """The scan is not vacuous: each kind of private use planted in a module is found, with its line; the same
    text in compat.py or the fast path is allowed; the package's own ``_last`` and a dunder are not reported."""
    own = _package()[1]
    assert "_last" in own and "_reset_state" not in own and "_actions" not in own
    found = private_uses("simcse_weince/planted.py", PLANTED, own)
    expected = [
        "simcse_weince/planted.py:2: numpy._core (import of a private or unexported module)",
        "simcse_weince/planted.py:3: numpy._core (import from a private or unexported module)",
        "simcse_weince/planted.py:4: torch.cpu._is_amx_tile_supported (private name imported)",
        "simcse_weince/planted.py:5: sentence_transformers.base.losses.merged_forward (import from a private or "
        "unexported module)",
        "simcse_weince/planted.py:12: AcceleratorState._reset_state (private attribute)",
        "simcse_weince/planted.py:13: _core (private name handed to a call)",
        "simcse_weince/planted.py:13: parser._actions (private attribute)",
    ]
    assert sorted(found) == sorted(expected)
    assert private_uses("simcse_weince/compat.py", PLANTED, own) == []
    assert private_uses("simcse_weince/text/fast_path/unpadded.py", PLANTED, own) == []


def test_a_private_call_put_back_into_a_real_module_is_found():
    """precision.py's CPU probe re-inlined (as it was before compat.py): the scan names the file and the line."""
    sources = dict(_package()[0])
    relative = "simcse_weince/precision.py"
    original = "return compat.cpu_has_amx_tiles()"
    assert sources[relative].count(original) == 1
    sources[relative] = sources[relative].replace(original, "return torch.cpu._is_amx_tile_supported()")
    line = 1 + sources[relative][: sources[relative].index("torch.cpu._is_amx")].count("\n")
    found = private_uses(relative, sources[relative], own_names(sources))
    assert found == [f"{relative}:{line}: torch.cpu._is_amx_tile_supported (private attribute)"]


# ------------------------------------------------------------------ every compat use, and where it is gone


@pytest.fixture
def fresh_compat():
    """compat's once-a-process results (the merged-forward check, the warnings given) cleared before and after."""
    compat._checked_embed_columns.cache_clear()
    compat._warned.clear()
    yield compat
    compat._checked_embed_columns.cache_clear()
    compat._warned.clear()


def test_versions_name_the_installed_and_the_checked_release():
    for distribution, checked in compat.CHECKED_ON.items():
        line = compat.versions(distribution)
        assert line.startswith(f"{distribution} ") and line.endswith(f"(checked on {checked})"), line
        assert "not installed" not in line


@pytest.mark.parametrize(
    ("function", "private"),
    [
        ("cpu_has_avx512_bf16", "_is_avx512_bf16_supported"),
        ("cpu_has_amx_tiles", "_is_amx_tile_supported"),
    ],
)
def test_cpu_probes_answer_torch_and_fall_back_to_no(fresh_compat, monkeypatch, caplog, function, private):
    probe = getattr(fresh_compat, function)
    if hasattr(torch.cpu, private):  # the installed torch: its own answer, no warning
        assert probe() is getattr(torch.cpu, private)()
        assert not caplog.records
    monkeypatch.setattr(torch.cpu, private, lambda: True)
    assert probe() is True
    for broken in (None, lambda: "yes", lambda: 1 / 0):  # gone, a non-bool answer, a probe that raises
        fresh_compat._warned.clear()
        if broken is None:
            monkeypatch.delattr(torch.cpu, private)
        else:
            monkeypatch.setattr(torch.cpu, private, broken, raising=False)
        with caplog.at_level(logging.WARNING, logger="simcse_weince.compat"):
            caplog.clear()
            assert probe() is False and probe() is False
        assert len(caplog.records) == 1, "one warning, not one per call"
        assert f"torch.cpu.{private}" in caplog.text and compat.versions("torch") in caplog.text


def test_accelerate_reset_clears_the_state_and_fails_clearly_without_it(monkeypatch):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, is_initialized

    compat.reset_accelerate_state(reset_partial_state=True)
    Accelerator(cpu=True, mixed_precision="no")
    assert is_initialized()
    compat.reset_accelerate_state(reset_partial_state=True)
    assert not is_initialized()
    assert Accelerator(cpu=True, mixed_precision="bf16").mixed_precision == "bf16"  # the new settings are taken

    # the private name gone: nothing to do when no state is set, one clear error when one is
    monkeypatch.delattr(AcceleratorState, "_reset_state")
    assert is_initialized()
    with pytest.raises(RuntimeError, match=re.escape(compat.versions("accelerate")) + ".*in a new process"):
        compat.reset_accelerate_state(reset_partial_state=True)
    monkeypatch.undo()
    compat.reset_accelerate_state(reset_partial_state=True)
    monkeypatch.delattr(AcceleratorState, "_reset_state")
    monkeypatch.delattr(GradientState, "_reset_state")
    compat.reset_accelerate_state(reset_partial_state=True)  # no state set: no error
    monkeypatch.undo()
    compat.reset_accelerate_state(reset_partial_state=True)


def _columns(widths=((3, 2), (4, 1))):
    """Per-column features of a tiny model: rows of the given real lengths, right-padded per column."""
    features = []
    for column, lengths in enumerate(widths):
        ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.arange(1, length + 1) + column + row
        features.append({"input_ids": ids, "attention_mask": (ids > 0).long()})
    return features


class TinyEncoder(torch.nn.Module):
    """Deterministic features -> ``sentence_embedding`` (masked mean of an embedding table), as a
    SentenceTransformer answers; counts its forwards."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.linspace(-2.0, 2.0, 16 * 4).reshape(16, 4))
        self.forwards = 0

    def forward(self, features):
        self.forwards += 1
        mask = features["attention_mask"].unsqueeze(-1).float()
        return {"sentence_embedding": (self.table[features["input_ids"]] * mask).sum(1) / mask.sum(1)}


def test_embed_columns_merges_on_the_installed_release_and_falls_back_per_column(fresh_compat, monkeypatch, caplog):
    import sentence_transformers.base.losses.merged_forward as merged_forward

    expected = [TinyEncoder()(features)["sentence_embedding"] for features in _columns(((3, 2), (4, 1), (2, 2)))]

    def embed(separate_first):
        encoder = TinyEncoder()
        got = fresh_compat.embed_columns(encoder, _columns(((3, 2), (4, 1), (2, 2))), separate_first=separate_first)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)
        return encoder.forwards

    # the installed sentence-transformers passes the check: candidates merged into one forward
    with caplog.at_level(logging.WARNING, logger="simcse_weince.compat"):
        assert embed(separate_first=True) == 2 and embed(separate_first=False) == 1
    assert not caplog.records
    assert fresh_compat.check_embed_columns(merged_forward.embed_columns) is None

    # a release whose function gives wrong rows, or has gone: the check says so, every call takes one forward per
    # column, one warning names the versions
    wrong = lambda model, features, separate_first=True: [model(f)["sentence_embedding"] * 2 for f in features]  # noqa: E731
    assert "embeddings differ" in fresh_compat.check_embed_columns(wrong)
    for broken in (wrong, None):
        fresh_compat._checked_embed_columns.cache_clear()
        fresh_compat._warned.clear()
        if broken is None:
            monkeypatch.delattr(merged_forward, "embed_columns")
        else:
            monkeypatch.setattr(merged_forward, "embed_columns", broken)
        with caplog.at_level(logging.WARNING, logger="simcse_weince.compat"):
            caplog.clear()
            assert embed(separate_first=True) == 3 and embed(separate_first=False) == 3
        assert len(caplog.records) == 1 and compat.versions("sentence-transformers") in caplog.text


def test_the_loss_takes_the_checked_merged_forward(fresh_compat, monkeypatch):
    """WeinceLoss's one-column (SimCSE) forward goes through compat's embed_columns: the duplicated column as one
    forward of 2N rows; with the private function gone, two forwards and the same loss (no dropout here)."""
    import sentence_transformers.base.losses.merged_forward as merged_forward

    from simcse_weince import WeinceLoss

    encoder = TinyEncoder()
    loss = WeinceLoss(encoder)
    features = _columns(((3, 2, 4, 1),))
    merged = loss([dict(features[0])])
    assert encoder.forwards == 1
    monkeypatch.delattr(merged_forward, "embed_columns")
    fresh_compat._checked_embed_columns.cache_clear()
    per_column = loss([dict(features[0])])
    assert encoder.forwards == 3
    torch.testing.assert_close(per_column, merged)


def test_numpy_pickle_globals_round_trip_and_fall_back_to_refusing(fresh_compat, monkeypatch, caplog, tmp_path):
    from simcse_weince import safe_load

    names = fresh_compat.numpy_pickle_globals()
    assert sorted(names) == sorted(
        f"numpy.{spelling}.{name}"
        for spelling in ("core", "_core")
        for name in ("multiarray._reconstruct", "multiarray.scalar", "numeric._frombuffer")
    )
    assert all(safe_load.ALLOWED[name] is value for name, value in names.items())
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for protocol in (2, 5):  # the allow-list reader builds what this numpy writes
        (tmp_path / "batch").write_bytes(pickle.dumps({"data": array, "label": np.int64(3)}, protocol=protocol))
        loaded = safe_load.load_pickle(tmp_path / "batch")
        np.testing.assert_array_equal(loaded["data"], array)
        assert loaded["label"] == 3

    # a numpy without one of the internals: one warning naming the versions, nothing allowed (files are refused)
    core = getattr(np, "_core", None) or np.core
    monkeypatch.delattr(core.numeric, "_frombuffer")
    with caplog.at_level(logging.WARNING, logger="simcse_weince.compat"):
        assert fresh_compat.numpy_pickle_globals() == {}
    assert "_frombuffer" in caplog.text and compat.versions("numpy") in caplog.text
    monkeypatch.undo()
    # a round trip that does not give the array back is caught too
    assert "protocol 2" in fresh_compat._numpy_round_trip_failure({})
