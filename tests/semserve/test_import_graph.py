"""The import graph of the repo's packages: no circles, and imports run one way.

    transformers_svc -> cache, semserve      predictors -> semserve      cache, semserve -> no service

Every `import` and `from ... import` counts, wherever it is written: at the top, inside a function
(imported late, still a dependency) or under `if TYPE_CHECKING:`. Read with `ast`, so nothing is
imported to check it. A module named as a string and loaded with importlib (semserve/cli.py lists
the services' command lines that way, so `semserve cache ...` never loads vLLM) is no import here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cache", "semserve", "transformers_svc", "predictors", "serverless", "bench")
SERVICES = ("transformers_svc", "predictors")
# What each package may import of the others (the house rule; its own modules always).
ALLOWED: dict[str, frozenset[str]] = {
    "cache": frozenset({"semserve"}),
    "semserve": frozenset({"cache"}),
    "transformers_svc": frozenset({"cache", "semserve"}),
    "predictors": frozenset({"semserve"}),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def repo_modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _imported_names(path: Path, module: str) -> Iterator[tuple[str, int]]:
    """(dotted name, line) for every import in the file; `from a import b` yields a.b and a."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package of this module, `level - 1` up
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The repo module an imported name is: itself, else the nearest enclosing module (`from
    cache.verify import RuleVerifier` is an import of cache.verify; `from cache.verify import
    rules` of cache.verify.rules)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported repo module: line of the first such import}."""
    modules = repo_modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for name, line in _imported_names(path, module):
            target = _resolve(name, modules)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _loop(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """One circle through a component, written out with the lines of its imports."""
    members = set(component)
    start = component[0]
    path = [start]
    seen = {start}
    v = start
    while True:
        nxt = sorted(w for w in graph[v] if w in members)
        back = start if start in nxt else None
        w = back or next((u for u in nxt if u not in seen), nxt[0])
        path.append(f"{w} (line {graph[v][w]} of {v})")
        if w == start or w in seen:
            return " -> ".join(path)
        seen.add(w)
        v = w


def test_graph_reads_imports_at_every_level(tmp_path: Path) -> None:
    # The reader itself: a top-level, a function-level, a TYPE_CHECKING and a relative import.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nimport json\nif TYPE_CHECKING:\n    from pkg import b\n"
        "def f():\n    from .c import x\n    import pkg.d.e\n"
    )
    names = {n for n, _ in _imported_names(pkg / "a.py", "pkg.a")}
    assert {"pkg.b", "pkg.c.x", "pkg.d.e", "json"} <= names
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert "a -> b (line 1 of a) -> c (line 2 of b) -> a (line 3 of c)" == _loop(["a", "b", "c"], graph)


def test_no_import_circles() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the whole repo was read, not an empty tree
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(_loop(c, graph) for c in found)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_one_way(package: str) -> None:
    graph = import_graph()
    wrong = [
        f"{module} imports {target} (line {line})"
        for module, edges in graph.items()
        if module.split(".")[0] == package
        for target, line in edges.items()
        if (top := target.split(".")[0]) != package and top not in ALLOWED[package]
    ]
    assert not wrong, "\n".join(wrong)


def test_command_modules_named_as_strings_exist() -> None:
    # semserve/cli.py names the command modules as strings (so shared code imports no service);
    # each must still be a repo module with `register(subparsers)`, or `semserve` would not start.
    from semserve.cli import COMMAND_MODULES

    modules = repo_modules()
    for name in COMMAND_MODULES:
        assert name in modules, name
        tree = ast.parse(modules[name].read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} | {
            a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
        }
        assert "register" in defined, name
