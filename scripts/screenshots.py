"""The README's screenshots from a results database: docs/img/report.png and docs/img/app.png in Chromium 1400 px wide,
and docs/img/answer.txt, the answer sentence of the job they show.

    .venv/bin/python scripts/screenshots.py                       # from results/loopeval.sqlite, the main job's
    .venv/bin/python scripts/screenshots.py --db other.sqlite --out docs/img
    .venv/bin/python scripts/screenshots.py --db lab.sqlite --lab  # the recurrence lab's two figures (docs/lab.md)

The database is copied first and only the copy is read and served, so the job's own file is never written.
answer.txt is the sentence the report opens on (`analysis.answer` on the newest set, default measure); the README
quotes it, and tests/test_readme_answer.py fails when the two differ, so the README's pictures and its text show
one winner. Needs the test dependencies (`scripts/install.sh --test`: Playwright, Debian's Chromium).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from analysis.answer import answer  # noqa: E402
from analysis.names import default_measure  # noqa: E402
from analysis.points import accuracy_points  # noqa: E402
from db import queries  # noqa: E402
from db.headline import SUITE  # noqa: E402
from db.session import open_existing  # noqa: E402
from harness.report import write_report  # noqa: E402
from tests.support.browser import (  # noqa: E402
    LAB_FIGURES,
    VIEWPORT,
    launch,
    screenshot_app,
    screenshot_figure,
    screenshot_report,
    served_app,
)

ANSWER_FILE = "answer.txt"


def opening_answer(url: str) -> str:
    """The answer sentence the report opens on: the newest evaluation set's points, the first measure they have."""
    engine = open_existing(url)
    try:
        set_id = queries.latest_set(engine)
        points = accuracy_points(engine, set_id, SUITE)
        return answer(points, default_measure(points))
    finally:
        engine.dispose()


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("results/loopeval.sqlite"), help="a SQLite results file")
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--lab", action="store_true", help="write the depth-extrapolation and loop-probe figures")
    args = parser.parse_args()
    if not args.db.is_file():
        parser.error(f"no results database at {args.db}: run `loopeval run` first, or pass --db")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, sync_playwright() as playwright:
        copy = Path(scratch) / "results.sqlite"
        shutil.copy(args.db, copy)
        url = f"sqlite:///{copy}"
        report = write_report(url, Path(scratch) / "report.html")
        browser = launch(playwright)
        if args.lab:
            for figure_id, name in LAB_FIGURES.items():
                print(screenshot_figure(browser.new_page(viewport=VIEWPORT), report, figure_id, args.out / name))
        else:
            print(screenshot_report(browser.new_page(viewport=VIEWPORT), report, args.out / "report.png"))
            with served_app(url) as app_url:
                print(screenshot_app(browser.new_page(viewport=VIEWPORT), app_url, args.out / "app.png"))
            (args.out / ANSWER_FILE).write_text(opening_answer(url) + "\n")
            print(args.out / ANSWER_FILE)
        browser.close()


if __name__ == "__main__":
    main()
