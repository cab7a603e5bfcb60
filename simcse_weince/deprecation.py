"""Old names of public options and attributes, kept working with a ``FutureWarning`` that names the new one (as
sentence-transformers does for renamed arguments)."""

from __future__ import annotations

import warnings
from typing import Any


def warn_renamed(old: str, new: str, where: str) -> None:
    """One ``FutureWarning``: ``where``'s ``old`` is now ``new``."""
    warnings.warn(
        f"{where}: {old!r} is renamed to {new!r}; the old name will be removed in a future release",
        FutureWarning,
        stacklevel=3,
    )


def renamed_keyword(extra: dict[str, Any], old: str, new: str, value: Any, where: str) -> Any:
    """The value of keyword ``new``, taken from the deprecated ``old`` in ``extra`` (the function's ``**kwargs``)
    with a ``FutureWarning``; any other keyword in ``extra`` is refused as Python would refuse it."""
    unknown = [name for name in extra if name != old]
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    if old not in extra:
        return value
    if value is not None:
        raise TypeError(f"{where}(): give {new!r} only ({old!r} is its old name), not both")
    warn_renamed(old, new, where)
    return extra[old]
