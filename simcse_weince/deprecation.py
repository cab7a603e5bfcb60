"""Old names of public options and attributes, kept working with a ``FutureWarning`` that names the new one (as
sentence-transformers does for renamed arguments)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any


def warn_renamed(old: str, new: str, where: str, stacklevel: int = 3) -> None:
    """One ``FutureWarning``: ``where``'s ``old`` is now ``new``."""
    warnings.warn(
        f"{where}: {old!r} is renamed to {new!r}; the old name will be removed in a future release",
        FutureWarning,
        stacklevel=stacklevel,
    )


def renamed_keywords(**new_names: str) -> Callable:
    """Decorator: a call with an old keyword (``old="new"``) passes its value as the new one, with a
    ``FutureWarning``; giving both is a ``TypeError``."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # a constructor is named after the class built (a subclass's name, not the base that defines it)
            where = type(args[0]).__name__ if function.__name__ == "__init__" else function.__qualname__
            for old, new in new_names.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{where}(): give {new!r} only ({old!r} is its old name), not both")
                    warn_renamed(old, new, where)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper

    return decorate


def renamed_attribute(old: str, new: str) -> property:
    """A property ``old`` that reads ``new`` with a ``FutureWarning``."""

    def read(self: Any) -> Any:
        warn_renamed(old, new, type(self).__name__)
        return getattr(self, new)

    return property(read, doc=f"Deprecated: renamed to :attr:`{new}`.")


def renamed_value(old_value: Any, new_value: Any, old: str, new: str, where: str) -> Any:
    """The value of a renamed option given under its ``old`` name (a ``FutureWarning``); for a function that keeps
    the old keyword in its signature and calls this only when it is given (no extra call on its hot path)."""
    if new_value is not None:
        raise TypeError(f"{where}(): give {new!r} only ({old!r} is its old name), not both")
    warn_renamed(old, new, where, stacklevel=4)
    return old_value
