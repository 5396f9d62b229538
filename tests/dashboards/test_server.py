"""The dashboard server imports what the pages need before it listens, then runs Streamlit's command line."""

from __future__ import annotations

import subprocess
import sys

from sparkgate.dashboards.cli import APP, streamlit_command
from tests.dashboards.page_imports import page_imports


def test_the_warm_up_imports_every_module_the_pages_import_beyond_streamlit_and_the_stdlib():
    wanted = [m for m in page_imports() if m.split(".")[0] not in sys.stdlib_module_names | {"streamlit"}]
    code = (
        "import sys\nfrom sparkgate.dashboards import server\nserver.warm()\n"
        f"print([m for m in {wanted!r} if m not in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
    assert "sparkgate.dashboards.cost_tables" in wanted and "altair" not in sys.stdlib_module_names


def test_the_dashboard_command_runs_streamlit_through_the_server_module():
    argv = streamlit_command(["--db", "x.duckdb"])
    assert argv[1:5] == ["-m", "sparkgate.dashboards.server", "run", str(APP)]
