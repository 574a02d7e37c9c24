"""The import graph: no circles, and every import goes down the house's layers.

No import circles: the project's modules import each other along a graph without cycles.

Every import statement of every module of ``rescue`` is read from its source with ``ast``, those inside functions included
(a lazy import is still a circle: the two modules cannot be understood, tested or moved
apart), except under ``if TYPE_CHECKING:`` (never executed). An import names the module it
loads: ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``;
``import a.b`` is an edge to ``a.b``. A cycle fails the test with its modules in order and
the line of each import that closes it.

Layers (``LAYERS``, lowest first): a module imports modules of its own package, or of a
lower layer; never of a higher layer, and never of another package of its own layer (so the
Miles and slime adapters share only what lives below them, in the core). The core is every
module directly under ``rescue/`` but the command (``rescue.cli``) and what runs it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rescue", "filters", "swe_smith_tasks")

#: module -> {imported module -> first line that imports it}
Graph = Mapping[str, Mapping[str, int]]


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> source file."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
    return name == "TYPE_CHECKING"


def imports(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The project modules ``name`` (source ``path``) imports, each with its first line."""
    out: dict[str, int] = {}

    def edge(target: str, line: int) -> None:
        while target and target not in known:  # ``import a.b.attr`` style: the module part
            target = target.rpartition(".")[0]
        if target and target != name:
            out.setdefault(target, line)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    edge(alias.name, child.lineno)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: against this module's package
                    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join([*pkg, base] if base else pkg)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    edge(sub if sub in known else base, child.lineno)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, dict[str, int]]:
    found = modules(root, packages)
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle (modules in import order, first repeated at the end) per strongly
    connected component of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [_cycle_in(graph, set(c)) for c in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    first = min(component)
    parent: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, {})):
                if child not in component:
                    continue
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(parent[path[-1]])
                    return [*reversed(path), first]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle in the component {sorted(component)}")


def describe(graph: Graph, cycle: list[str]) -> str:
    """``a (line 3) -> b (line 9) -> a``: each import that closes the circle, with its line."""
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_the_project_has_no_import_cycle():
    graph = import_graph()
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles:\n  " + "\n  ".join(found)


def test_the_graph_reads_the_imports_the_sources_make():
    """The walk sees module-level and lazy imports, and ``from pkg import module``."""
    graph = import_graph()
    assert {"rescue.sim.config", "rescue.sim.engine"} <= set(graph["rescue.sim.runner"])
    assert "rescue.sim.plots" in graph["rescue.sim.runner"]  # inside a function
    assert "rescue.judge.checks" in graph["rescue.sim.summary"]  # from rescue.judge import checks
    assert "rescue.miles.pace" in graph["rescue.miles.buffer"]  # the buffer builds the queue


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_planted_lazy_cycle_is_found_and_named(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": "import os\n\n\ndef f():\n    from pkg import c\n    return c\n",
            "pkg/c.py": "def g():\n    from pkg.a import A\n",
            "pkg/d.py": "from pkg.a import A\n",  # into the cycle, not on it
        },
    )
    graph = import_graph(root, ("pkg",))
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert (
        describe(graph, found[0]) == "pkg.a (line 1) -> pkg.b (line 5) -> pkg.c (line 2) -> pkg.a"
    )


@pytest.mark.parametrize(
    "b_source",
    [
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
        "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import A\n",
    ],
)
def test_imports_only_for_type_checkers_make_no_cycle(tmp_path, b_source):
    root = _package(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import B\n", "pkg/b.py": b_source},
    )
    assert cycles(import_graph(root, ("pkg",))) == []


def test_relative_imports_and_package_attributes_resolve(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.sub.x import X\n",
            "pkg/sub/__init__.py": "from .x import X\n",
            "pkg/sub/x.py": "from .. import VERSION\n",
        },
    )
    graph = import_graph(root, ("pkg",))
    assert graph["pkg.sub"] == {"pkg.sub.x": 1}
    assert graph["pkg.sub.x"] == {"pkg": 1}
    assert cycles(graph) == [["pkg", "pkg.sub.x", "pkg"]]


#: The house's layers, lowest first (module docstring).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rescue",),
    ("rescue.judge",),
    ("rescue.sim", "rescue.replay", "rescue.rlvr"),
    ("rescue.envs", "rescue.oracle"),
    ("rescue.miles", "rescue.slime", "filters", "swe_smith_tasks"),
    # the rehearsal by job: the tiny model below the stand-ins that serve it and the checks
    ("rescue.rehearsal", "rescue.rehearsal.tiny"),
    ("rescue.rehearsal.standins", "rescue.rehearsal.verdict"),
    ("rescue.questions", "rescue.rehearsal.miles"),
    ("rescue.cli",),
    # what runs the command: ``python -m rescue``, and the questions' rehearsal stages
    ("rescue.__main__", "rescue.questions.rehearsal"),
)


def unit(module: str) -> str:
    """The package of ``LAYERS`` a module belongs to: the longest that contains it."""
    named = [p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")]
    return max(named, key=len)


def layer(module: str) -> int:
    u = unit(module)
    return next(i for i, names in enumerate(LAYERS) if u in names)


def wrong_way(graph: Graph) -> list[str]:
    """Every import from a module to a higher layer, or to another package of its layer."""
    out = []
    for a, targets in sorted(graph.items()):
        for b, line in sorted(targets.items()):
            if unit(a) == unit(b) or layer(b) < layer(a):
                continue
            out.append(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)}) at line {line}")
    return out


def test_every_import_goes_down_the_layers():
    found = wrong_way(import_graph())
    assert not found, "imports against the layers:\n  " + "\n  ".join(found)


def test_the_layers_name_every_package_and_refuse_a_planted_upward_import():
    graph = import_graph()
    assert {unit(m) for m in graph} == {p for names in LAYERS for p in names}
    planted = {**graph, "rescue.judge.runs": {**graph["rescue.judge.runs"], "rescue.sim.config": 7}}
    assert wrong_way(planted) == [
        "rescue.judge.runs (layer 1) imports rescue.sim.config (layer 2) at line 7"
    ]
    sideways = {**graph, "rescue.slime.checks": {"rescue.miles.reward": 3}}
    assert wrong_way(sideways) == [
        "rescue.slime.checks (layer 4) imports rescue.miles.reward (layer 4) at line 3"
    ]
    jobs = {**graph, "rescue.rehearsal.tiny.policy": {"rescue.rehearsal.verdict.report": 9}}
    jobs["rescue.rehearsal.verdict.checks"] = {"rescue.rehearsal.standins.engine": 4}
    assert wrong_way(jobs) == [
        "rescue.rehearsal.tiny.policy (layer 5) imports rescue.rehearsal.verdict.report"
        " (layer 6) at line 9",
        "rescue.rehearsal.verdict.checks (layer 6) imports rescue.rehearsal.standins.engine"
        " (layer 6) at line 4",
    ]
