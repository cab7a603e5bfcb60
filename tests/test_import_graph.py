"""The package's own modules import each other without a cycle, at module level.

An import inside a function hides a cycle until the function runs; issue 38 moved them to module top (the CLI
modules and the lazy package exports keep theirs: ``simcse-weince --help`` must not wait for torch). This test
reads every module's top-level imports (not those inside functions or under ``TYPE_CHECKING``) and fails on a
cycle, naming it. Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``, and ``from pkg import
name`` runs the submodule a lazy export maps ``name`` to, so both count as edges.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "simcse_weince"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in ROOT.rglob("*.py")}


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """``name -> submodule`` of a package's ``_EXPORTS = {...}`` literal (simcse_weince._lazy), if it has one."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            try:
                return dict(ast.literal_eval(node.value))
            except ValueError:
                return {}
    return {}


def _top_level_imports(tree: ast.Module):
    """The import statements that run when the module is imported: at top level, or in a top-level ``try``/``if``
    (but not ``if TYPE_CHECKING``)."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody + [n for h in node.handlers for n in h.body])


def _with_parents(name: str, modules: dict) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in modules]


def _import_targets(node: ast.Import | ast.ImportFrom, package: str, modules: dict, exports: dict) -> list[str]:
    """What an import statement of a module of ``package`` imports: the named modules, and for ``from pkg import
    name`` also the submodule ``name`` or the one a lazy export maps it to."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative import
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    targets = [base]
    for alias in node.names:
        if f"{base}.{alias.name}" in modules:
            targets.append(f"{base}.{alias.name}")
        elif alias.name in exports.get(base, {}):
            targets.append(f"{base}.{exports[base][alias.name]}")
    return targets


def _parsed_modules() -> tuple[dict[str, Path], dict[str, ast.Module], dict[str, dict[str, str]]]:
    """The package's modules (name -> path), their syntax trees, and each package's lazy exports."""
    modules = _modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules.items()}
    exports = {name: _lazy_exports(tree) for name, tree in trees.items() if modules[name].name == "__init__.py"}
    return modules, trees, exports


def _package_of(name: str, modules: dict) -> str:
    return name if modules[name].name == "__init__.py" else name.rpartition(".")[0]


