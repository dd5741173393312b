"""One hand-edited value in a real database: invalid JSON, JSON of the wrong shape, text where a number or a date
belongs, in every kind of checked column (`db.stored`). Commands listing many runs show the others and name the
damaged run in one line; a command needing it fails with that line (exit 2); nothing stored is changed.

Also the database on a read-only mount (a real tmpfs remounted read-only: the tests run as root, whom file
permissions do not stop, but a read-only mount does): read commands read it, writing ones refuse it in one line.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from db.session import open_existing
from db.stored import CHECKED, damaged_runs
from harness.cli import main
from tests.support.mounts import remount_read_only

DAMAGED = 2  # run 2 of the three below is damaged; runs 1 and 3 must still be shown
# (column, SQL value, what the damage is named as after the column): a value inside a JSON object of the right
# shape, text or NaN where loopeval computes with a number, NaN anywhere (even where nothing reads it)
NESTED = [
    (
        "runs.model_config",
        "json_set(model_config, '$.kv_bytes_per_token', 'lots')",
        "holds 'lots' at kv_bytes_per_token, not a finite number",
    ),
    (
        "runs.model_config",
        "replace(model_config, '\"kv_bytes_per_token\": 1024', '\"kv_bytes_per_token\": NaN')",
        "holds NaN at kv_bytes_per_token, which JSON cannot hold",
    ),
    (
        "runs.model_config",
        "json_set(model_config, '$.analytic.weights_bytes', 'heavy')",
        "holds 'heavy' at analytic.weights_bytes, not a finite number",
    ),
    (
        "runs.model_config",
        "json_set(model_config, '$.config.shared_layers', 2.5)",
        "holds 2.5 at config.shared_layers, not a whole number",
    ),
    (
        "runs.model_config",
        "json_set(model_config, '$.trained_loops', 'four')",
        "holds 'four' at trained_loops, not a whole number",
    ),
    (
        "runs.sampling",
        "replace(sampling, '\"temperature\": 1.0', '\"temperature\": Infinity')",
        "holds Infinity at temperature, which JSON cannot hold",
    ),
    ("runs.sampling", "json_set(sampling, '$.n', 'one')", "holds 'one' at n, not a whole number"),
    (
        "runs.host",
        'replace(host, \'"hostname": \', \'"load": [1, -Infinity], "hostname": \')',
        "holds -Infinity at load[1], which JSON cannot hold",
    ),
]
NAMED = {value: named for _, value, named in NESTED}
# (column, SQL value): each kind of checked column, each way it can be damaged
CASES = [
    ("runs.sampling", "'{\"temperature\": 1'"),  # invalid JSON
    ("runs.spec", "'not json'"),
    ("runs.model_config", "'{'"),
    ("runs.host", "'[oops'"),
    ("runs.tasks", "'{\"addition\": 1}'"),  # JSON of the wrong shape
    ("runs.sampling", "'[1, 2]'"),
    ("runs.spec", "'42'"),
    ("runs.tasks", "'[1, 2]'"),
    ("runs.spec", "'{\"model_overrides\": [1]}'"),
    ("runs.loops", "'many'"),  # text where a number belongs
    ("runs.seed", "'zero'"),
    ("runs.exit_threshold", "'half'"),
    ("runs.wall_seconds", "'slow'"),
    ("task_metrics.value", "'high'"),
    ("samples.score", "'right'"),
    ("samples.generated_tokens", "2.5"),  # a fraction where a count belongs
    ("memory_peaks.value", "'big'"),
    ("memory_samples.rss", "'lots'"),
    ("runs.started_at", "'yesterday'"),  # a text date
    ("runs.finished_at", "'soon'"),
    ("samples.created_at", "12345"),
    ("samples.loops_histogram", '\'{"1": "three"}\''),  # JSON of the wrong shape in a table of many rows
    ("samples.loops_histogram", "'{\"1\": 3'"),
    *[(column, value) for column, value, _ in NESTED],
]


def _strict_json(text: str) -> object:
    """`text` parsed as standard JSON: NaN and Infinity, which Python's parser would accept, are refused."""

    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real database of three finished runs (a plain model and a looped one at two loop counts)."""
    folder = tmp_path_factory.mktemp("intact")
    path = folder / "r.sqlite"
    with contextlib.chdir(folder):
        assert (
            main(
                [
                    "run",
                    "--model",
                    "preset:qwen3-tiny",
                    "--model",
                    "preset:ouro-tiny",
                    "--loops",
                    "1,2",
                    "--tasks",
                    "addition",
                    "--limit",
                    "2",
                    "--samples",
                    "1",
                    "--max-new-tokens",
                    "4",
                    "--db",
                    str(path),
                    "--no-report",
                ]
            )
            == 0
        )
    return path


def _damaged(intact: Path, folder: Path, column: str, value: str) -> Path:
    path = folder / "damaged.sqlite"
    shutil.copy(intact, path)
    table, name = column.split(".")
    key = "id" if table == "runs" else "run_id"
    with sqlite3.connect(path) as conn:
        changed = conn.execute(f"UPDATE {table} SET {name} = {value} WHERE {key} = {DAMAGED}").rowcount
    conn.close()
    assert changed, f"nothing of run {DAMAGED} in {table} to damage"
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line(err: str, start: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(start), err
    return lines[0]


def test_every_json_number_and_date_column_of_a_run_is_checked() -> None:
    checked = {f"{column.table.name}.{column.name}" for _, columns in CHECKED for column, _ in columns}
    assert {column for column, _ in CASES} <= checked
    assert {
        "runs.versions",
        "runs.limit",
        "runs.lease_until",
        "runs.energy_joules",
        "task_metrics.stderr",
        "profile_points.weights_bytes",
        "probe_values.value",
        "samples.loops_used",
    } <= checked
    assert not {"runs.model_spec", "runs.status", "samples.output"} & checked, "text columns hold any text"


@pytest.mark.parametrize(("column", "value"), CASES, ids=[f"{c}={v}" for c, v in CASES])
def test_a_damaged_value_is_named_and_the_other_runs_still_shown(
    column: str, value: str, intact: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = _damaged(intact, tmp_path, column, value)
    before = _digest(db)
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    line = _one_line(err, f"run {DAMAGED} skipped: {column} {NAMED.get(value, '')}")
    assert f"({db.name})" not in line and f"sqlite:///{db}" in line, line
    assert [run["id"] for run in _strict_json(out)] == [1, 3]  # type: ignore[union-attr]

    assert main(["results", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    assert _one_line(err, f"run {DAMAGED} skipped: {column} ") == line
    assert "preset:qwen3-tiny" in out and "preset:ouro-tiny" in out

    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "report.html")]) == 0
    out, err = capfd.readouterr()
    assert _one_line(err, f"run {DAMAGED} skipped: {column} ") == line
    assert "preset:ouro-tiny" in (tmp_path / "report.html").read_text()
    assert _digest(db) == before, "reading never writes"


@pytest.mark.parametrize(
    ("column", "value"),
    [CASES[0], CASES[4], CASES[8], CASES[12], CASES[17], NESTED[0][:2], NESTED[1][:2]],
    ids=["invalid-json", "wrong-shape", "text-number", "text-score", "text-date", "text-inside", "nan-inside"],
)
def test_resuming_the_damaged_run_is_one_line_and_exit_2(
    column: str, value: str, intact: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = _damaged(intact, tmp_path, column, value)
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE runs SET status = 'interrupted' WHERE id = {DAMAGED}")
    conn.close()
    before = _digest(db)
    capfd.readouterr()
    assert main(["run", "--resume", str(DAMAGED), "--db", str(db), "--no-report"]) == 2
    line = _one_line(capfd.readouterr().err, f"loopeval: error: run {DAMAGED}: {column} ")
    assert f"sqlite:///{db}" in line
    assert _digest(db) == before


def test_a_stored_spec_loopeval_cannot_rebuild_is_one_line(
    intact: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = _damaged(intact, tmp_path, "runs.spec", '\'{"batch_size": 4, "unknown_field": 1}\'')
    with sqlite3.connect(db) as conn:
        conn.execute(f"UPDATE runs SET status = 'interrupted' WHERE id = {DAMAGED}")
    conn.close()
    capfd.readouterr()
    assert main(["run", "--resume", str(DAMAGED), "--db", str(db), "--no-report"]) == 2
    line = _one_line(capfd.readouterr().err, f"loopeval: error: run {DAMAGED}: runs.spec does not hold ")
    assert "unknown_field" in line and f"sqlite:///{db}" in line


def test_a_new_run_beside_a_damaged_one_runs_and_names_it(
    intact: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = _damaged(intact, tmp_path, "runs.sampling", "'{'")
    capfd.readouterr()
    assert (
        main(
            [
                "run",
                "--model",
                "preset:coreloop-tiny",
                "--tasks",
                "addition",
                "--limit",
                "1",
                "--samples",
                "1",
                "--max-new-tokens",
                "2",
                "--db",
                str(db),
                "--no-report",
            ]
        )
        == 0
    )
    out, err = capfd.readouterr()
    assert _one_line(err, f"run {DAMAGED} skipped: runs.sampling is not valid JSON")
    assert "preset:coreloop-tiny" in out


def test_a_database_whose_every_run_is_damaged_says_so(
    intact: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "all.sqlite"
    shutil.copy(intact, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET host = '{'")
    conn.close()
    capfd.readouterr()
    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "report.html")]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines[:3] == [f"run {run_id} skipped: runs.host is not valid JSON (sqlite:///{db})" for run_id in (1, 2, 3)]
    assert lines[3:] == [
        f"loopeval: error: the database sqlite:///{db} holds no run loopeval can read: each holds a "
        "damaged value (named above)"
    ]


def test_the_scan_finds_only_the_damaged_runs(intact: Path, tmp_path: Path) -> None:
    db = _damaged(intact, tmp_path, "samples.score", "'x'")
    assert list(damaged_runs(open_existing(str(db)))) == [DAMAGED]
    assert damaged_runs(open_existing(str(intact))) == {}
    null = _damaged(intact, tmp_path, "runs.model_config", "'null'")  # what SQLAlchemy stores for None: intact
    assert damaged_runs(open_existing(str(null))) == {}


def test_a_database_on_a_read_only_mount_is_read_and_never_written(
    intact: Path, small_disk: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = small_disk / "r.sqlite"
    shutil.copy(intact, db)
    remount_read_only(small_disk)
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    assert [run["id"] for run in json.loads(capfd.readouterr().out)] == [1, 2, 3]
    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "report.html")]) == 0
    new_run = ["run", "--model", "preset:qwen3-tiny", "--tasks", "addition", "--limit", "1"]
    for command in (["run", "--resume", "1"], new_run):
        capfd.readouterr()
        assert main([*command, "--db", str(db), "--no-report"]) == 2
        assert (
            _one_line(capfd.readouterr().err, "loopeval: error: ") == f"loopeval: error: database {db} is not writable"
        )
    assert sorted(p.name for p in small_disk.iterdir()) == ["r.sqlite"]


def test_a_damaged_run_on_a_read_only_mount_is_named_and_the_others_shown(
    intact: Path, small_disk: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = small_disk / "r.sqlite"
    shutil.copy(_damaged(intact, tmp_path, "runs.started_at", "'last week'"), db)
    remount_read_only(small_disk)
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    assert [run["id"] for run in json.loads(out)] == [1, 3]
    assert _one_line(err, f"run {DAMAGED} skipped: runs.started_at holds 'last week', not a date (sqlite:///{db})")


OLD = Path(__file__).with_name("data") / "made-by-4ad3e07.sqlite"  # schema 0006: four eval runs and a profile


def _old_damaged(folder: Path) -> Path:
    """The 0006 database with invalid JSON in run 1's sampling, which the upgrade to 0008 reads."""
    db = folder / "old.sqlite"
    shutil.copy(OLD, db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE runs SET sampling = '{' WHERE id = 1")
    conn.close()
    return db


def _upgraded_copies() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("loopeval-upgraded-*"))


