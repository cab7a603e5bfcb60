"""The strict readers of every JSON and YAML file the tool reads, and of the per-step log ``logs/metrics.csv``.

Python's ``json`` and PyYAML keep the last of two equal keys without a word (a results.json holding
``"stsb_test_spearman"`` twice would be compared by its second value); here a duplicate key is refused, naming
the key and the file. The field checks name NaN as NaN, a negative count as negative, and a value of the wrong
type by the field, the type it holds and the type expected. Every refusal is a :class:`RecordError` (a
``ValueError``: the command line shows it as one ``error:`` line) that names the file and what to do.

Example::

    results = read_json(run / "results.json", "results file")
    steps = check_count(results.get("total_steps"), "total_steps", run / "results.json")
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

__all__ = [
    "RecordError",
    "check_count",
    "check_list",
    "check_number",
    "loads_json",
    "loads_yaml",
    "no_duplicate_keys",
    "read_json",
    "read_metrics_log",
    "read_yaml",
    "type_name",
]

#: what to do about a file that fails a check, when the caller has nothing more precise to say
FIX = "fix the file, or write it again with the program that wrote it"


class RecordError(ValueError):
    """A JSON, YAML or CSV file the tool reads is not what it must be; the message names the file and the fix."""


def type_name(value) -> str:
    """The type of a value read from a file, in the file's words (``true/false``, ``a list``, ``NaN``)."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number"}
    return names.get(type(value), "null" if value is None else type(value).__name__)


# ------------------------------------------------------------------------------------------------------ JSON


def no_duplicate_keys(source):
    """A ``json.loads`` ``object_pairs_hook`` refusing a key given twice in one object, naming it and ``source``
    (for a reader that reports syntax errors itself, as the JSON-lines training files do)."""

    def pairs_hook(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise RecordError(
                    f"{source} holds the key {key!r} twice in one object (it would be read as its last value); "
                    f"keep one of them"
                )
            seen[key] = value
        return seen

    return pairs_hook


def loads_json(text: str, source="JSON text"):
    """``json.loads`` refusing a duplicate key in any object (naming it and ``source``); a syntax error is a
    :class:`RecordError` naming the line and column."""
    try:
        return json.loads(text, object_pairs_hook=no_duplicate_keys(source))
    except json.JSONDecodeError as error:
        raise RecordError(
            f"{source} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}; {FIX}"
        ) from None


def _read_text(path: Path, what: str) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise RecordError(
            f"{what} {path} is not UTF-8 text (invalid byte at offset {error.start}); save it as UTF-8"
        ) from None


def read_json(path: str | os.PathLike, what: str = "file"):
    """A JSON file read by :func:`loads_json`; the messages name it as ``what path``."""
    path = Path(path)
    return loads_json(_read_text(path, what), f"{what} {path}")


# ------------------------------------------------------------------------------------------------------ YAML


def _strict_loader():
    import yaml  # third-party, on first use: not at ``simcse-weince --help``

    class StrictSafeLoader(yaml.SafeLoader):
        """PyYAML's safe loader refusing a key given twice in one mapping (a ``<<`` merge may still be
        overridden: that is what a merge is for)."""

        source = "YAML text"

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen = set()
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        duplicate = key in seen
                    except TypeError:  # an unhashable key: SafeConstructor's own message names it
                        break
                    if duplicate:
                        raise RecordError(
                            f"{self.source} holds the key {key!r} twice in one mapping (line "
                            f"{key_node.start_mark.line + 1}; it would be read as its last value); keep one of them"
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictSafeLoader


def loads_yaml(text: str, source="YAML text"):
    """``yaml.safe_load`` refusing a duplicate key in any mapping (naming it, its line and ``source``); a syntax
    error is a :class:`RecordError` naming the line and column."""
    import yaml

    loader = _strict_loader()(text)
    loader.source = source
    try:
        return loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise RecordError(f"{source} is not valid YAML: {problem}{where}; fix the file") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, what: str = "file"):
    """A YAML file read by :func:`loads_yaml`; the messages name it as ``what path``."""
    path = Path(path)
    return loads_yaml(_read_text(path, what), f"{what} {path}")


# ---------------------------------------------------------------------------------------------- field checks


def check_count(value, field: str, source, *, minimum: int = 0) -> int:
    """``value`` as a count read from ``source``: an integer (not a boolean) of at least ``minimum``. NaN is
    named NaN, a negative count negative, another type by its name."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"{source}: {field} must be an integer count, got {type_name(value)} ({value!r}); {FIX}")
    if value < minimum:
        kind = "negative" if value < 0 else f"less than {minimum}"
        raise RecordError(f"{source}: {field} is {value}, {kind}; a count is at least {minimum}; {FIX}")
    return value


def check_number(value, field: str, source, *, allow_nan: bool = False) -> float:
    """``value`` as a number read from ``source``; NaN (refused unless ``allow_nan``) and infinities are named."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RecordError(f"{source}: {field} must be a number, got {type_name(value)} ({value!r}); {FIX}")
    if math.isnan(value) and not allow_nan:
        raise RecordError(f"{source}: {field} is NaN, not a number; {FIX}")
    if math.isinf(value):
        raise RecordError(f"{source}: {field} is {value}, not a finite number; {FIX}")
    return float(value)


def check_list(value, field: str, source, *, nonempty: bool = False) -> list:
    """``value`` as a list read from ``source`` (holding at least one entry with ``nonempty``)."""
    if not isinstance(value, list):
        raise RecordError(f"{source}: {field} must be a list, got {type_name(value)}; {FIX}")
    if nonempty and not value:
        raise RecordError(f"{source}: {field} is an empty list; it must hold at least one entry; {FIX}")
    return value


# --------------------------------------------------------------------------------------------- the step log

#: the columns of the trainers' per-step log (long format: any metric at any step)
LOG_COLUMNS = ("step", "name", "value")


def read_metrics_log(path: str | os.PathLike) -> list[tuple[int, str, float]]:
    """The rows ``(step, name, value)`` of a trainer's ``logs/metrics.csv``, in file order. A step must be a
    non-negative integer and each ``(step, name)`` appears once (a resumed run rewrites the rows after its
    checkpoint); a value is a number, NaN included (NaN is what was logged), or empty (read as NaN)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(header) != LOG_COLUMNS:
            raise RecordError(
                f"{path} is not a training log: expected the columns step,name,value (logs/metrics.csv); "
                f"give a run's logs/metrics.csv"
            )
        rows, seen = [], {}
        for line, fields in enumerate(reader, start=2):
            if not fields:
                continue
            if len(fields) != 3:
                raise RecordError(f"{path}, line {line}: {len(fields)} fields, not step,name,value; {FIX}")
            step_text, name, value_text = fields
            try:
                step = int(step_text)
            except ValueError:
                raise RecordError(f"{path}, line {line}: step {step_text!r} is not an integer; {FIX}") from None
            if step < 0:
                raise RecordError(f"{path}, line {line}: step {step} is negative; steps count from 0; {FIX}")
            if (step, name) in seen:
                raise RecordError(
                    f"{path}, line {line}: step {step} logs {name!r} twice (also line {seen[step, name]}); the "
                    f"log of one run holds each step once: {FIX}"
                )
            seen[step, name] = line
            try:
                value = float(value_text) if value_text.strip() else math.nan
            except ValueError:
                raise RecordError(
                    f"{path}, line {line}: {name} at step {step} is {value_text!r}, not a number; {FIX}"
                ) from None
            rows.append((step, name, value))
    return rows