def import_graph() -> dict[str, set[str]]:
    modules, trees, exports = _parsed_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, tree in trees.items():
        package = _package_of(name, modules)
        for node in _top_level_imports(tree):
            targets = _import_targets(node, package, modules, exports)
            for target in targets:
                if target == PACKAGE or not target.startswith(PACKAGE + "."):
                    continue
                graph[name].update(t for t in _with_parents(target, modules) if t != name)
    # a module's own parent packages run first when it is imported
    for name in modules:
        graph[name].update(p for p in _with_parents(name, modules) if p != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def module_graph() -> dict[str, set[str]]:
    """:func:`import_graph` without the edges from a module to its own packages: a package's ``__init__``
    re-exporting its submodules, which run it first, is the ordinary layout, not a cycle Python trips on."""
    graph = import_graph()
    return {node: {t for t in targets if not node.startswith(t + ".")} for node, targets in graph.items()}


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(module_graph())
    assert cycle is None, "import cycle among the package's modules: " + " -> ".join(cycle)


def test_the_graph_sees_imports_and_a_planted_cycle_is_found():
    """The walk is not vacuous: known edges are there, and a cycle added to the graph is reported."""
    graph = module_graph()
    assert "simcse_weince.weince" in graph["simcse_weince.losses.from_embeddings"]
    assert "simcse_weince.losses.from_embeddings" in graph["simcse_weince.text.trainer"]
    loss_path = "simcse_weince.losses.from_embeddings"
    planted = {**graph, "simcse_weince.weince": graph["simcse_weince.weince"] | {loss_path}}
    cycle = find_cycle(planted)
    assert cycle is not None and loss_path in cycle


@pytest.mark.parametrize("folder", ["compare", "training", "losses", "weince"])
def test_shared_machinery_knows_no_trainer(folder):
    """compare/ (its command-line wiring too), the shared training loop, the losses and the core import nothing from
    text/ or vision/, anywhere: each trainer hands them what differs (a CellKind, a TrainingRecipe) and registers its
    own ``compare`` command."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            trainers = [n for n in names if n.startswith((f"{PACKAGE}.text", f"{PACKAGE}.vision"))]
            assert not trainers, f"{path.relative_to(ROOT.parent)} line {node.lineno} imports {trainers[0]}"


#: The package's floors, lowest first. A module may import, at module level or inside a function, only from its own
#: floor or a lower one: no arrow back up. A module's floor is that of the longest prefix here that names it (a
#: folder or a module; names relative to the package); the package root, and so every top-level helper module that
#: no longer prefix names (settings.py, paths.py, precision.py, validation.py, ...), is the bottom floor. A new
#: folder goes on the floor it belongs to (docs/layout.md, "Floors").
FLOORS: tuple[tuple[str, ...], ...] = (
    ("",),  # the package root and its helper modules
    ("weince",),  # the loss core: tensors in, tensors out
    ("losses",),  # sentence-transformers losses over the core
    ("training", "evaluation", "diagnostics"),  # what every trainer shares; STS evaluation; EVT diagnostics
    ("compare", "hub"),  # what works on runs: variant x seed sweeps (handed a CellKind); the model card and push
    ("text", "vision"),  # the trainers: each registers its commands (its compare with its CellKind)
    ("cli",),  # the simcse-weince command
)


def floor_of(module: str) -> int:
    """The floor of ``module`` (a dotted name in the package): that of the longest prefix of :data:`FLOORS`."""
    relative = module.removeprefix(PACKAGE).removeprefix(".")
    best, floor = -1, 0
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (not prefix or relative == prefix or relative.startswith(prefix + ".")) and len(prefix) > best:
                best, floor = len(prefix), level
    return floor


def every_import() -> dict[str, list[tuple[str, int]]]:
    """``module -> [(imported module, line), ...]`` for every import statement of the package's own modules,
    anywhere in a module: at top level, inside functions, under ``TYPE_CHECKING`` (a dependency all the same).
    An imported name resolves to the longest module of the package it names (a lazy export to its submodule)."""
    modules, trees, exports = _parsed_modules()
    imports: dict[str, list[tuple[str, int]]] = {name: [] for name in modules}
    for name, tree in trees.items():
        package = _package_of(name, modules)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _import_targets(node, package, modules, exports):
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    known = [t for t in [PACKAGE, *_with_parents(target, modules)] if t in modules]
                    imports[name].append((known[-1], node.lineno))
    return imports


def imports_up(imports: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import of ``imports`` that goes to a higher floor, as ``"<file> line <n> imports <module> (floor ...
    -> floor ...)"``."""
    modules, found = _modules(), []
    for name, targets in sorted(imports.items()):
        for target, line in targets:
            low, high = floor_of(name), floor_of(target)
            if high > low:
                where = modules[name].relative_to(ROOT.parent) if name in modules else name
                found.append(f"{where} line {line} imports {target} (floor {low} {FLOORS[low]} -> floor {high} "
                             f"{FLOORS[high]})")  # fmt: skip
    return found


def test_no_import_goes_up_a_floor():
    """Every import of the package's modules, at module level or inside a function, goes to the same floor or a
    lower one (:data:`FLOORS`): compare/ knows no trainer, the losses no trainer loop, the core nothing above it."""
    found = imports_up(every_import())
    assert not found, "imports back up a floor:\n" + "\n".join(found)


def test_the_floors_are_read_and_a_planted_upward_import_is_found():
    """The check is not vacuous: every floor of the table names a module of the package, imports inside functions
    are seen, and an import planted in the graph from the core up to a trainer is reported with its file and line."""
    modules, imports = _modules(), every_import()
    for prefixes in FLOORS[1:]:
        for prefix in prefixes:
            assert f"{PACKAGE}.{prefix}" in modules, f"FLOORS names {prefix!r}, which is not in the package"
    assert [floor_of(f"{PACKAGE}.{name}") for name in ("settings", "weince.tail", "losses", "training.loop")] == [
        0, 1, 2, 3
    ]  # fmt: skip
    assert floor_of(f"{PACKAGE}.text.cli") == floor_of(f"{PACKAGE}.vision.cells") > floor_of(f"{PACKAGE}.compare.cli")
    # a function-level import: the trainers' CLI modules import the compare machinery when they register
    assert f"{PACKAGE}.compare.cli" in {target for target, _ in imports[f"{PACKAGE}.text.cli"]}
    planted = {**imports, f"{PACKAGE}.weince": [*imports[f"{PACKAGE}.weince"], (f"{PACKAGE}.text.cells", 7)]}
    found = [line for line in imports_up(planted) if line not in imports_up(imports)]
    assert found == [f"{PACKAGE}/weince/__init__.py line 7 imports {PACKAGE}.text.cells (floor 1 ('weince',) -> "
                     "floor 5 ('text', 'vision'))"]  # fmt: skip
    # an arrow back up from the sweep machinery to a trainer (what compare/cli.py had) is one too
    back = {**imports, f"{PACKAGE}.compare.cli": [(f"{PACKAGE}.text.cells", 19)]}
    found = [line for line in imports_up(back) if line not in imports_up(imports)]
    assert found == [f"{PACKAGE}/compare/cli.py line 19 imports {PACKAGE}.text.cells (floor 4 ('compare', 'hub') -> "
                     "floor 5 ('text', 'vision'))"]  # fmt: skip


def _documented_imports() -> list[str]:
    """Every ``from simcse_weince... import ...`` / ``import simcse_weince...`` statement in the README's and the
    docs' code (parenthesised ones joined)."""
    statements = []
    for doc in [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").glob("*.md"))]:
        lines = doc.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            line = lines[index].strip().removeprefix('python -c "').removeprefix(">>> ")
            if line.startswith((f"from {PACKAGE}", f"import {PACKAGE}")):
                statement = line.split(";")[0].split("  #")[0].rstrip(" \\")
                while "(" in statement and ")" not in statement and index + 1 < len(lines):
                    index += 1
                    statement += " " + lines[index].strip()
                statements.append(statement)
            index += 1
    return sorted(set(statements))


def test_every_import_the_readme_and_docs_show_works():
    """Renames keep every public import the README and docs show (issue 38): each one runs, in a fresh interpreter."""
    import subprocess
    import sys

    statements = _documented_imports()
    assert len(statements) >= 5 and any("WeinceLoss" in s for s in statements)
    code = "\n".join(f"{s}  # noqa" for s in statements)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, f"a documented import fails:\n{code}\n{completed.stderr[-2000:]}"


@pytest.mark.parametrize("module", ["simcse_weince.text.trainer", "simcse_weince.vision.trainer"])
def test_the_trainers_start_without_sentence_transformers(module):
    """Importing a trainer does not import sentence-transformers (seconds of start-up): the GradCache step and the
    export import it where they run. Issue 38's move of GradCache once put that import at module top."""
    import subprocess
    import sys

    code = f"import sys, {module}; print('sentence_transformers' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "False", f"{module} imports sentence-transformers at start-up"