def test_a_damaged_old_schema_is_upgraded_around_the_damaged_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = _old_damaged(tmp_path)
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    assert [run["id"] for run in json.loads(out)] == [2, 3, 4, 5]
    assert _one_line(err, "run 1 skipped: runs.sampling is not valid JSON")


def test_an_old_damaged_schema_on_a_read_only_mount_is_read_through_an_upgraded_copy(
    small_disk: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The file cannot be upgraded where it is: loopeval reads an upgraded copy of it, names the damaged run by the
    file's own name, and leaves the file byte-identical, nothing beside it and no copy behind."""
    db = small_disk / "old.sqlite"
    shutil.copy(_old_damaged(tmp_path), db)
    before, copies = _digest(db), _upgraded_copies()
    remount_read_only(small_disk)
    capfd.readouterr()
    assert main(["results", "--json", "--db", str(db)]) == 0
    out, err = capfd.readouterr()
    assert [run["id"] for run in json.loads(out)] == [2, 3, 4, 5]
    assert _one_line(err, "run 1 skipped: ") == f"run 1 skipped: runs.sampling is not valid JSON (sqlite:///{db})"
    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "report.html")]) == 0
    assert "run 1 skipped" in capfd.readouterr().err and (tmp_path / "report.html").stat().st_size > 0
    assert main(["run", "--resume", "2", "--db", str(db), "--no-report"]) == 2, "writing is still refused"
    assert _one_line(capfd.readouterr().err, "loopeval: error: ") == f"loopeval: error: database {db} is not writable"
    gc.collect()  # an engine's copy goes with it
    assert _digest(db) == before and sorted(p.name for p in small_disk.iterdir()) == ["old.sqlite"]
    assert _upgraded_copies() <= copies, "no upgraded copy left behind"


