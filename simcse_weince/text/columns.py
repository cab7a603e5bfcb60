"""Training files with columns: pairs and triplets for supervised SimCSE, read and checked at the boundary.

A CSV, TSV or JSON-lines file with a header names its columns by role, in SimCSE's names or sentence-transformers':

==============  ==================  ===========================================================================
SimCSE          sentence-transformers  what the column holds
==============  ==================  ===========================================================================
``sent0``       ``anchor``          the sentence being encoded (the anchor of its row)
``sent1``       ``positive``        its positive (optional: without it, dropout makes the positive)
``hard_neg``    ``negative``        its hard negative (optional; also a negative for every other row)
==============  ==================  ===========================================================================

One column is unsupervised SimCSE (like a plain text file), two are pairs, three are SimCSE's NLI triplets
(``nli_for_simcse.csv``: ``sent0,sent1,hard_neg``). Every problem (an unknown or missing column, a ragged row, an
empty cell, bad quoting or a quote that runs over lines, a JSON line that is not an object) is reported in one line
that names the file, the line and the column, before anything is trained.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from simcse_weince.records import no_duplicate_keys
from simcse_weince.validation import check_utf8_text_file, has_visible_character

#: the accepted header namings, each in role order (anchor, positive, hard negative)
COLUMN_NAMINGS = (("sent0", "sent1", "hard_neg"), ("anchor", "positive", "negative"))
#: what each column means, by position in a naming (the model card and results.json say it)
COLUMN_ROLES = ("anchor", "positive", "hard negative")
#: file endings read as tables: the delimiter, or None for JSON lines
TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t", ".jsonl": None}


@dataclass
class TrainingTable:
    """The rows of a training file: ``columns`` in role order (the file's own names), ``rows[c]`` the texts of
    column ``c``; ``skipped`` counts blank lines."""

    columns: tuple[str, ...]
    rows: dict[str, list[str]]
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.rows[self.columns[0]])


def is_table_file(path: Path) -> bool:
    return Path(path).suffix.lower() in TABLE_SUFFIXES


def _expected() -> str:
    return " or ".join(f"{a},{b}[,{c}]" for a, b, c in COLUMN_NAMINGS) + " (or one column: sent0 / anchor / text)"


def _columns_in_role_order(path: Path, header: list[str]) -> tuple[str, ...]:
    """The header's names in role order; one line naming the problem otherwise."""
    names = [name.strip() for name in header]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(
            f"training file {path}: the header names column {duplicates[0]!r} twice; expected {_expected()}"
        )
    if len(names) == 1 and names[0] in ("sent0", "anchor", "text"):
        return (names[0],)
    for naming in COLUMN_NAMINGS:
        if naming[0] in names:
            unknown = [name for name in names if name not in naming]
            if unknown:
                raise ValueError(
                    f"training file {path}: unknown column {unknown[0]!r} in the header {','.join(names)}; "
                    f"expected {_expected()}"
                )
            if naming[1] not in names:
                missing = naming[1] if len(names) > 1 else f"{naming[1]} (a one-column table is named text)"
                raise ValueError(
                    f"training file {path}: the header {','.join(names)} has no {missing} column; expected "
                    f"{_expected()}"
                )
            return naming[: len(names)]
    raise ValueError(f"training file {path}: the header {','.join(names) or '(empty)'} names no anchor column; "
                     f"expected {_expected()}")  # fmt: skip


def _check_cell(path: Path, line: int, column: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(
            f"training file {path}, line {line}: column {column!r} holds {type(value).__name__} {value!r}, not text"
        )
    if not has_visible_character(value):
        raise ValueError(f"training file {path}, line {line}: column {column!r} is empty; every cell needs a sentence")
    return value


def read_table(path: str | Path, max_rows: int | None = None) -> TrainingTable:
    """Read a CSV/TSV (``csv`` module, strict quoting) or JSON-lines training file with a header row / keys.

    Raises ValueError with one line for every malformed case (see the module docstring)."""
    path = Path(path)
    check_utf8_text_file(path, "training file")
    delimiter = TABLE_SUFFIXES[path.suffix.lower()]
    reader = _json_lines(path) if delimiter is None else _delimited(path, delimiter)
    header, blank = None, 0
    for _, header in reader:
        if header is not None:
            break
        blank += 1
    if header is None:
        raise ValueError(f"training file {path} is empty; it needs a header ({_expected()}) and rows")
    columns = _columns_in_role_order(path, header)
    table = TrainingTable(columns, {name: [] for name in columns}, skipped=blank)
    # where each column stands: the header's position (names compared stripped, as they were checked), a JSON key
    order = [[name.strip() for name in header].index(name) if delimiter is not None else name for name in columns]
    width = len(header)
    for line, cells in reader:
        if cells is None:  # a blank line
            table.skipped += 1
            continue
        if max_rows is not None and len(table) >= max_rows:
            break
        if delimiter is not None and len(cells) != width:
            raise ValueError(
                f"training file {path}, line {line}: {len(cells)} fields where the header has {width} "
                f"({','.join(header)}); quote cells that hold the delimiter"
            )
        if delimiter is None:
            missing = [name for name in columns if name not in cells]
            extra = [name for name in cells if name not in columns]
            if missing or extra:
                what = f"has no {missing[0]!r}" if missing else f"has the unexpected key {extra[0]!r}"
                raise ValueError(f"training file {path}, line {line}: the object {what}; the first line has "
                                 f"{','.join(columns)}")  # fmt: skip
        for name, index in zip(columns, order):
            table.rows[name].append(_check_cell(path, line, name, cells[index]))
    if len(table) == 0:
        raise ValueError(f"training file {path} has a header ({','.join(header)}) but no rows")
    return table


def _delimited(path: Path, delimiter: str):
    """(line number, fields) per row; (line, None) for a blank line. Bad quoting is one line naming the line."""
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter, strict=True)
        while True:
            first_line = reader.line_num + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                if reader.line_num > first_line:  # the row began lines earlier: a quote opened there is still open
                    raise ValueError(_open_quote(path, first_line, reader.line_num, error)) from None
                raise ValueError(f"training file {path}, line {reader.line_num}: {error}") from None
            if reader.line_num != first_line:  # one row per line: a quoted cell never holds a line break
                raise ValueError(
                    f"training file {path}, line {first_line}: a quote opened here runs over "
                    f"{reader.line_num - first_line + 1} lines (to line {reader.line_num}), merging them into one "
                    f"row; close the quote, or remove it (a cell may not hold a line break)"
                )
            if fields and fields[0].startswith("\ufeff") and reader.line_num == 1:  # a BOM before the header
                fields[0] = fields[0][1:]
            yield reader.line_num, (fields if any(field.strip() for field in fields) else None)


def _open_quote(path: Path, opened: int, stopped: int, error: csv.Error) -> str:
    """The error of a quote opened on line ``opened`` that the reader could not close by line ``stopped``: reported
    where it opened (the reader's own error is at the line it gave up on)."""
    if "end of data" in str(error):  # the csv module's message for a file that ends inside a quoted cell
        what = f"is never closed (it runs to the end of the file, line {stopped})"
    else:
        what = f"runs to line {stopped}, where the row cannot be read ({error})"
    return (
        f"training file {path}, line {opened}: a quote opened here {what}; close the quote, or remove it (a cell may "
        "not hold a line break)"
    )


def _json_lines(path: Path):
    """(line number, object) per line; the first yields the object's keys as the header."""
    first = True
    with open(path, encoding="utf-8-sig") as handle:
        for line_number, text in enumerate(handle, start=1):
            if not text.strip():
                yield line_number, None
                continue
            try:
                # without its line break: a string left open is then reported where it opened, not at the break
                value = json.loads(text.rstrip("\r\n"), object_pairs_hook=no_duplicate_keys(
                    f"training file {path}, line {line_number}"))  # fmt: skip
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"training file {path}, line {line_number}, column {error.colno}: not JSON ({error.msg})"
                ) from None
            if not isinstance(value, dict):
                raise ValueError(
                    f"training file {path}, line {line_number}: a JSON {type(value).__name__}, not an object with "
                    f"keys {_expected()}"
                )
            if first:
                first = False
                yield line_number, list(value)
            yield line_number, value
