"""The HTML report renders in headless Chromium, offline, with no console errors."""

import shutil
import tempfile
from pathlib import Path

import pytest

from tailscope.analysis.events import ANALYSIS_COLUMNS
from tailscope.analysis.pipeline import analyse
from tailscope.recording import load_recording
from tailscope.report.html import expected_chart_count, write_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
OUT = Path(__file__).resolve().parent / "out"


def _driver(profile: str):
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip(f"chromium/chromedriver not installed ({CHROMIUM}, {CHROMEDRIVER})")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1200,4000",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def test_report_renders_in_chromium(recordings):
    rec = load_recording(recordings["runnable"], list(ANALYSIS_COLUMNS))
    result = analyse(rec.columns, rec.meta, nulls=rec.nulls, kind_names=rec.kind_names, segment_s=5)
    OUT.mkdir(exist_ok=True)
    page = write_report(result, OUT / "report.html")
    want = expected_chart_count(result)
    assert want >= 7
    with tempfile.TemporaryDirectory(prefix="ts-chrome-") as profile:
        drv = _driver(profile)
        try:
            drv.set_page_load_timeout(60)
            drv.get(page.as_uri())
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(drv, 30).until(
                lambda d: len(d.find_elements("css selector", ".js-plotly-plot .main-svg")) >= want
            )
            plots = drv.find_elements("css selector", ".js-plotly-plot")
            assert len(plots) == want
            assert len(drv.find_elements("css selector", ".js-plotly-plot .main-svg")) >= want
            assert "runnable wait" in drv.find_element("css selector", ".headline").text
            severe = [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]
            assert not severe, severe
            drv.save_screenshot(str(OUT / "report.png"))
        finally:
            drv.quit()
