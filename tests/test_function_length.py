"""No function in the package is longer than 80 lines.

A longer function is split into named helpers (the training loop reads top to bottom as the loop, its set-up,
steps, checkpoints and export as helpers below it; a diagnostic reads as its steps). A function is counted from its
``def`` line to its last line, docstring and comments included, as a reader meets it; methods and nested functions
count on their own (a nested function's lines count in its outer function's too). A function that truly reads
better whole goes in ``READ_BETTER_WHOLE`` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simcse_weince"
MAX_LINES = 80
#: "path/in/the/package.py:qualified.name" -> why it reads better whole; none does today
READ_BETTER_WHOLE: dict[str, str] = {}


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines)`` of every function and method in ``source``, nested ones too."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            else:  # functions defined under an if, a with or a try
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def long_functions(root: Path) -> dict[str, tuple[int, int]]:
    """``"path:name" -> (line, lines)`` of the functions under ``root`` longer than ``MAX_LINES``."""
    too_long = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).as_posix()
        for name, line, lines in function_lengths(path.read_text(encoding="utf-8")):
            if lines > MAX_LINES:
                too_long[f"{relative}:{name}"] = (line, lines)
    return too_long


def test_no_function_in_the_package_is_longer_than_80_lines():
    too_long = {key: value for key, value in long_functions(PACKAGE).items() if key not in READ_BETTER_WHOLE}
    assert not too_long, "split into named helpers (or say in READ_BETTER_WHOLE why it reads better whole): " + (
        "; ".join(f"{key} (line {line}) is {lines} lines" for key, (line, lines) in too_long.items())
    )


def test_the_allow_list_names_only_long_functions_that_exist():
    """A stale entry (the function was split, renamed or removed) would excuse the next long function of that name."""
    stale = set(READ_BETTER_WHOLE) - set(long_functions(PACKAGE))
    assert not stale, f"no longer over {MAX_LINES} lines or gone; remove from READ_BETTER_WHOLE: {sorted(stale)}"


def planted_function(header: str, indent: str, lines: int) -> str:
    """A function of exactly ``lines`` lines at ``indent``: its def, assignments, a return."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}{header}\n{body}{indent}    return 0\n"


def test_the_scan_finds_planted_long_functions_wherever_they_are_defined(tmp_path):
    module = tmp_path / "planted" / "inner" / "module.py"
    module.parent.mkdir(parents=True)
    too_long = MAX_LINES + 1
    module.write_text(
        "\n\n".join([
            planted_function("def fits():", "", MAX_LINES),  # at the limit: allowed
            planted_function("def top():", "", too_long),
            "class Holder:\n" + planted_function("def method(self):", "    ", too_long),
            "if True:\n" + planted_function("async def guarded():", "    ", too_long),
            "def outer():\n" + planted_function("def inner():", "    ", too_long) + "    return inner\n",
        ]),
        encoding="utf-8",
    )  # fmt: skip
    found = long_functions(tmp_path / "planted")
    path = "planted/inner/module.py"
    assert {key: lines for key, (_, lines) in found.items()} == {
        f"{path}:top": too_long,
        f"{path}:Holder.method": too_long,
        f"{path}:guarded": too_long,
        f"{path}:outer": too_long + 2,  # its def and its return around inner()
        f"{path}:outer.inner": too_long,
    }
    assert found[f"{path}:top"][0] == MAX_LINES + 3  # the def's line: after fits() and two blank lines
