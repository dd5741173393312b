"""`loopeval dashboard` through the real command: the report file, and one line + exit 2 with nothing to show."""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from tests.support.browser import LOOPEVAL, PAYLOAD
from db.session import open_engine

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') skips it


def _dashboard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LOOPEVAL), "dashboard", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _one_error_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopeval: error:"), result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("serve", [False, True])
def test_missing_database_is_one_line_and_not_created(tmp_path: Path, serve: bool) -> None:
    missing = tmp_path / "nowhere" / "results.sqlite"
    result = _dashboard("--db", str(missing), *(["--serve", "--port", "1"] if serve else []), cwd=tmp_path)
    _one_error_line(result, str(missing))
    assert not missing.exists() and not missing.parent.exists()
    assert not any(tmp_path.rglob("report.html"))


def test_empty_databases_are_one_line(tmp_path: Path) -> None:
    blank = tmp_path / "blank.sqlite"
    blank.touch()
    _one_error_line(_dashboard("--db", str(blank), cwd=tmp_path), "no loopeval results")
    assert blank.stat().st_size == 0, "reading must not write"

    no_runs = tmp_path / "no_runs.sqlite"
    open_engine(str(no_runs)).dispose()  # the real schema, migrated, without a run
    _one_error_line(_dashboard("--db", str(no_runs), cwd=tmp_path), "no runs")

    not_sqlite = tmp_path / "notes.sqlite"
    not_sqlite.write_text("not a database\n" * 100)
    _one_error_line(_dashboard("--db", str(not_sqlite), cwd=tmp_path), "is not a SQLite database")


def test_report_is_one_self_contained_file_with_escaped_outputs(payload_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out" / "report.html"
    result = _dashboard("--db", payload_url, "--out", str(out), "--mkdir", cwd=tmp_path)  # out/ made as asked
    assert result.returncode == 0, result.stderr
    assert str(out.resolve()) in result.stdout
    html = out.read_text(encoding="utf-8")
    packed = re.search(r'<script id="plotlyjs" type="application/gzip;base64">([^<]*)</script>', html).group(1)
    assert gzip.decompress(base64.b64decode(packed)).decode() == get_plotlyjs(), "plotly.js is embedded, gzipped"
    assert len(html) < len(get_plotlyjs()), "and the page weighs less than plotly.js alone"
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", html, re.IGNORECASE), "no external resource"
    # The output travels as JSON data whose `<` and `>` are escaped, never as markup (the page sets it as text).
    samples = json.loads(re.search(r'<script id="sample-data" type="application/json">([^<]*)</script>', html).group(1))
    assert PAYLOAD not in html and PAYLOAD in [row[samples["columns"].index("output")] for row in samples["rows"]]


@pytest.mark.parametrize("log_requests", [False, True])
def test_the_app_is_served_by_a_production_server_logging_requests_only_when_asked(
    results_url: str, log_requests: bool
) -> None:
    """waitress, not Flask's development server (whose start-up warning tells the user not to use it so); its
    requests are quiet unless --log-requests, which prints one line per request answered."""
    import urllib.request

    from tests.support.browser import served_process

    options = ["--log-requests"] if log_requests else []
    with served_process(results_url, *options) as (url, process):
        with urllib.request.urlopen(url + "_dash-layout", timeout=30) as response:
            assert response.status == 200 and response.headers["Server"] == "waitress"
    log = process.stdout.read()
    assert "development server" not in log.lower() and "WARNING" not in log and "Traceback" not in log, log
    assert log.startswith("loopeval dashboard: serving "), log
    requests = [line for line in log.splitlines() if re.fullmatch(r"127\.0\.0\.1 GET /\S* \d{3}", line)]
    assert ("127.0.0.1 GET /_dash-layout 200" in requests) is log_requests and bool(requests) is log_requests, log
