"""Every bad input through the CLI: one line on stderr naming the problem, exit code 2, and the database untouched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from db.store import Store
from harness.cli import main

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
FAST = ["--tasks", "lookup", "--limit", "1", "--max-new-tokens", "1", "--no-report"]


@pytest.fixture(scope="module")
def stored_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database that already holds a run with a sample: bad input must leave it byte-identical."""
    path = tmp_path_factory.mktemp("store") / "kept.sqlite"
    store = Store.open(str(path))
    run_id = store.create_run(sweep_id="kept", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic")
    store.add_samples(run_id, [dict(task="lookup", doc_id="0", sample_index=0, prompt="p", output="o")])
    store.finish_run(run_id, "finished")
    store.close()
    return path


def expect_usage_error(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopeval: error:"), err
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "nosuch:thing"], "unknown model prefix 'nosuch'"),
        (["--model", "preset:no-such-preset"], "unknown preset 'no-such-preset'"),
        (["--model", "ouro-tiny"], "model name 'ouro-tiny' is ambiguous: give one of preset:ouro-tiny, zoo:ouro-tiny"),
        (["--model", "qwen3-tiny-smal"], "unknown model 'qwen3-tiny-smal'"),
        (["--model", "/tmp"], "model '/tmp' is a path: give it with its adapter's prefix"),
        (["--suite", "nosuch"], "unknown suite 'nosuch'"),
        (["--tasks", "nosuch"], "unknown task 'nosuch'"),
        (["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
        (["--top-p", "0"], "--top-p must be a number in (0, 1]"),
        (["--top-p", "1.5"], "--top-p must be a number in (0, 1]"),
        (["--samples", "0"], "--samples must be an integer from 1 to 1024, got 0"),
        (["--loops", "0,2"], "--loops must be comma-separated positive integers"),
        (["--loops", "two"], "--loops must be comma-separated positive integers"),
        (["--limit", "0"], "--limit must be an integer from 1 to"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be an integer from 1 to"),
        (["--batch-size", "0"], "--batch-size must be an integer from 1 to"),
        (["--resume", "999"], "--resume 999: no such run"),
    ],
)
def test_bad_run_options(args: list[str], fragment: str, stored_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = stored_db.read_bytes()
    expect_usage_error(["run", *FAST, *args, "--db", str(stored_db)], fragment, capsys)
    assert stored_db.read_bytes() == before


def test_unreadable_checkpoint(tmp_path: Path, stored_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = stored_db.read_bytes()
    expect_usage_error(
        ["run", *FAST, "--model", f"ouro:{tmp_path / 'missing'}", "--db", str(stored_db)], "missing", capsys
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    assert main(["run", *FAST, "--model", f"ouro:{broken}", "--db", str(stored_db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(broken) in err[0]
    assert stored_db.read_bytes() == before


def test_missing_data_file(tmp_path: Path, stored_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = stored_db.read_bytes()
    expect_usage_error(
        ["run", "--suite", "paper", "--tasks", "aime24", "--data-dir", str(tmp_path), "--db", str(stored_db)],
        "looked for",
        capsys,
    )
    expect_usage_error(
        ["run", "--suite", "paper", "--tasks", "aime24", "--data-dir", str(tmp_path / "nope"), "--db", str(stored_db)],
        "is not a directory",
        capsys,
    )
    assert stored_db.read_bytes() == before


def test_corrupt_database_is_refused_and_byte_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = tmp_path / "corrupt.sqlite"
    content = bytes(range(256)) * 64
    corrupt.write_bytes(content)
    for argv in (
        ["run", *FAST, "--model", "preset:qwen3-tiny"],
        ["results"],
        ["compare", "zoo:ouro-tiny r=4 int8", "zoo:ouro-tiny r=4"],
        ["profile", "preset:qwen3-tiny", "--lengths", "8"],
    ):
        expect_usage_error([*argv, "--db", str(corrupt)], "is not a SQLite database", capsys)
        assert corrupt.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.sqlite"]


def test_unwritable_database_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    expect_usage_error(
        ["run", *FAST, "--model", "preset:qwen3-tiny", "--db", str(blocker / "r.sqlite")],
        "cannot create the database directory",
        capsys,
    )
    expect_usage_error(["results", "--db", "nosuchdriver://x"], "no SQLAlchemy driver", capsys)


def test_bad_profile_options(capsys: pytest.CaptureFixture[str]) -> None:
    expect_usage_error(["profile", "preset:qwen3-tiny", "--lengths", "0", "--no-store"], "--lengths must be", capsys)
    expect_usage_error(["profile", "preset:qwen3-tiny", "--lengths", "100000", "--no-store"], "exceeds", capsys)
    expect_usage_error(
        ["profile", "preset:qwen3-tiny", "--lengths", "8", "--batch", "0", "--no-store"], "--batch must be", capsys
    )


def test_console_script_prints_one_line_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [LOOPEVAL, "run", "--top-p", "2", "--db", str(tmp_path / "r.sqlite")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "loopeval: error: --top-p must be a number in (0, 1], got 2.0"
    assert not (tmp_path / "r.sqlite").exists()


def test_a_folder_that_does_not_exist_is_refused_unless_mkdir(
    tmp_path: Path, stored_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in --db's or --out's folder would start a store (or write a report) where nothing looks: one line,
    exit 2, no folder made; --mkdir makes it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOPEVAL_DB", raising=False)
    missing = "the folder no/such/dir does not exist; create it, or pass --mkdir"
    run = ["run", *FAST, "--model", "preset:qwen3-tiny"]
    expect_usage_error([*run, "--db", "no/such/dir/x.sqlite"], f"--db no/such/dir/x.sqlite: {missing}", capsys)
    expect_usage_error([*run, "--db", "sqlite:///no/such/dir/x.sqlite"], missing, capsys)
    expect_usage_error(
        ["profile", "preset:qwen3-tiny", "--lengths", "8", "--db", "no/such/dir/x.sqlite"], missing, capsys
    )
    expect_usage_error(["dashboard", "--db", str(stored_db), "--out", "no/such/dir/r.html"], missing, capsys)
    monkeypatch.setenv("LOOPEVAL_DB", "no/such/dir/x.sqlite")
    expect_usage_error(run, f"LOOPEVAL_DB no/such/dir/x.sqlite: {missing}", capsys)
    assert list(tmp_path.iterdir()) == []

    assert main([*run, "--db", "made/here/x.sqlite", "--mkdir"]) == 0
    assert (tmp_path / "made" / "here" / "x.sqlite").is_file()
    assert main(["dashboard", "--db", "made/here/x.sqlite", "--out", "pages/r.html", "--mkdir"]) == 0
    assert (tmp_path / "pages" / "r.html").is_file()
    monkeypatch.delenv("LOOPEVAL_DB")
    assert main(run) == 0 and (tmp_path / "results" / "loopeval.sqlite").is_file()  # the default folder is made
