"""The dashboard server process: import what the pages need, then run Streamlit's own command line here.

Streamlit runs a page's script in its server process, importing its modules on
the first visit. Pandas, Altair and the page helpers take about a second to
import on a small host, which the first visitor would wait through; importing
them before the server listens moves that second to the server's start.
``sparkgate dashboard`` runs ``python -m sparkgate.dashboards.server run APP …``.
"""

from __future__ import annotations

import importlib
import sys
import time

# What the pages import beyond Streamlit (a test keeps this list complete).
PAGE_MODULES = (
    "pandas",
    "altair",
    "sparkgate.controller.address",
    "sparkgate.controller.rollout",
    "sparkgate.dashboards.charts",
    "sparkgate.dashboards.context",
    "sparkgate.dashboards.cost_tables",
    "sparkgate.dashboards.data",
    "sparkgate.dashboards.judged",
    "sparkgate.dashboards.requests",
    "sparkgate.dashboards.series",
    "sparkgate.dashboards.steps",
)


def warm() -> float:
    """Import ``PAGE_MODULES``; returns the seconds it took."""
    start = time.perf_counter()
    for name in PAGE_MODULES:
        importlib.import_module(name)
    return time.perf_counter() - start


def main() -> None:
    warm()
    from streamlit.web.cli import main as streamlit_main

    sys.argv[0] = "streamlit"
    streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    main()
