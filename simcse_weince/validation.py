"""Boundary checks shared by the config dataclasses, the CLI and the file readers.

One rule for every entry point: a config built in Python, read from a YAML/JSON file or given as flags is checked
by the same code, and a bad value is reported with the field's name, the value, and what is expected.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import math
import os
import stat
import types
import typing
import unicodedata
from pathlib import Path

__all__ = [
    "Domain",
    "check_domains",
    "check_field_types",
    "check_regular_file",
    "check_utf8_text_file",
    "has_visible_character",
]


def describe_type(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(arg) for arg in args)
    if origin is typing.Literal:
        return " or ".join(repr(arg) for arg in args)
    if origin is tuple:
        plural = {int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0]) or describe_type(args[0])}"
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        type(None): "None",
    }.get(hint, getattr(hint, "__name__", str(hint)))


def _matches(value, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:  # the right type; whether the value is allowed is the class's own check
        return isinstance(value, type(args[0]))
    if origin is tuple:
        return isinstance(value, (tuple, list)) and all(_matches(item, args[0]) for item in value)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


@functools.cache
def _field_hints(cls) -> dict:
    # a WeinceConfig() is built by every loss call that is given none, and resolving string annotations is not
    # free: a class's hints do not change, so they are resolved once (why: docs/performance.md#comment-numbers)
    return typing.get_type_hints(cls)


def check_field_types(instance) -> None:
    """Raise TypeError naming the field when a dataclass field holds a value of the wrong type (``quantile="0.3"``),
    and ValueError when a number field is NaN or infinite. A Path given for a str field becomes its str."""
    hints = _field_hints(type(instance))
    owner = type(instance).__name__
    for field in dataclasses.fields(instance):
        value, hint = getattr(instance, field.name), hints[field.name]
        if isinstance(value, os.PathLike) and _matches("", hint):  # a Path where a str is expected: keep it as str
            value = os.fspath(value)
            setattr(instance, field.name, value)
        if not _matches(value, hint):
            raise TypeError(
                f"{owner}.{field.name} must be {describe_type(hint)}, got {value!r} ({type(value).__name__})"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{owner}.{field.name} must be a finite number, got {value}")


def _number(value: float) -> str:
    return f"{value:g}"


@dataclasses.dataclass(frozen=True)
class Domain:
    """The values a numeric setting may take, as the method defines them: an interval, each end closed or open.

    ``why`` says what the bound means (shown in parentheses); ``shown`` writes the domain instead of its bounds.

    >>> str(Domain(0, 1, high_closed=False)), 0.5 in Domain(0, 1), str(Domain(0, low_closed=False))
    ('in [0, 1)', True, '> 0')
    """

    low: float = -math.inf
    high: float = math.inf
    low_closed: bool = True
    high_closed: bool = True
    why: str = ""
    shown: str = ""

    def __contains__(self, value) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return bool(above and below)

    def __str__(self) -> str:
        if self.shown:
            return self.shown
        if self.low == -math.inf and self.high == math.inf:
            return "a finite number"
        if self.high == math.inf:
            return f"{'>=' if self.low_closed else '>'} {_number(self.low)}"
        if self.low == -math.inf:
            return f"{'<=' if self.high_closed else '<'} {_number(self.high)}"
        left, right = "[" if self.low_closed else "(", "]" if self.high_closed else ")"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"


def check_domains(instance, domains: dict[str, Domain]) -> None:
    """Raise ValueError naming the field, its domain and the value when a numeric field of ``instance`` lies outside
    the :class:`Domain` that ``domains`` gives it (None and the words of a field, ``"auto"``, are not numbers: the
    field's type check allows them)."""
    for name, domain in domains.items():
        value = getattr(instance, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value not in domain:
            why = f" ({domain.why})" if domain.why else ""
            raise ValueError(f"{name} must be {domain}{why}, got {value}")


def check_utf8_text_file(path: str | os.PathLike, what: str = "file") -> None:
    """Raise ValueError naming the file and the byte offset when ``path`` is not UTF-8 text (or holds NUL bytes,
    the mark of a binary file). Reads the file in 1 MiB chunks, so a large corpus costs one fast pass."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0  # bytes of the file read before the current chunk
    with path.open("rb") as handle:
        while True:
            chunk = handle.read(1 << 20)
            final = not chunk
            nul = chunk.find(b"\0")
            if nul >= 0:
                raise ValueError(
                    f"{what} {path} is a binary file (NUL byte at byte offset {offset + nul}), not UTF-8 text; "
                    "give a text file with one sentence per line"
                )
            pending = len(decoder.getstate()[0])  # bytes of an incomplete character held from the last chunk
            try:
                decoder.decode(chunk, final=final)
            except UnicodeDecodeError as error:
                position = offset - pending + error.start
                handle.seek(position)
                bad = handle.read(1) or b"?"
                raise ValueError(
                    f"{what} {path} is not UTF-8 text: invalid byte 0x{bad.hex()} at byte offset {position}; "
                    "convert it to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            if final:
                return
            offset += len(chunk)


def not_a_regular_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is not a regular file (``"a directory"``, ``"a FIFO (named pipe)"``,
    ``"a socket"``, ...); None for a regular file or nothing at all. Only stats the path: a FIFO is never opened
    (that would wait for a writer)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def check_regular_file(path: str | os.PathLike, what: str = "file") -> None:
    """Raise ValueError naming what ``path`` is when it exists but is not a regular file (the text readers read a
    file twice, and a pipe or a folder would be reported as missing or block)."""
    kind = not_a_regular_file(path)
    if kind is not None:
        raise ValueError(f"{what} {path} is {kind}, not a regular file; give a text file with one sentence per line")


#: Unicode categories that draw nothing: separators (Z*) and control, format (U+200B, U+FEFF, ...), surrogate,
#: private-use and unassigned code points (C*)
_INVISIBLE_CATEGORIES = ("Z", "C")


def has_visible_character(text: str) -> bool:
    """Whether a line holds a character that is seen: not whitespace and not a zero-width or other format
    character (U+200B ZERO WIDTH SPACE, U+FEFF BYTE ORDER MARK, U+2060 WORD JOINER, ...). ``str.strip()`` keeps
    those, so a line of them would be trained on as an empty sentence.

    >>> has_visible_character("\u200b\ufeff "), has_visible_character("\u200bword")
    (False, True)
    """
    return any(not char.isspace() and unicodedata.category(char)[0] not in _INVISIBLE_CATEGORIES for char in text)
