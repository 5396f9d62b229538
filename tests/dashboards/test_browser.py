"""A real browser: Debian's chromium, driven by Playwright, against ``streamlit run`` on loopback.

Screenshots of every page go to ``$SPARKGATE_TEST_ARTIFACTS`` (default
``test-artifacts/dashboards`` in the repository, which git ignores). With
``SPARKGATE_UPDATE_DOCS=1`` the Rollout page's screenshot also replaces
``docs/rollout-page.png``, the picture the README shows.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.dashboards.cli import streamlit_command
from sparkgate.demo.fleet import free_port

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("SPARKGATE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboards")
)
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "rollout-page.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
# Page title -> a text of its last section: the script has run to the end once it is shown.
PAGES = {
    "Calibration": "Conditional ECE per depth",
    "Acceptance": "Window lengths chosen per mode",
    "Tiers and cost": "Latency by load bucket",
    "Fleet": "measured over each replica's last",
}

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)",
)


@pytest.fixture
def server(fixture_store):
    port = free_port()
    command = streamlit_command(
        ["--snapshot-dir", str(fixture_store.snapshot_dir), "--policy", str(fixture_store.policy_path)],
        "127.0.0.1",
        port,
    )
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # Streamlit answers its health check once the server is up
            if process.poll() is not None:
                raise RuntimeError(f"streamlit exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=1).text == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("streamlit did not answer its health check")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


# Tables draw on a canvas and charts through Vega once their code has loaded (a skeleton shows until
# then), after the script finished.
DRAWN = """() => !document.querySelector('[data-testid="stStatusWidget"], [data-testid="stSkeleton"]')
    && [...document.querySelectorAll('[data-testid="stDataFrame"]')].every(e => e.querySelector('canvas'))
    && [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].every(e => e.querySelector('canvas, svg'))
    && [...document.querySelectorAll('[data-testid="stCode"]')].every(e => e.querySelector('code'))"""


def finished(page, text: str) -> None:
    """Wait until ``text`` is shown, the app no longer runs its script and every table and chart is drawn."""
    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
    page.wait_for_function(DRAWN, timeout=60_000)


def test_pages_in_chromium(server, fixture_store):
    from playwright.sync_api import sync_playwright

    with Store(fixture_store.db) as store:
        gate = next(r for r in ledger.decisions(store)[-1].reasons if r.get("gate") == "survival_ece")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2800})
            page.goto(server)
            finished(page, "Advance after")
            metric = page.get_by_test_id("stMetric").filter(has_text="Phase")
            assert "fallback" in metric.inner_text()
            # The judged stage's comparison intervals and its switchback schedule, drawn after the rollback.
            for caption in ("Treatment over control measured at the same time", "Revision 2: each replica alternates"):
                page.get_by_text(caption, exact=False).first.wait_for(timeout=10_000)
            page.screenshot(path=str(ARTIFACTS / "rollout.png"), full_page=True)
            if os.environ.get("SPARKGATE_UPDATE_DOCS") == "1":
                page.set_viewport_size({"width": 1400, "height": 1100})
                page.screenshot(path=str(DOCS_SCREENSHOT))
                page.set_viewport_size({"width": 1400, "height": 2800})
            for title, marker in PAGES.items():
                page.get_by_test_id("stSidebarNav").get_by_text(title, exact=True).click()
                finished(page, marker)
                page.screenshot(path=str(ARTIFACTS / f"{title.split()[0].lower()}.png"), full_page=True)
                if title == "Tiers and cost":
                    page.get_by_text("What clients saw", exact=False).first.wait_for(timeout=10_000)
                if title == "Calibration":
                    worst = page.get_by_test_id("stMetric").filter(has_text="Worst depth ECE").inner_text()
                    assert f"{gate['value']:.4f}" in worst  # the per-depth ECE the gate judged
        finally:
            browser.close()
    assert all(
        (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
        for name in ("rollout", "calibration", "acceptance", "tiers", "fleet")
    )
