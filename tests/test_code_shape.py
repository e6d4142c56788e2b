"""The shape of the source tree, enforced so that later work cannot regrow it.

1. Size: no module over `MAX_MODULE_LINES` physical lines and no function
   over `MAX_FUNCTION_LINES` (from its first decorator to its last line,
   nested functions counted in their parent as well as on their own).
2. No import circle among the project's modules, counting every import
   statement wherever it stands: at module level, inside functions, and
   under `if TYPE_CHECKING:`.

What is measured: the Python files git knows (tracked, or untracked and not
ignored), outside `tests/`, the generated `fedmask_proto/` and the Alembic
migrations (`*/migrations/*`), whose revisions are history, not design.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 120
EXCLUDED_PREFIXES = ("tests/", "fedmask_proto/")
# The packages whose modules import each other (pyproject's import-linter root packages).
PACKAGES = ("secagg", "wire", "models", "coordinator", "edge_client", "admin", "fedmask", "fedmask_settings", "dpmech")


def measured_files(root: Path = ROOT) -> list[str]:
    """Repository-relative paths of the Python files the limits apply to."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split()
    return sorted(
        p for p in set(listed)
        if not p.startswith(EXCLUDED_PREFIXES) and "/migrations/" not in p and (root / p).is_file()
    )


@dataclass(frozen=True)
class Oversize:
    where: str
    lines: int

    def __str__(self) -> str:
        return f"{self.where}: {self.lines} lines"


def physical_lines(source: str) -> int:
    return len(source.splitlines())


def oversized_functions(path: str, source: str, limit: int) -> list[Oversize]:
    """Every function or method in `source` longer than `limit` physical lines."""
    found: list[Oversize] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            end = node.end_lineno if node.end_lineno is not None else node.lineno
            length = end - start + 1
            if length > limit:
                found.append(Oversize(f"{path}:{start} {node.name}", length))
    return found


def test_no_module_is_over_the_limit() -> None:
    files = measured_files()
    assert len(files) > 100, f"only {len(files)} files measured: is this a git checkout?"
    over = [
        Oversize(p, n) for p in files
        if (n := physical_lines((ROOT / p).read_text())) > MAX_MODULE_LINES
    ]
    assert not over, (
        f"modules over {MAX_MODULE_LINES} lines (split them by job):\n" + "\n".join(map(str, over))
    )


def test_no_function_is_over_the_limit() -> None:
    over = [o for p in measured_files() for o in oversized_functions(p, (ROOT / p).read_text(), MAX_FUNCTION_LINES)]
    assert not over, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n"
        + "\n".join(map(str, over))
    )


def test_the_function_measure_counts_decorators_and_nested_bodies() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(8))
    source = f"@decorator(\n    1,\n)\ndef outer():\n    def inner():\n{body}\n    return inner\n"
    found = {o.where.split()[-1]: o.lines for o in oversized_functions("m.py", source, 5)}
    assert found == {"outer": 14, "inner": 9}  # 3 decorator + 2 def + 8 body + 1 return


# --- import circles -------------------------------------------------------------------------


def module_names(root: Path, files: Iterable[str]) -> dict[str, tuple[str, bool]]:
    """Dotted module name -> (path, is a package `__init__`) for the files under PACKAGES."""
    names: dict[str, tuple[str, bool]] = {}
    for path in files:
        parts = list(Path(path).with_suffix("").parts)
        if parts[0] not in PACKAGES:
            continue
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        names[".".join(parts)] = (path, is_package)
    return names


def import_graph(root: Path, modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from every import statement in it.

    `from pkg import name` points at `pkg.name` when that is a module and at
    `pkg` otherwise; a name that is no project module resolves to its nearest
    enclosing project module (`import a.b.func` -> `a.b`).
    """

    def nearest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, (path, is_package) in modules.items():
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse((root / path).read_text(), filename=path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for target in targets:
                resolved = nearest(target)
                if resolved is not None and resolved != module:
                    graph[module].add(resolved)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_among_the_project_modules() -> None:
    modules = module_names(ROOT, measured_files())
    assert {"secagg.stages", "coordinator.service", "models.registry"} <= modules.keys()
    graph = import_graph(ROOT, modules)
    found = circles(graph)
    assert not found, "import circles (imports inside functions count):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_the_circle_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "a.py").write_text("from models.b import thing\n")
    (tmp_path / "models" / "b.py").write_text("def thing():\n    from . import a\n    return a\n")
    (tmp_path / "models" / "c.py").write_text("from models import a\n")
    files = ["models/__init__.py", "models/a.py", "models/b.py", "models/c.py"]
    graph = import_graph(tmp_path, module_names(tmp_path, files))
    assert graph["models.c"] == {"models.a"}
    assert circles(graph) == [["models.a", "models.b"]]
