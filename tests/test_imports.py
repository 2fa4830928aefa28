"""Import architecture of the installed `pearl` package, checked from source.

Nothing of pearl is imported: every .py file under the folders that pyproject.toml's
[tool.setuptools] package-dir maps to import names (`pearl` -> pearl/, `pearl.kernels` ->
kernels/, ...) is parsed with `ast`, and the module-level import graph is built from it:

- `import pearl.a.b` is an edge to `pearl.a.b`;
- `from pearl.a import b` is an edge to `pearl.a.b` when that is a module or package, else to
  `pearl.a` (a package's `__init__` is the module `pearl.a`); relative imports are resolved;
- imports inside functions (lazy imports) are edges too; imports under `if TYPE_CHECKING:` are not;
- `importlib.import_module("pearl.x")` / `__import__("pearl.x")` with a constant string is an
  edge; a computed name (`import_module(f"pearl.runtime.{name}")`, a lookup in an `_EXPORTS`
  dict) cannot be seen from source and is not one.

Rules: (a) no import cycles among pearl's modules, (b) the kernels import nothing of pearl's but
KERNELS_MAY_IMPORT, (c) the estimator imports none of ESTIMATOR_MUST_NOT_IMPORT, (d) the layers in
LAYERS import none of the modules listed for them. Each failure lists the offending edges as
`file:line importer -> imported` (`(lazy)`: the import is inside a function).
"""
from __future__ import annotations

import ast
import os
import tomllib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

ROOT_PACKAGES = ("pearl",)  # import names whose modules make up the graph; other imports are ignored

# (b) the only parts of pearl a kernel may import (a name and everything below it). HLS sources
# are data the FPGA backend compiles.
KERNELS = "pearl.kernels"
# pearl.server.client: the server backend's replay table is a client of a replay server (lazy)
KERNELS_MAY_IMPORT = ("pearl.errors", "pearl.kernels", "pearl.hls", "pearl.server.client")

# (c) what the cost model must not depend on: it is consulted before anything runs
ESTIMATOR = "pearl.estimator"
ESTIMATOR_MUST_NOT_IMPORT = ("pearl.runtime", "pearl.api", "pearl.build", "pearl.cli", "pearl.continuous")

# (d) layering: modules under each key import none of the listed names (or anything below them)
LAYERS = {
    "pearl.algos": ("pearl.kernels", "pearl.runtime", "pearl.replay", "pearl.api", "pearl.build"),
    "pearl.replay": ("pearl.api", "pearl.build", "pearl.cli", "pearl.continuous"),
    "pearl.runtime": ("pearl.api", "pearl.build", "pearl.cli", "pearl.continuous"),
}


# --------------------------------------------------------------------------------------------
# Graph building
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool  # an __init__.py


@dataclass(frozen=True, order=True)
class Edge:
    file: str  # relative to the root the graph was built from
    line: int
    importer: str
    imported: str
    lazy: bool  # inside a function

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.importer} -> {self.imported}" + (" (lazy)" if self.lazy else "")


@dataclass
class Graph:
    root: Path
    modules: dict[str, Module]
    edges: list[Edge]

    def __repr__(self) -> str:  # pytest prints the fixture on a failure
        return f"Graph({self.root}: {len(self.modules)} modules, {len(self.edges)} edges)"

    def adjacency(self) -> dict[str, set[str]]:
        """Module -> modules of this graph it imports (self-imports left out)."""
        adjacency: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            if edge.imported in self.modules and edge.imported != edge.importer:
                adjacency[edge.importer].add(edge.imported)
        return adjacency


def load_package_dirs(root: Path) -> dict[str, Path]:
    """Import name -> folder, from pyproject.toml's [tool.setuptools] package-dir (or
    packages.find.where; the project root when neither is given)."""
    with open(root / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f).get("tool", {}).get("setuptools", {})
    package_dir = dict(setuptools.get("package-dir", {}))
    packages = setuptools.get("packages")
    if "" not in package_dir and isinstance(packages, dict) and "find" in packages:
        where = packages["find"].get("where", ["."])
        package_dir[""] = where[0] if isinstance(where, list) else where
    if not package_dir:
        package_dir = {"": "."}
    return {name: (root / folder).resolve() for name, folder in package_dir.items()}


