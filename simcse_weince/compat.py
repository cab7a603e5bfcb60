"""Every use of a private or unexported name of a dependency, in one place, each checked by running.

A private name (``torch.cpu._is_amx_tile_supported``, ``AcceleratorState._reset_state``) or a module a library
does not export (sentence-transformers' ``merged_forward``) can change in any release without notice: transformers
5.25 broke the fast path's private mask builder that way. So the package reaches below a dependency's public API
only here and in the text trainer's fast path (:mod:`simcse_weince.text.fast_path`, which checks itself at
start-up); ``tests/test_private_names.py`` fails on such a name anywhere else.

Each function below is one use. Where it is first needed it runs the private name and checks the answer (against
the public API's where there is one); on a release where that fails it falls back to a public path or a safe
default with one warning, or raises one error, naming the installed version and the one it was checked on
(:data:`CHECKED_ON`):

- :func:`cpu_has_avx512_bf16`, :func:`cpu_has_amx_tiles`: ``torch.cpu._is_avx512_bf16_supported``,
  ``torch.cpu._is_amx_tile_supported``; where they fail: "no" (``--mixed-precision auto`` stays in fp32);
- :func:`reset_accelerate_state`: ``AcceleratorState._reset_state``, ``GradientState._reset_state``; where they
  fail: one error, and only for a second run in the same process;
- :func:`embed_columns`: ``sentence_transformers.base.losses.merged_forward.embed_columns``; where it fails: one
  forward per column (the public path);
- :func:`numpy_pickle_globals`: ``numpy._core`` (``numpy.core``) ``multiarray._reconstruct``, ``multiarray.scalar``,
  ``numeric._frombuffer``; where they fail: pickles holding numpy arrays are refused.

This module is the bottom layer: it imports nothing of the package, and its dependencies only where a function
runs (``simcse-weince --help`` must not wait for torch).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import pickle

logger = logging.getLogger(__name__)

#: the release of each dependency the uses below were checked on by running (``tests/test_private_names.py``); CI
#: runs the same tests at the declared floors too (docs/install.md)
CHECKED_ON = {"torch": "2.14.1", "accelerate": "1.16.0", "sentence-transformers": "6.3.0", "numpy": "2.4.6"}

_warned: set[str] = set()


def versions(distribution: str) -> str:
    """``"torch 2.15.0 (checked on 2.14.1)"``: the installed release of ``distribution`` and the one checked."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = "not installed"
    return f"{distribution} {installed} (checked on {CHECKED_ON[distribution]})"


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


# ------------------------------------------------------------------------------ torch: the CPU's bf16 features


def _torch_cpu_probe(name: str) -> bool:
    """``torch.cpu.<name>()``, checked: it must exist and answer a bool; anything else counts as False."""
    import torch

    probe = getattr(torch.cpu, name, None)
    try:
        answer = probe() if probe is not None else None
    except Exception as error:  # noqa: BLE001 - a probe that cannot answer means "not known to be there"
        answer = error
    if isinstance(answer, bool):
        return answer
    _warn_once(
        name,
        "torch.cpu.%s %s on %s; this CPU counts as without the feature (--mixed-precision auto stays in fp32)",
        name, "is missing" if probe is None else f"answered {answer!r}", versions("torch"),
    )  # fmt: skip
    return False


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU computes bf16 natively with AVX512-BF16 (Intel Cooper Lake and later, AMD Zen 4 and later).

    Private name: ``torch.cpu._is_avx512_bf16_supported()`` (torch has no public query). Checked on torch 2.14.1
    (:data:`CHECKED_ON`). Checked by running, on every call (it costs microseconds): the probe is called and must
    answer a bool. Falls back to False, the safe default (``--mixed-precision auto`` then trains in fp32; emulated
    bf16 is far slower), with one warning naming the versions, where the probe is missing, raises, or answers
    anything but a bool.
    """
    return _torch_cpu_probe("_is_avx512_bf16_supported")


def cpu_has_amx_tiles() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later), whose bf16 matmuls are fastest.

    Private name: ``torch.cpu._is_amx_tile_supported()``. Checked on torch 2.14.1; checked and falling back as
    :func:`cpu_has_avx512_bf16` (False: "no AMX").
    """
    return _torch_cpu_probe("_is_amx_tile_supported")


# -------------------------------------------------------------------- Accelerate: the process-wide singletons


