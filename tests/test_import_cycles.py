"""No import cycles in the package: the modules form layers, each importing only below it.

The graph is built with `ast` from every `import` statement in every module of blitzscale/:
- at module level, and under `if TYPE_CHECKING:` too: an annotation that needs the owner's
  class is still a dependency on it (a part that names its owner's class should name a
  port, a Protocol of the few operations it calls, instead);
- inside functions too: a lazy import is for what costs to load (torch, Triton, Ray), not a
  way to hide a cycle.
Not counted: the implicit import of a module's parent packages (importing `a.b.c` runs
`a/__init__` and `a/b/__init__`; counting those would make every package that re-exports
its modules a cycle), and `importlib.import_module` calls (the lazy package names of
blitzscale/lazy.py name their modules under TYPE_CHECKING, which counts).
`from pkg import name` depends on the module `pkg.name` if there is one, else on `pkg`.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import blitzscale

Graph = dict[str, dict[str, int]]  # module -> {module it imports: line of the first import}


def _module_names(root: Path, package: str) -> dict[str, Path]:
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: from the module's package, one level up per extra dot
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]


def import_graph(root: Path, package: str) -> Graph:
    """Every module of `package` (a folder under `root`) -> the package's modules it imports."""
    paths = _module_names(root, package)
    known = set(paths)
    graph: Graph = {}
    for module, path in paths.items():
        deps: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for dep in _imported(node, module, path.name == "__init__.py", known):
                    if dep in known and dep != module:
                        deps.setdefault(dep, node.lineno)
        graph[module] = deps
    return graph


def cycles(graph: Graph) -> list[tuple[list[str], list[str]]]:
    """Each group of modules that import each other (a strongly connected component of more
    than one module), sorted, with one cycle through it (a -> b -> ... -> a)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [(sorted(group), _cycle_through(graph, group)) for group in groups]


def _cycle_through(graph: Graph, group: set[str]) -> list[str]:
    """The shortest cycle from the group's first module back to it, within the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return [*paths[v], start]
                if w in group and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # (a component always has one)


def _describe(graph: Graph, group: list[str], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return f"{', '.join(group)} import each other: " + " -> ".join([*steps, cycle[-1]])


def test_the_package_has_no_import_cycles() -> None:
    root = Path(blitzscale.__file__).parent.parent
    graph = import_graph(root, "blitzscale")
    assert len(graph) > 100  # (the walk found the package)
    found = [_describe(graph, group, cycle) for group, cycle in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_cycles_behind_type_checking_and_in_functions_are_found(tmp_path: Path) -> None:
    """The checker itself: a cycle through an annotation-only import, one through a
    function-local import, and a parent package re-exporting its modules (no cycle)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg.a import A\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "b.py": "from pkg import a\nclass B: ...\n",
        "sub/__init__.py": "from .c import C\n",
        "sub/c.py": "class C: ...\ndef f():\n    from ..sub import d\n",
        "sub/d.py": "from pkg.sub.c import C\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a": 1} and graph["pkg.sub"] == {"pkg.sub.c": 1}
    assert sorted(cycles(graph)) == [
        (["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"]),
        (["pkg.sub.c", "pkg.sub.d"], ["pkg.sub.c", "pkg.sub.d", "pkg.sub.c"]),
    ]
    said = _describe(graph, ["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"])
    assert said == "pkg.a, pkg.b import each other: pkg.a (line 3) -> pkg.b (line 1) -> pkg.a"
