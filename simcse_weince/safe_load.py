"""The one reader of pickle-format files: checkpoints, RNG states and data batches never run code from a file.

Unpickling a file can run any code it names (a pickle is a small program). Every pickle-format file the project
opens comes here and nowhere else (``tests/test_checkpoint_trust.py`` checks that no other module calls
``pickle.load`` or ``torch.load``):

- :func:`load_tensors`: files written by ``torch.save`` (checkpoint weights, optimizer states, Accelerate's RNG
  states) through ``torch.load(weights_only=True)`` with :data:`ALLOWED` added;
- :func:`load_pickle`: plain pickles (ImageNet-32's data batches) through an unpickler that builds only
  :data:`ALLOWED` and Python's own containers and scalars.

Anything else in a file raises :class:`RefusedPickle` (a ``pickle.UnpicklingError``) before it is built; its
message names the file and the refused name, and never suggests loading it unsafely (:func:`refusal`).
"""

from __future__ import annotations

import codecs
import contextlib
import pickle
import re
from pathlib import Path

import numpy as np
import torch

from simcse_weince.compat import numpy_pickle_globals

#: ``module.name`` -> the object a file may build: numpy arrays, dtypes and scalars (numpy's internals, numpy 1 and
#: 2 spellings, checked by :func:`~simcse_weince.compat.numpy_pickle_globals`), and ``codecs.encode`` (how Python 2
#: pickles of numpy arrays spell their bytes)
ALLOWED = {
    **numpy_pickle_globals(),
    "numpy.ndarray": np.ndarray,
    "numpy.dtype": np.dtype,
    "_codecs.encode": codecs.encode,
    "codecs.encode": codecs.encode,
}
if hasattr(np, "dtypes"):  # numpy >= 1.25 pickles some dtypes by their class
    ALLOWED.update({f"numpy.dtypes.{name}": getattr(np.dtypes, name) for name in dir(np.dtypes)
                    if name.endswith("DType")})  # fmt: skip


class RefusedPickle(pickle.UnpicklingError, ValueError):
    """A pickle-format file asked to build something outside :data:`ALLOWED`; nothing of it was built (a
    ``ValueError`` too: the command line shows its message as one ``error:`` line, as for any bad input)."""


def load_tensors(path: Path, mmap: bool = False):
    """``torch.load`` of a ``torch.save`` file that never runs code from it (tensors, containers, numbers,
    strings, numpy arrays); anything else raises :class:`RefusedPickle`."""
    allowed = list(dict.fromkeys(ALLOWED.values()))
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):
            raise
        raise RefusedPickle(refusal(path, refused_global(error))) from None


class _AllowListUnpickler(pickle.Unpickler):
    def __init__(self, handle, path: Path, **options):
        super().__init__(handle, **options)
        self._path = path

    def find_class(self, module: str, name: str):
        found = ALLOWED.get(f"{module}.{name}")
        if found is None:
            raise RefusedPickle(refusal(self._path, f"{module}.{name}"))
        return found

    def persistent_load(self, pid):
        raise RefusedPickle(refusal(self._path, "a persistent reference"))


def load_pickle(path: Path, encoding: str = "ASCII"):
    """A plain pickle file, building only :data:`ALLOWED` objects and Python's containers and scalars.
    ``encoding`` as :func:`pickle.load` (``"latin1"`` for Python 2 pickles of numpy arrays)."""
    path = Path(path)
    with open(path, "rb") as handle:
        return _AllowListUnpickler(handle, path, encoding=encoding).load()


def refusal(path: Path, what: str | None) -> str:
    """The message of a refused file: what it holds, that nothing ran, and what to do (never: load it anyway)."""
    held = f" ({what})" if what else ""
    return (
        f"{path} holds a pickled Python object{held} besides tensors and plain data; it was refused unread, so "
        f"nothing in it ran (unpickling a file from elsewhere can run code). Use a file from a source you trust "
        f"in a format without code (safetensors, .npz)"
    )


def is_refused(error: BaseException) -> bool:
    """True for a file refused by this module or by ``torch.load(weights_only=True)`` elsewhere (transformers)."""
    return isinstance(error, RefusedPickle) or (
        isinstance(error, pickle.UnpicklingError) and "Weights only load failed" in str(error)
    )


def refused_global(error: BaseException) -> str | None:
    """The name a refused file asked for, if the error says it."""
    found = re.search(r"GLOBAL ([\w.]+)|\(([\w.]+)\) besides", str(error))
    return (found.group(1) or found.group(2)) if found else None


@contextlib.contextmanager
def refusing_pickles(folder):
    """Around a library's model loading (transformers, sentence-transformers: ``torch.load(weights_only=True)``
    of a ``pytorch_model.bin``): a refused file becomes :class:`RefusedPickle` naming it, instead of torch's
    message, which suggests loading it with ``weights_only=False``."""
    try:
        yield
    except pickle.UnpicklingError as error:
        if isinstance(error, RefusedPickle) or not is_refused(error):
            raise
        folder = Path(folder).expanduser()
        files = sorted(p for p in folder.rglob("*") if p.suffix in (".bin", ".pt", ".pth", ".pkl")) if (
            folder.is_dir()) else []  # fmt: skip
        raise RefusedPickle(refusal(files[0] if len(files) == 1 else folder, refused_global(error))) from None
