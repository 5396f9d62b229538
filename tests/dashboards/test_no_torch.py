"""The dashboards never load torch: every figure they show is read from stored rows (a step records its
table's prediction), so a page's first render does not pay torch's import (over a second on a small host)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
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


def test_the_app_and_every_page_import_without_torch():
    scripts = [PACKAGE / "app.py", *sorted((PACKAGE / "views").glob("*.py"))]
    modules = sorted(m for m in set().union(*map(_imported, scripts)) - {"__future__"} if _is_module(m))
    assert "sparkgate.dashboards.cost_tables" in modules  # the page that once pulled torch in is covered
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"
