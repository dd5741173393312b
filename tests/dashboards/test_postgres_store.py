"""One Postgres store shared by three `loopeval run` processes at once, read by `loopeval results --json`,
the static report and the served app (in headless Chromium): what a lab sharing one store does."""

from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy.engine import make_url

from tests.support.browser import CHROMIUM, LOOPEVAL, VIEWPORT, launch, open_app, point_count, served_app

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUNS = [  # three writers: a plain model, and two looped ones at their own loop counts
    ["--model", "preset:qwen3-tiny"],
    ["--model", "preset:ouro-tiny", "--loops", "2"],
    ["--model", "preset:melt-tiny", "--loops", "1"],
]
COMMON = [
    "--tasks",
    "addition,lookup",
    "--limit",
    "4",
    "--samples",
    "1",
    "--max-new-tokens",
    "3",
    "--batch-size",
    "1",
    "--no-report",
]


def test_three_runs_write_one_postgres_store_at_once_and_every_reader_sees_them(postgres_url: str, tmp_path) -> None:
    procs = [
        subprocess.Popen(
            [str(LOOPEVAL), "run", *args, *COMMON, "--db", postgres_url],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in RUNS
    ]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], results
    password = make_url(postgres_url).password
    assert all(password not in out + err for out, err in results), "the password is never printed"

    listed = subprocess.run(
        [str(LOOPEVAL), "results", "--json", "--db", postgres_url], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert sorted((r["model"], r["loops"], r["status"], r["n_samples"]) for r in runs) == [
        ("preset:melt-tiny", 1, "finished", 8),
        ("preset:ouro-tiny", 2, "finished", 8),
        ("preset:qwen3-tiny", None, "finished", 8),
    ]
    assert len({r["sweep_id"] for r in runs}) == 3 and all(r["metrics"]["all"] and r["memory"]["rss"] for r in runs)

    report = tmp_path / "report.html"
    drawn = subprocess.run(
        [str(LOOPEVAL), "dashboard", "--db", postgres_url, "--out", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert drawn.returncode == 0, drawn.stderr
    html = report.read_text(encoding="utf-8")
    assert all(model in html for model in ("preset:qwen3-tiny", "preset:ouro-tiny", "preset:melt-tiny"))

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: the served app was not opened in a browser")
    from playwright.sync_api import sync_playwright

    with served_app(postgres_url) as url, sync_playwright() as playwright:
        browser = launch(playwright)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        open_app(page, url)
        assert point_count(page) == 3  # one accuracy-per-GB point per (model, loops), read live from Postgres
        browser.close()