def within(name: str, prefix: str) -> bool:
    """`name` is the module `prefix` or lies below it."""
    return name == prefix or name.startswith(prefix + ".")


def within_any(name: str, prefixes) -> bool:
    return any(within(name, prefix) for prefix in prefixes)


def discover_modules(package_dirs: dict[str, Path]) -> dict[str, Module]:
    """Every .py file under the mapped folders, named as it is imported once installed. A
    subfolder that package-dir maps elsewhere is left to that mapping (as setuptools does)."""
    modules: dict[str, Module] = {}
    for package, folder in package_dirs.items():
        if not folder.is_dir():
            continue
        prefix = package.split(".") if package else []
        for dirpath, dirnames, filenames in os.walk(folder):
            parts = prefix + list(Path(dirpath).relative_to(folder).parts)
            kept = []
            for sub in sorted(dirnames):
                name = ".".join(parts + [sub])
                if sub.startswith(".") or sub == "__pycache__" or not sub.isidentifier():
                    continue
                if not parts and sub not in ROOT_PACKAGES:  # a "" mapping: only pearl's folders
                    continue
                if name in package_dirs and name != package:
                    continue
                kept.append(sub)
            dirnames[:] = kept
            for filename in sorted(filenames):
                stem, ext = os.path.splitext(filename)
                if ext != ".py" or not stem.isidentifier():
                    continue
                is_package = stem == "__init__"
                name_parts = parts if is_package else parts + [stem]
                if not name_parts or name_parts[0] not in ROOT_PACKAGES:
                    continue
                name = ".".join(name_parts)
                modules.setdefault(name, Module(name, Path(dirpath) / filename, is_package))
    return modules


