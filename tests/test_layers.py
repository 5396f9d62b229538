"""Imports go one way: every arrow between layers must be in docs/design.md §1's table, and no
module imports itself back through others. Imports are read from the source (every ``import``
statement, those inside functions included), so a lazy import is checked like any other."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYER_FOLDERS = ("verify_runtime", "policies", "collectors", "controller", "dashboards")
GENERIC = frozenset(LAYER_FOLDERS)  # never importable as top-level names


@dataclass(frozen=True)
class Arrow:
    module: str  # importing module, e.g. sparkgate.controller.gates
    target: str  # imported module, e.g. sparkgate.policies.rollout
    line: int


def layer_table(design: Path) -> dict[str, tuple[str, ...]]:
    """layer -> what it may import (layers or single modules), from the table between the markers."""
    text = design.read_text(encoding="utf-8")
    block = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    if block is None:
        raise AssertionError(f"{design}: no <!-- layers --> table")
    table = {}
    for row in block.group(1).strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        table[cells[0].strip("`")] = tuple(re.findall(r"`([^`]+)`", cells[2]))
    return table


def module_files(root: Path) -> dict[str, Path]:
    """Installed module name -> source file: ``sparkgate/`` itself, and each layer folder as ``sparkgate.<layer>``
    (``sparkgate/<layer>`` is a symlink to it; it is read once, through the folder)."""
    files = {}
    for folder, prefix in [(root / "sparkgate", "sparkgate"), *((root / f, f"sparkgate.{f}") for f in LAYER_FOLDERS)]:
        for path in folder.rglob("*.py"):
            parts = [*path.relative_to(folder).with_suffix("").parts]
            if prefix == "sparkgate" and parts[0] in LAYER_FOLDERS:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([prefix, *parts])] = path
    return files


def layer_of(module: str) -> str:
    """``sparkgate.controller.gates`` -> ``controller``; the root's own modules -> ``sparkgate``."""
    parts = module.split(".")
    if len(parts) > 1 and (parts[1] in LAYER_FOLDERS or parts[1] == "demo"):
        return "sparkgate.demo" if parts[1] == "demo" else parts[1]
    return "sparkgate"


def arrows(module: str, path: Path, known: set[str]) -> list[Arrow]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [Arrow(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Arrow(module, sub if sub in known else base, node.lineno))
    return found


def allowed(source_layer: str, target: str, table: dict[str, tuple[str, ...]]) -> bool:
    target_layer = layer_of(target)
    if target_layer == source_layer:
        return True
    relative = target.removeprefix("sparkgate.")
    return any(ok == target_layer or relative == ok or relative.startswith(ok + ".") for ok in table[source_layer])


def violations(root: Path) -> list[str]:
    """Every import in the tree at ``root`` that breaks the table or names a generic top-level package."""
    table = layer_table(root / "docs" / "design.md")
    files = module_files(root)
    problems = []
    for module, path in sorted(files.items()):
        source_layer = layer_of(module)
        if source_layer not in table:
            problems.append(f"{path}: layer {source_layer} is not in docs/design.md's table")
            continue
        for arrow in arrows(module, path, set(files)):
            top = arrow.target.split(".")[0]
            where = f"{path.relative_to(root)}:{arrow.line}"
            if top in GENERIC:
                problems.append(f"{where}: imports {arrow.target}; use sparkgate.{arrow.target}")
            elif top == "sparkgate" and arrow.target != "sparkgate" and not allowed(source_layer, arrow.target, table):
                problems.append(f"{where}: {source_layer} -> {arrow.target} is not an arrow of docs/design.md §1")
    return problems


def cycles(root: Path) -> list[list[str]]:
    """Import cycles among the project's modules (each listed once, from its smallest member)."""
    files = module_files(root)
    graph = {
        m: {a.target for a in arrows(m, p, set(files)) if a.target in files and a.target != m} for m, p in files.items()
    }
    found, seen = [], set()

    def walk(node: str, stack: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in stack:
                loop = stack[stack.index(nxt) :]
                key = frozenset(loop)
                if key not in seen:
                    seen.add(key)
                    found.append(loop)
            elif len(stack) < 12:
                walk(nxt, [*stack, nxt])

    for start in sorted(graph):
        walk(start, [start])
    return found


def test_every_import_follows_the_layer_table():
    assert violations(ROOT) == []


def test_no_module_imports_itself_back():
    # Package __init__ files that re-export are not counted: none of ours does.
    assert cycles(ROOT) == []


def test_tests_use_the_namespace_too():
    problems = []
    for path in (ROOT / "tests").rglob("*.py"):
        for arrow in arrows("tests.x", path, set()):
            if arrow.target.split(".")[0] in GENERIC:
                problems.append(f"{path.relative_to(ROOT)}:{arrow.line}: {arrow.target}")
    assert problems == []


@pytest.fixture
def tree(tmp_path):
    """A copy of the project's layer table and a few modules, to plant bad imports in."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text((ROOT / "docs" / "design.md").read_text(encoding="utf-8"))
    for folder in ("sparkgate", *LAYER_FOLDERS):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "policies" / "window.py").write_text("import math\n")
    (tmp_path / "collectors" / "schema.py").write_text("from sparkgate.policies import window\n")
    (tmp_path / "collectors" / "store.py").write_text("from .schema import x\n")
    (tmp_path / "verify_runtime" / "engine.py").write_text("from sparkgate.collectors.schema import StepRecord\n")
    return tmp_path


def test_a_clean_tree_passes(tree):
    assert violations(tree) == [] and cycles(tree) == []


def test_a_planted_wrong_way_import_is_caught(tree):
    (tree / "policies" / "bad.py").write_text("def f():\n    from sparkgate.controller import rollout\n")
    (tree / "verify_runtime" / "replica.py").write_text("from sparkgate.collectors import store\n")
    (tree / "controller" / "old.py").write_text("import collectors.schema\n")
    assert violations(tree) == [
        "controller/old.py:1: imports collectors.schema; use sparkgate.collectors.schema",
        "policies/bad.py:2: policies -> sparkgate.controller is not an arrow of docs/design.md §1",
        "verify_runtime/replica.py:1: verify_runtime -> sparkgate.collectors.store"
        " is not an arrow of docs/design.md §1",
    ]


def test_a_planted_cycle_is_caught(tree):
    (tree / "collectors" / "schema.py").write_text("def f():\n    from . import store\n")
    assert cycles(tree) == [["sparkgate.collectors.schema", "sparkgate.collectors.store"]]


def test_each_layer_is_linked_into_the_namespace():
    for folder in LAYER_FOLDERS:
        link = ROOT / "sparkgate" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), link