def reset_accelerate_state(*, reset_partial_state: bool) -> None:
    """Clear Accelerate's process-wide state (``AcceleratorState``, ``GradientState``, and with
    ``reset_partial_state`` the ``PartialState``, which holds a launched job's process group), so that the next
    ``Accelerator`` of this process takes its own settings (mixed precision, cpu) instead of refusing them.

    Private names: ``AcceleratorState._reset_state(reset_partial_state=...)`` and ``GradientState._reset_state()``
    (Accelerate's own tests use them; there is no public reset). Checked on Accelerate 1.16.0. Checked by running,
    on every call: afterwards Accelerate's public ``accelerate.state.is_initialized()`` must say False. Where the
    names are missing or the state stays set: nothing to do when no state was set yet (the first run of a
    process); otherwise one ``RuntimeError`` naming the versions (run each training in its own process).
    """
    from accelerate.state import AcceleratorState, GradientState, is_initialized

    try:
        AcceleratorState._reset_state(reset_partial_state=reset_partial_state)
        GradientState._reset_state()
        failure = "the state stays set after it" if is_initialized() else None
    except (AttributeError, TypeError) as error:
        failure = f"{type(error).__name__}: {error}"
    if failure is not None and is_initialized():
        raise RuntimeError(
            f"cannot start this run from a clean Accelerate state: AcceleratorState._reset_state failed "
            f"({failure}) on {versions('accelerate')}; an earlier run's settings are still set in this process, "
            f"so start this run in a new process"
        )


# ------------------------------------------------------------ sentence-transformers: merged column forwards


def _per_column(model, features_list) -> list:
    """The public path: one ``model(features)["sentence_embedding"]`` per column, as sentence-transformers'
    classic losses do."""
    return [model(features)["sentence_embedding"] for features in features_list]


def embed_columns(model, features_list: list[dict], *, separate_first: bool = True) -> list:
    """One ``sentence_embedding`` tensor per column (a list of feature dicts), through sentence-transformers'
    merged forward: columns that tokenize alike go through ``model`` as one batch (with ``separate_first`` the
    first column keeps its own forward). Values and gradients are those of one forward per column; dropout draws
    differ, as from any other batch.

    Private name: ``sentence_transformers.base.losses.merged_forward.embed_columns``, a module that
    sentence-transformers 6.3 does not export. Checked on sentence-transformers 6.3.0. Checked by running, once
    a process, where first called: on a tiny deterministic encoder (an embedding table, masked mean) and columns
    of different widths, with ``separate_first`` on and off, its embeddings and the table's gradient must equal
    the per-column public path's (float64, ``allclose`` at 1e-12). On an import error, another signature or a
    mismatch: one warning naming the versions, and every call takes the public per-column path
    (``model(features)["sentence_embedding"]`` per column; a duplicated SimCSE column then runs as two forwards
    of N rows instead of one of 2N).
    """
    merged = _checked_embed_columns()
    if merged is None:
        return _per_column(model, features_list)
    return merged(model, features_list, separate_first=separate_first)


@functools.cache
def _checked_embed_columns():
    """sentence-transformers' ``embed_columns`` if it passes :func:`check_embed_columns`, else None (warned)."""
    try:
        from sentence_transformers.base.losses.merged_forward import embed_columns as merged

        failure = check_embed_columns(merged)
    except Exception as error:  # noqa: BLE001 - any failure of the private function means: take the public path
        merged, failure = None, f"{type(error).__name__}: {error}"
    if failure is None:
        return merged
    _warn_once(
        "embed_columns",
        "sentence-transformers' merged column forward (merged_forward.embed_columns) failed its check on %s (%s); "
        "each column is embedded in its own forward instead (same loss and gradients)",
        versions("sentence-transformers"), failure,
    )  # fmt: skip
    return None


def check_embed_columns(merged) -> str | None:
    """None when ``merged`` (an ``embed_columns``) agrees with the per-column path on a tiny encoder, else what
    differs. Draws no random numbers (the run's random state is untouched)."""
    import torch

    # the first call may come under no_grad, inference mode or autocast (an evaluation of the loss): the check
    # needs none of them
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
        encoder = _tiny_column_encoder()
        columns = [
            {"input_ids": torch.tensor(ids), "attention_mask": (torch.tensor(ids) > 0).long()}
            for ids in ([[1, 2, 0], [3, 0, 0]], [[4, 5, 6, 7], [2, 8, 0, 0]], [[9, 0], [5, 6]])
        ]
        for features_list, separate_first in ((columns, True), (columns, False), ([columns[0], columns[0]], False)):
            got = merged(encoder, [dict(features) for features in features_list], separate_first=separate_first)
            got_gradient = _table_gradient(encoder, got)
            expected = _per_column(encoder, [dict(features) for features in features_list])
            expected_gradient = _table_gradient(encoder, expected)
            if len(got) != len(expected) or any(
                a.shape != b.shape or not torch.allclose(a, b, rtol=1e-12, atol=1e-12) for a, b in zip(got, expected)
            ):
                return f"embeddings differ from the per-column forward ({len(features_list)} columns)"
            if not torch.allclose(got_gradient, expected_gradient, rtol=1e-12, atol=1e-12):
                return f"gradients differ from the per-column forward ({len(features_list)} columns)"
    return None


