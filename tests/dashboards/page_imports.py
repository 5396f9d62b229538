"""The modules the dashboard app and its pages import, read from their source (for the import tests)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import sparkgate.dashboards

PACKAGE = Path(sparkgate.dashboards.__file__).parent


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # a module imported by name
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name imported from a module, not a module
        return False


def page_imports() -> list[str]:
    """Every module ``app.py`` and ``views/*.py`` import by absolute name."""
    scripts = [PACKAGE / "app.py", *sorted((PACKAGE / "views").glob("*.py"))]
    return sorted(m for m in set().union(*map(_imported, scripts)) - {"__future__"} if _is_module(m))
