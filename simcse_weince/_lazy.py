"""Lazy package exports (as SPEC 1's ``lazy_loader.attach`` does): a name is imported from its submodule on first
use, so that ``simcse-weince --help`` and light imports do not wait for torch.

Usage, in a package's ``__init__.py``::

    __getattr__, __dir__ = lazy_exports(__name__, {"train": "train", "TrainConfig": "config"})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(
    package: str, exports: dict[str, str], renamed: dict[str, str] | None = None
) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``; ``exports`` maps each name to the submodule that defines it,
    ``renamed`` an old exported name to its new one (it still works, with a ``FutureWarning``)."""
    namespace = importlib.import_module(package).__dict__
    renamed = renamed or {}

    def __getattr__(name: str):
        if name in renamed:
            from simcse_weince.deprecation import warn_renamed

            warn_renamed(name, renamed[name], package)
            return __getattr__(renamed[name])
        if name in exports:
            value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
            # importing a submodule binds its name on the package; were a submodule named like an export, the
            # exported name takes it back here (the package's modules are named so that none is)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