@dataclass(frozen=True)
class _RawImport:
    line: int
    module: str  # as written, without the leading dots
    names: tuple[str, ...] | None  # None: `import module`
    level: int  # leading dots
    lazy: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[_RawImport] = []
        self._functions = 0

    def _function(self, node) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append(_RawImport(node.lineno, alias.name, None, 0, self._functions > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        names = tuple(alias.name for alias in node.names)
        self.found.append(_RawImport(node.lineno, node.module or "", names, node.level, self._functions > 0))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if (called in ("import_module", "__import__") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            text = node.args[0].value
            level = len(text) - len(text.lstrip("."))
            self.found.append(_RawImport(node.lineno, text[level:], None, level, self._functions > 0))
        self.generic_visit(node)


def _resolve(module: Module, raw: _RawImport, modules: dict[str, Module]) -> list[str]:
    if raw.level:
        base = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        if raw.level - 1 > len(base) - 1:
            return []  # beyond the top-level package: not pearl's
        base = base[:len(base) - (raw.level - 1)]
        target = ".".join(base + ([raw.module] if raw.module else []))
    else:
        target = raw.module
    if raw.names is None:
        resolved = [target]
    else:
        resolved = [f"{target}.{name}" if f"{target}.{name}" in modules else target for name in raw.names]
    return [name for name in dict.fromkeys(resolved) if name.split(".")[0] in ROOT_PACKAGES]


def build_graph(root: Path, package_dirs: dict[str, Path] | None = None) -> Graph:
    """The import graph of the modules under `root` mapped by `package_dirs` (default: root's
    pyproject.toml)."""
    root = Path(root).resolve()
    if package_dirs is None:
        package_dirs = load_package_dirs(root)
    modules = discover_modules(package_dirs)
    edges: set[Edge] = set()
    for module in modules.values():
        source = module.path.read_text(encoding="utf-8")
        tree = ast.parse(source, filename=str(module.path))
        collector = _ImportCollector()
        collector.visit(tree)
        try:
            file = module.path.relative_to(root).as_posix()
        except ValueError:
            file = str(module.path)
        for raw in collector.found:
            for imported in _resolve(module, raw, modules):
                edges.add(Edge(file, raw.line, module.name, imported, raw.lazy))
    return Graph(root, modules, sorted(edges))


# --------------------------------------------------------------------------------------------
# Checks (each returns the offending lines; empty: the rule holds)
# --------------------------------------------------------------------------------------------

def strongly_connected_components(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components in discovery order, members sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(adjacency):
        if start in index:
            continue
        work = [(start, iter(sorted(adjacency[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(adjacency.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _shortest_cycle(adjacency: dict[str, set[str]], members: list[str]) -> list[str]:
    """One shortest cycle through the first member, inside the component."""
    inside = set(members)
    start = members[0]
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for successor in sorted(adjacency[node] & inside):
            if successor == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return path[::-1] + [start]
            if successor not in previous:
                previous[successor] = node
                queue.append(successor)
    return [start]


def find_cycles(graph: Graph) -> list[str]:
    adjacency = graph.adjacency()
    lines = []
    for members in strongly_connected_components(adjacency):
        if len(members) < 2:
            continue
        inside = set(members)
        lines.append(f"cycle among {len(members)} modules: {', '.join(members)}")
        lines.append("  e.g. " + " -> ".join(_shortest_cycle(adjacency, members)))
        for edge in graph.edges:
            if edge.importer in inside and edge.imported in inside and edge.importer != edge.imported:
                lines.append(f"  {edge}")
    return lines


def imports_outside(graph: Graph, subject: str, allowed) -> list[str]:
    """Edges from modules under `subject` to any of pearl's modules not under `allowed`."""
    return [str(edge) for edge in graph.edges
            if within(edge.importer, subject) and not within_any(edge.imported, allowed)]


def imports_into(graph: Graph, subject: str, forbidden) -> list[str]:
    """Edges from modules under `subject` to modules under `forbidden`."""
    return [str(edge) for edge in graph.edges
            if within(edge.importer, subject) and within_any(edge.imported, forbidden)]


# --------------------------------------------------------------------------------------------
# The rules, on the tree this file lives in
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(REPO_ROOT)


def test_layout_is_found(graph):
    """Guards the rules against passing on an empty or misread layout."""
    package_dirs = load_package_dirs(REPO_ROOT)
    missing = [f"{name} -> {folder}" for name, folder in package_dirs.items()
               if name and not (folder / "__init__.py").is_file()]
    assert not missing, "package-dir names folders without an __init__.py:\n" + "\n".join(missing)
    for name in package_dirs:
        if name:
            assert name in graph.modules, f"{name} (package-dir) not found among {sorted(graph.modules)}"
    assert any(within(name, KERNELS) and name != KERNELS for name in graph.modules), "no kernel modules found"
    assert len(graph.edges) > len(graph.modules), "suspiciously few imports found"


def test_no_import_cycles(graph):
    lines = find_cycles(graph)
    assert not lines, "import cycles among pearl's modules:\n" + "\n".join(lines)


def test_kernels_import_only_allowed_parts_of_pearl(graph):
    lines = imports_outside(graph, KERNELS, KERNELS_MAY_IMPORT)
    assert not lines, (f"{KERNELS} may import only {', '.join(KERNELS_MAY_IMPORT)} of pearl "
                       f"(KERNELS_MAY_IMPORT); {len(lines)} imports break this:\n" + "\n".join(lines))


def test_estimator_imports_no_runtime_or_front_end(graph):
    lines = imports_into(graph, ESTIMATOR, ESTIMATOR_MUST_NOT_IMPORT)
    assert not lines, (f"{ESTIMATOR} must not import {', '.join(ESTIMATOR_MUST_NOT_IMPORT)} "
                       f"(ESTIMATOR_MUST_NOT_IMPORT); {len(lines)} imports break this:\n" + "\n".join(lines))


def test_layering(graph):
    lines = []
    for layer, forbidden in LAYERS.items():
        found = imports_into(graph, layer, forbidden)
        if found:
            lines.append(f"{layer} must not import {', '.join(forbidden)}:")
            lines.extend(f"  {line}" for line in found)
    assert not lines, "layering broken (LAYERS):\n" + "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Self-test: the checker does find what it is meant to find
# --------------------------------------------------------------------------------------------

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_checker_reports_a_cycle_and_a_forbidden_kernel_import(tmp_path):
    _write(tmp_path / "pyproject.toml",
           '[tool.setuptools]\npackage-dir = { "pearl" = "pearl", "pearl.kernels" = "kernels" }\n')
    _write(tmp_path / "pearl" / "__init__.py", "")
    _write(tmp_path / "pearl" / "runtime.py",
           "def run():\n"
           "    from .kernels import cpu  # lazy and relative: pearl.kernels.cpu\n"
           "    return cpu\n")
    _write(tmp_path / "kernels" / "__init__.py", "")
    _write(tmp_path / "kernels" / "cpu.py",
           "from typing import TYPE_CHECKING\n"
           "from pearl.runtime import run\n"
           "from pearl.errors import PearlError\n"
           "import numpy\n"
           "if TYPE_CHECKING:\n"
           "    from pearl.api import Agent\n")
    _write(tmp_path / "kernels" / "__pycache__" / "stale.py", "import pearl.api\n")

    graph = build_graph(tmp_path)

    assert set(graph.modules) == {"pearl", "pearl.runtime", "pearl.kernels", "pearl.kernels.cpu"}
    assert [str(edge) for edge in graph.edges] == [
        "kernels/cpu.py:2 pearl.kernels.cpu -> pearl.runtime",
        "kernels/cpu.py:3 pearl.kernels.cpu -> pearl.errors",
        "pearl/runtime.py:2 pearl.runtime -> pearl.kernels.cpu (lazy)",
    ]

    cycles = find_cycles(graph)
    assert cycles[0] == "cycle among 2 modules: pearl.kernels.cpu, pearl.runtime"
    assert "kernels/cpu.py:2 pearl.kernels.cpu -> pearl.runtime" in "\n".join(cycles)
    assert "pearl/runtime.py:2 pearl.runtime -> pearl.kernels.cpu (lazy)" in "\n".join(cycles)

    assert imports_outside(graph, KERNELS, KERNELS_MAY_IMPORT) == [
        "kernels/cpu.py:2 pearl.kernels.cpu -> pearl.runtime"]
    assert imports_into(graph, "pearl.runtime", ("pearl.kernels",)) == [
        "pearl/runtime.py:2 pearl.runtime -> pearl.kernels.cpu (lazy)"]

    # with the kernel's import gone there is neither a cycle nor a forbidden edge
    _write(tmp_path / "kernels" / "cpu.py", "from pearl.errors import PearlError\nfrom . import cpu\n")
    graph = build_graph(tmp_path)
    assert find_cycles(graph) == []
    assert imports_outside(graph, KERNELS, KERNELS_MAY_IMPORT) == []


def test_import_resolution(tmp_path):
    """`from package import module` is an edge to the module; `from package import name` to the
    package's __init__; relative imports from an __init__ start at the package itself."""
    mapping = {"pearl": tmp_path / "pearl"}
    _write(tmp_path / "pearl" / "__init__.py", "from .sub import leaf\n")
    _write(tmp_path / "pearl" / "sub" / "__init__.py", "from . import leaf\nLEAF = 1\n")
    _write(tmp_path / "pearl" / "sub" / "leaf.py",
           "from pearl.sub import LEAF\nimport pearl.sub.leaf\nfrom .. import sub\nfrom ... import outside\n"
           "import importlib\nimportlib.import_module('pearl.other')\n")
    graph = build_graph(tmp_path, mapping)
    assert [str(edge) for edge in graph.edges] == [
        "pearl/__init__.py:1 pearl -> pearl.sub.leaf",
        "pearl/sub/__init__.py:1 pearl.sub -> pearl.sub.leaf",
        "pearl/sub/leaf.py:1 pearl.sub.leaf -> pearl.sub",
        "pearl/sub/leaf.py:2 pearl.sub.leaf -> pearl.sub.leaf",
        "pearl/sub/leaf.py:3 pearl.sub.leaf -> pearl.sub",
        "pearl/sub/leaf.py:6 pearl.sub.leaf -> pearl.other",
    ]
    # leaf -> sub (the package __init__) -> leaf is a cycle; leaf importing itself is not reported
    assert find_cycles(graph)[0] == "cycle among 2 modules: pearl.sub, pearl.sub.leaf"


def test_tarjan_on_a_small_graph():
    adjacency = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "a"}}
    components = strongly_connected_components(adjacency)
    assert sorted(components) == [["a", "b", "c"], ["d"], ["e"]]
    assert _shortest_cycle(adjacency, ["a", "b", "c"]) == ["a", "b", "c", "a"]
