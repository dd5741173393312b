"""The accuracy-against-memory figure in headless Chromium draws every point at the memory its run stored: no marker
is moved aside to make room for another, whatever lies on top of it (exit thresholds that hold and score alike)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from db.store import Store
from harness.report import write_report
from tests.support.browser import CHROMIUM, VIEWPORT, launch, open_report
from tests.support.stored_runs import store_run

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (scripts/install.sh --test installs Debian's chromium)"
    ),
]

# Each drawn marker of the plot as [run id (from its hover), pixel x of its centre, the x axis's data -> pixel of 0 and
# of 1]: the pixel comes from the SVG Plotly drew, matched to its trace by order (one `.trace` group per trace).
_MARKERS = """() => {
  const gd = document.getElementById('accuracy-memory'), axis = gd._fullLayout.xaxis;
  const groups = gd.querySelectorAll('.scatterlayer .trace');
  return gd._fullData.flatMap((trace, k) => !trace.customdata ? [] :
    [...groups[k].querySelectorAll('path.point')].map((point, j) => [
      trace.customdata[j][3], Number(point.getAttribute('transform').match(/translate\\(([-\\d.]+),/)[1]),
      axis.l2p(0), axis.l2p(1)]));
}"""


@pytest.fixture()
def report(tmp_path: Path) -> Path:
    """Runs in several configurations with coincident points: two exit thresholds holding and scoring alike beside the
    plain run, a bfloat16 configuration, and a second model."""
    store = Store.open(str(tmp_path / "positions.sqlite"))
    store_run(store, [1.0, 1.0, 1.0, 0.0])
    store_run(store, [1.0, 1.0, 0.0, 0.0], overrides={"dtype": "bfloat16"}, kv=500_000)
    for threshold in (0.5, 0.9):
        store_run(store, [1.0, 1.0, 0.0, 0.0], exit_threshold=threshold, exit_criterion="gate")
    store_run(store, [1.0, 0.0, 0.0, 0.0], model="zoo:melt-tiny", kv=100_000)
    with store.engine.connect() as conn:
        measures = {row[0] for row in conn.execute(text("SELECT DISTINCT measure FROM memory_peaks"))}
    store.close()
    assert {"weights_bytes", "kv_bytes_allocated"} <= measures, "the report opens on weights + KV"
    return write_report(f"sqlite:///{tmp_path / 'positions.sqlite'}", tmp_path / "report.html")


def _stored_memory(report: Path) -> dict[int, float]:
    """Each run's weights + KV cache peak in bytes, summed from its stored peaks in plain SQL."""
    store = Store.open(str(report.with_name("positions.sqlite")))
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT run_id, SUM(value) FROM memory_peaks WHERE measure IN ('weights_bytes', 'kv_bytes_allocated')"
                    " GROUP BY run_id HAVING COUNT(*) = 2"
                )
            ).all()
    finally:
        store.close()
    return {int(run_id): float(total) for run_id, total in rows}


def test_every_marker_is_drawn_at_its_runs_stored_memory(report: Path) -> None:
    from playwright.sync_api import sync_playwright

    stored = _stored_memory(report)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_page(viewport=VIEWPORT)
        open_report(page, report)
        title = page.locator("#accuracy-memory .xtitle").text_content() or ""
        markers = page.evaluate(_MARKERS)
        browser.close()
    scale = float(re.search(r"decimal \w+, (1e\d+) bytes", title).group(1))
    drawn = {}
    for runs, pixel, at_zero, at_one in markers:
        (run_id,) = re.fullmatch(r"run (\d+)", runs).groups()
        drawn[int(run_id)] = (pixel - at_zero) / (at_one - at_zero) * scale  # the pixel back in bytes
    assert sorted(drawn) == sorted(stored) and len(drawn) == 5, "one marker per run"
    pixel_bytes = scale / (markers[0][3] - markers[0][2])  # what one pixel spans
    for run_id, held in stored.items():
        assert drawn[run_id] == pytest.approx(held, abs=pixel_bytes), f"run {run_id} drawn away from its memory"
    exits = [drawn[run_id] for run_id in (3, 4)]
    assert exits[0] == exits[1] == pytest.approx(stored[1], abs=pixel_bytes), "coincident points stay together"