def _table_gradient(encoder, embeddings):
    """The embedding table's gradient of a fixed weighted sum of ``embeddings`` (one weight per column)."""
    encoder.table.grad = None
    sum(float(index + 1) * column.sum() for index, column in enumerate(embeddings)).backward()
    return encoder.table.grad.clone()


def _tiny_column_encoder():
    """A deterministic stand-in for a SentenceTransformer in :func:`check_embed_columns`: features dict ->
    ``{"sentence_embedding": masked mean of a fixed float64 embedding table}`` (no random numbers drawn)."""
    import torch
    from torch import nn

    class TinyColumnEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.linspace(-1.0, 1.0, 10 * 3, dtype=torch.float64).reshape(10, 3))

        def forward(self, features: dict) -> dict:
            mask = features["attention_mask"].unsqueeze(-1).to(self.table.dtype)
            rows = (self.table[features["input_ids"]] * mask).sum(dim=1) / mask.sum(dim=1)
            return {**features, "sentence_embedding": rows}

    return TinyColumnEncoder()


# --------------------------------------------------------------------------- numpy: what its pickles name


def numpy_pickle_globals() -> dict:
    """``"module.name"`` -> object for the numpy internals a pickle of numpy arrays and scalars names:
    ``multiarray._reconstruct`` and ``multiarray.scalar`` (every protocol), ``numeric._frombuffer`` (protocol 5),
    each under numpy 2's ``numpy._core`` and numpy 1's ``numpy.core`` spelling (files written by either).
    :mod:`simcse_weince.safe_load` adds them to its allow-list of what a file may build.

    Private names: ``numpy._core`` (``numpy.core`` before numpy 2) and its ``_reconstruct``, ``scalar``,
    ``_frombuffer``. Checked on numpy 2.4.6. Checked by running, once a process, where the allow-list is built:
    a float32 array, an int64 array and a numpy scalar pickled by this numpy (protocols 2 and 5) must load back
    equal through an unpickler that builds only these names, ``numpy.ndarray``, ``numpy.dtype`` and
    ``codecs.encode``. Where a name is missing or the round trip fails: one warning naming the versions, and an
    empty dict (the safe default: a pickle holding numpy arrays is then refused unread, never built another way).
    """
    import numpy as np

    try:
        core = getattr(np, "_core", None) or np.core
        found = {
            "multiarray._reconstruct": core.multiarray._reconstruct,
            "multiarray.scalar": core.multiarray.scalar,
            "numeric._frombuffer": core.numeric._frombuffer,  # pickle protocol 5
        }
        names = {f"numpy.{spelling}.{name}": value for spelling in ("core", "_core") for name, value in found.items()}
        failure = _numpy_round_trip_failure(names)
    except (AttributeError, ImportError) as error:
        names, failure = {}, f"{type(error).__name__}: {error}"
    if failure is None:
        return names
    _warn_once(
        "numpy_pickle_globals",
        "numpy's pickle internals failed their check on %s (%s); pickles holding numpy arrays will be refused",
        versions("numpy"), failure,
    )  # fmt: skip
    return {}


def _numpy_round_trip_failure(names: dict) -> str | None:
    import codecs
    import io

    import numpy as np

    # protocol 2 spells an array's bytes through codecs.encode, which safe_load allows too
    allowed = {**names, "numpy.ndarray": np.ndarray, "numpy.dtype": np.dtype, "_codecs.encode": codecs.encode}

    class OnlyThese(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if f"{module}.{name}" not in allowed:
                raise pickle.UnpicklingError(f"{module}.{name} is not among the checked names")
            return allowed[f"{module}.{name}"]

    samples = (np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(3, dtype=np.int64), np.float64(1.5))
    for protocol in (2, 5):
        for sample in samples:
            try:
                loaded = OnlyThese(io.BytesIO(pickle.dumps(sample, protocol=protocol))).load()
            except pickle.UnpicklingError as error:
                return f"protocol {protocol}: {error}"
            if type(loaded) is not type(sample) or not np.array_equal(loaded, sample) or (
                    np.asarray(loaded).dtype != np.asarray(sample).dtype):  # fmt: skip
                return f"protocol {protocol}: a {type(sample).__name__} loaded back as {loaded!r}"
    return None
