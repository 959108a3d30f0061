"""The lazy façades (``fuselab``, ``fuselab.bench``, ``fuselab.cuda``, ``fuselab.dlrm``) resolve each public name
through importlib at first use; under ``if TYPE_CHECKING:`` they import the same names from the same modules, so
that type checkers and "go to definition" land on the definitions; the package ships ``py.typed``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACADES = ("fuselab", "fuselab.bench", "fuselab.cuda", "fuselab.dlrm")


def _type_checking_imports(module: str) -> dict[str, str]:
    """name -> module of the ``from M import name as name`` statements under ``if TYPE_CHECKING:``."""
    path = ROOT / "src" / Path(*module.split(".")) / "__init__.py"
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.unparse(stmt)
                for alias in stmt.names:
                    assert alias.asname == alias.name, f"{module}: {ast.unparse(stmt)} is no explicit re-export"
                    found[alias.name] = stmt.module
    return found


@pytest.mark.parametrize("module", FACADES)
def test_type_checking_imports_match_the_lazy_names(module):
    package = importlib.import_module(module)
    lazy = dict(package._API)
    lazy.update({name: module for name in getattr(package, "_SUBMODULES", ())})
    assert _type_checking_imports(module) == lazy


def test_names_resolve_to_their_definitions():
    import fuselab
    from fuselab.ops.rope.op import apply_rope

    assert fuselab.apply_rope is apply_rope and apply_rope.__module__ == "fuselab.ops.rope.op"


def test_package_ships_py_typed():
    assert (ROOT / "src" / "fuselab" / "py.typed").is_file()
    lines = (ROOT / "pyproject.toml").read_text().splitlines()
    data = lines[lines.index("[tool.setuptools.package-data]") + 1]
    assert data.startswith("fuselab = [") and '"py.typed"' in data
