"""The import graph of ``src/fuselab``: no import cycle among fuselab modules (imports inside functions included) and
no import upward through the layers. Parsed with ``ast``: nothing is imported. Imports under ``if TYPE_CHECKING:``
never run (the lazy façades name what they resolve to there, for type checkers) and are no edges."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: the layers, bottom first: a module may import its own layer and those below it. A module belongs to the layer of
#: its longest listed prefix (``fuselab`` alone is the package's own ``__init__``: it resolves names lazily, through
#: importlib, so it sits at the bottom where everything may import it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fuselab", "fuselab._io", "fuselab.backend", "fuselab.envinfo", "fuselab.testing", "fuselab.core")),
    ("reference", ("fuselab.reference",)),
    ("ops", ("fuselab.ops",)),
    ("nn/cuda", ("fuselab.nn", "fuselab.cuda", "fuselab.hf")),
    ("bench/profile", ("fuselab.bench", "fuselab.profile")),
    ("dlrm", ("fuselab.dlrm",)),
    # the lab's DLRM suite builds fuselab.dlrm models; the lab's registry loads it by name (importlib), not by import
    ("lab over dlrm", ("fuselab.bench.suites.dlrm",)),
    ("cli", ("fuselab.cli", "fuselab.__main__")),
]



def _modules() -> dict[str, Path]:
    """Every module of the fuselab package: dotted name -> file."""
    found = {}
    for path in sorted((SRC / "fuselab").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported fuselab module, line) of every import statement in ``path`` that can run, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = []
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # "from P import m" names module P.m when it is one, else a name of P
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # "import fuselab.x.y" of a name inside a module
                target = target.rpartition(".")[0]
            if target.startswith("fuselab") and target != name:
                edges.append((target, node.lineno))
    return edges


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer_of(module: str) -> int:
    best, level = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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


def test_every_module_has_a_layer():
    for name in MODULES:
        layer_of(name)


def test_no_import_cycles():
    graph = {name: sorted({t for t, _ in edges})
             for name, edges in GRAPH.items()}
    assert _cycles(graph) == []


def test_no_upward_imports():
    upward = [f"{MODULES[name].relative_to(SRC)}:{line}: {name} ({LAYERS[layer_of(name)][0]}) imports {target} "
              f"({LAYERS[layer_of(target)][0]})"
              for name, edges in GRAPH.items() for target, line in edges if layer_of(target) > layer_of(name)]
    assert upward == []


@pytest.mark.parametrize(("source", "expect"), [
    ({"a": ["b"], "b": ["c"], "c": ["a"]}, [["a", "b", "c"]]),
    ({"a": ["b"], "b": ["c"], "c": []}, []),
])
def test_cycle_finder(source, expect):
    """The checker itself finds a three-module loop and passes a chain."""
    assert _cycles(source) == expect


def test_type_checking_imports_are_no_edges():
    """The package's façade names upper layers under TYPE_CHECKING only (otherwise a base module importing ops)."""
    assert not {t for t, _ in GRAPH["fuselab"]} & {"fuselab.ops.rope", "fuselab.dlrm"}
    source = "if TYPE_CHECKING:\n    from a import b\nimport c\n"
    assert len(_type_checking_only(ast.parse(source))) > 0


def test_relative_and_function_imports_are_seen():
    """Imports inside functions and relative ones are edges (the checker cannot be blinded by either)."""
    assert "fuselab.ops.reduce.launch" in {t for t, _ in GRAPH["fuselab.ops.reduce.op"]}  # from . import launch
    assert "fuselab.bench.lab" in {t for t, _ in GRAPH["fuselab.cli"]}  # inside a function
