"""The dashboards never load torch: every figure they show is read from stored rows (a step records its
table's prediction), so a page's first render does not pay torch's import (over a second on a small host)."""

from __future__ import annotations

import subprocess
import sys

from tests.dashboards.page_imports import page_imports


def test_the_app_and_every_page_import_without_torch():
    modules = page_imports()
    assert "sparkgate.dashboards.cost_tables" in modules  # the page that once pulled torch in is covered
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"
