"""Drive the dashboards in headless Chromium: the browser tests and the README screenshots share this code.

Debian's /usr/bin/chromium is used through Playwright's `executable_path` (browser downloads fail
offline). scripts/screenshots.py writes the committed screenshots with these functions.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}
POINTS = "#accuracy-memory .scatterlayer path.point"  # one SVG path per plotted (model, loops) marker
LOOPEVAL = Path(sys.executable).with_name("loopeval")
# Stored as a model output by the tests: it must be displayed as text and never run.
PAYLOAD = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


def launch(playwright: Any) -> Any:
    """Debian's Chromium, headless, with every background network feature off."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def record(page: Any) -> dict[str, list[str]]:
    """Collect the page's requests, uncaught errors and console errors while it runs."""
    seen: dict[str, list[str]] = {"requests": [], "errors": []}
    page.on("request", lambda request: seen["requests"].append(request.url))
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    page.on("console", lambda message: seen["errors"].append(message.text) if message.type == "error" else None)
    return seen


def open_report(page: Any, report: Path) -> None:
    """Load the static report from a file URL and wait until the accuracy plot has its markers."""
    page.goto(report.resolve().as_uri())
    page.wait_for_selector(POINTS, timeout=30_000)


def open_app(page: Any, url: str) -> None:
    """Load the served app and wait for the callbacks to fill the accuracy plot and the sample table."""
    page.goto(url)
    page.wait_for_selector(POINTS, timeout=60_000)
    page.wait_for_selector("#samples td", timeout=60_000)


def point_count(page: Any) -> int:
    return page.locator(POINTS).count()


def x_axis_title(page: Any) -> str:
    return page.locator("#accuracy-memory .xtitle").text_content() or ""


# Every drawn plot's traces as [plot element id, trace name, colour]: a line's colour where it draws a line, else its
# markers' (one colour for the trace), as Plotly resolved them.
_TRACE_COLOURS = """() => [...document.querySelectorAll('.js-plotly-plot')].flatMap((gd) => (gd._fullData || []).map((t) =>
  [gd.closest('[id]').id, t.name, (t.mode || '').includes('lines') ? t.line.color : t.marker && t.marker.color]))"""
# Every pair of a plot's annotation (notes, footnotes) and axis title whose boxes on the page intersect.
_OVERLAPS = """() => {
  const box = (e) => e.getBoundingClientRect();
  const meet = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const found = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const titles = [...gd.querySelectorAll('.infolayer text')].filter((t) => /^[xy]\\d*title$/.test(t.getAttribute('class')));
    for (const note of gd.querySelectorAll('.annotation-text-g')) for (const title of titles)
      if (meet(box(note), box(title)) && box(title).width > 0) found.push([gd.closest('[id]').id, note.textContent, title.textContent]);
  }
  return found;
}"""


def trace_colours(page: Any) -> list[tuple[str, str, Any]]:
    return [tuple(row) for row in page.evaluate(_TRACE_COLOURS)]


def overlapping_texts(page: Any) -> list[tuple[str, str, str]]:
    """(plot id, annotation, axis title) for each annotation drawn over an axis title, in every plot of the page."""
    return [tuple(row) for row in page.evaluate(_OVERLAPS)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served_app(db_url: str, timeout: float = 90.0) -> Iterator[str]:
    """Run `loopeval dashboard --serve` (the real command, default host) on a free port; yield its URL."""
    with served_process(db_url, timeout=timeout) as (url, _):
        yield url


@contextlib.contextmanager
def served_process(db_url: str, *options: str, timeout: float = 90.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """`loopeval dashboard --serve` with `options` on a free port, once it answers: its URL and process."""
    port = free_port()
    process = subprocess.Popen(
        [str(LOOPEVAL), "dashboard", "--serve", "--db", db_url, "--port", str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"loopeval dashboard --serve exited {process.returncode}: {process.stdout.read()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the app did not answer at {url} within {timeout:.0f} s") from None
                time.sleep(0.3)
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def screenshot_report(page: Any, report: Path, png: Path) -> Path:
    """The top of the report (the accuracy-per-GB picture), as the README shows it."""
    open_report(page, report)
    page.screenshot(path=str(png))
    return png


def screenshot_app(page: Any, url: str, png: Path) -> Path:
    """The app's filters and accuracy plot, as the README shows it."""
    open_app(page, url)
    page.screenshot(path=str(png))
    return png


def screenshot_figure(page: Any, report: Path, figure_id: str, png: Path) -> Path:
    """One figure of the report (`depth`, `probe-values`, ...) on its own, as the recurrence lab section shows it."""
    open_report(page, report)
    figure = page.locator(f"#{figure_id}")
    figure.locator(".main-svg").first.wait_for(timeout=30_000)
    figure.screenshot(path=str(png))
    return png


LAB_FIGURES = {"depth": "depth-extrapolation.png", "probe-values": "loop-probes.png"}