def test_a_json_value_of_the_wrong_shape_on_postgres_is_named_and_the_others_shown(
    postgres_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A server enforces its columns' types, so only a JSON value's shape can be wrong there; the runs holding one
    are left out through the same temporary views, and the password stays hidden."""
    from db.store import Store

    store = Store.open(postgres_url)
    ids = [
        store.create_run(
            sweep_id="pg",
            model_spec="preset:qwen3-tiny",
            adapter="preset",
            suite="synthetic",
            tasks=["addition"],
            sampling={"temperature": 1.0},
            seed=seed,
            status="finished",
        )
        for seed in range(3)
    ]
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE runs SET sampling = '[1, 2]' WHERE id = {ids[1]}")
        conn.exec_driver_sql(f"UPDATE runs SET tasks = '{{\"a\": 1}}' WHERE id = {ids[2]}")
    store.close()
    capfd.readouterr()
    assert main(["results", "--json", "--db", postgres_url]) == 0
    out, err = capfd.readouterr()
    assert [run["id"] for run in json.loads(out)] == ids[:1]
    lines = err.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"run {ids[1]} skipped: runs.sampling is not a JSON object",
        f"run {ids[2]} skipped: runs.tasks is not a JSON list of names",
    ]
    password = postgres_url.split("@")[0].rsplit(":", 1)[1]
    assert "***@" in err and password not in err
