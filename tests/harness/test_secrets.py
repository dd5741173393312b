"""No command prints a password given in a database URL, and every hint that reaches a database runs as printed.

Every command that takes `--db` runs here for real (in this process, through the CLI's `main`) against
the Postgres test server (its URLs carry a password), with the URL given on the command line and
through LOOPEVAL_DB; the password must appear in no output, error or report file, and each printed
hint (`show them: ...`, `continue with: ...`, `figure: ...`) is run through the shell exactly as
printed, with LOOPEVAL_DB set as the hint asks.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from tests.support import pg
from harness.cli import main
from harness.hints import has_password, with_db

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
TINY_RUN = ["run", "--model", "zoo:qwen3-tiny-small", "--tasks", "chain2", "--limit", "1", "--samples", "1"]


def _password(url: str) -> str:
    return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]


def _loopeval(
    capfd: pytest.CaptureFixture[str], *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command, run in this process (the evaluation stack is imported once, not once per command), its
    output caught at the file descriptors as a terminal would show it."""
    capfd.readouterr()
    with contextlib.chdir(cwd), mock.patch.dict(os.environ, env or {}):
        code = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([LOOPEVAL, *args], code, out, err)


def _secret_free(done: subprocess.CompletedProcess[str], secret: str) -> str:
    out = done.stdout + done.stderr
    assert secret not in out, f"the password was printed:\n{out}"
    return out


def _hint(out: str, label: str) -> str:
    """The command printed after `label` (up to the closing parenthesis or the end of the line)."""
    found = re.search(re.escape(label) + r" (.+?)(?:\)$|$)", out, re.M)
    assert found, f"no {label!r} hint in:\n{out}"
    return found.group(1)


def _run_hint(hint: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The hint through bash, as pasted: the note in parentheses after two spaces is not part of the command."""
    command = hint.split("  (")[0]
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **env}
    )


def test_hints_name_the_database_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPEVAL_DB", raising=False)
    assert with_db("loopeval results", None) == "loopeval results"
    assert with_db("loopeval results", "my runs.sqlite") == "loopeval results --db 'my runs.sqlite'"
    assert with_db("loopeval results", "postgresql://me@db/x") == "loopeval results --db postgresql://me@db/x"
    secret = with_db("loopeval results", "postgresql://me:s3cret@db/x")
    assert "s3cret" not in secret and secret.startswith('loopeval results --db "$LOOPEVAL_DB"  (first set LOOPEVAL_DB')
    monkeypatch.setenv("LOOPEVAL_DB", "postgresql://me:s3cret@db/x")
    assert (
        with_db("loopeval results", "postgresql://me:s3cret@db/x") == "loopeval results"
    )  # the variable reaches it again
    assert has_password("postgresql://me@db/x?password=s3cret") and has_password("postgresql://me:[broken@db/x")
    assert not has_password("results/loopeval.sqlite")


@pytest.mark.slow
def test_no_command_prints_the_password_and_every_hint_runs_as_printed(
    postgres_server: object, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.database("secrets")
    secret = _password(url)
    with_env = {"LOOPEVAL_DB": url}

    # --db URL on the command line: the hint names $LOOPEVAL_DB and says to set it
    done = _loopeval(capfd, *TINY_RUN, "--db", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = _secret_free(done, secret)
    hint = _hint(out, "show them:")
    assert '--db "$LOOPEVAL_DB"' in hint and "first set LOOPEVAL_DB" in hint
    shown = _run_hint(hint, tmp_path, with_env)
    assert shown.returncode == 0 and "zoo:qwen3-tiny-small" in _secret_free(shown, secret)
    assert secret not in (tmp_path / "results" / "report.html").read_text()

    # LOOPEVAL_DB set: the hint needs no --db at all
    done = _loopeval(capfd, *TINY_RUN, "--seed", "1", cwd=tmp_path, env=with_env)
    assert done.returncode == 0, done.stderr
    hint = _hint(_secret_free(done, secret), "show them:")
    assert "--db" not in hint
    assert _run_hint(hint, tmp_path, with_env).returncode == 0

    # a run that fails (a vLLM model cannot load without vLLM): its continue hint reaches the same database
    from adapters.testing import save_tiny_qwen3

    model = save_tiny_qwen3(tmp_path / "tiny-qwen3")
    done = _loopeval(capfd, *TINY_RUN, "--model", f"vllm:{model}", "--db", url, "--no-report", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    out = _secret_free(done, secret)
    resume = _hint(out, "continue with:")
    assert '--db "$LOOPEVAL_DB"' in resume

    # every reader, and the other commands that store
    for args in (
        ["results"],
        ["results", "--json"],
        ["results", "--tasks"],
        ["results", "--profiles"],
        ["dashboard", "--out", str(tmp_path / "r.html")],
        ["profile", "zoo:melt-tiny", "--lengths", "64"],
        ["probe", "zoo:ouro-tiny", "--loops", "2", "--limit", "1", "--positions", "8"],
    ):
        done = _loopeval(capfd, *args, "--db", url, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)
        out = _secret_free(done, secret)
        if args[0] == "probe":
            assert _run_hint(_hint(out, "figure:"), tmp_path, with_env).returncode == 0
    assert secret not in (tmp_path / "r.html").read_text()

    # errors: a wrong password, a server that is not there, a URL that does not parse
    wrong = url.replace(secret, "WRONGPASSWORD")
    absent = f"postgresql://loopeval:WRONGPASSWORD@127.0.0.1:{pg.free_port()}/x"
    broken = "postgresql://loopeval:WRONGPASSWORD@127.0.0.1:notaport/x"
    for db in (wrong, absent, broken):
        for args in (["results"], ["dashboard"], TINY_RUN):
            done = _loopeval(capfd, *args, "--db", db, cwd=tmp_path)
            assert done.returncode == 2 and "WRONGPASSWORD" not in done.stdout + done.stderr, (args, db, done.stderr)


@pytest.mark.slow
def test_the_served_app_names_its_database_without_the_password(
    postgres_server: object, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    url = postgres_server.database("secrets_served")
    assert _loopeval(capfd, *TINY_RUN, "--db", url, "--no-report", cwd=tmp_path).returncode == 0
    serving = subprocess.Popen(
        [LOOPEVAL, "dashboard", "--serve", "--db", url, "--port", str(pg.free_port())],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, first = time.monotonic() + 90, ""
        while not first and time.monotonic() < deadline and serving.poll() is None:
            first = serving.stdout.readline()
    finally:
        serving.terminate()
        rest = serving.communicate(timeout=30)[0]
    assert first.startswith("loopeval dashboard: serving postgresql+psycopg://loopeval:***@127.0.0.1:")
    assert _password(url) not in first + rest
