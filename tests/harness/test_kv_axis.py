"""The KV memory axis (`--kv-policy`, `--kv-dtype`) end to end: one run per policy and dtype, each stored with them in
its identity and configuration, and `loopeval results --json` giving each run its KV policy, dtype and bytes per
token, as the adapter describes them.

One real sweep (the trained zoo Ouro, two synthetic tasks, a real SQLite file) feeds the end-to-end tests; bad values
are refused in one line with exit code 2 before any database exists.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from analysis.names import config_labels
from analysis.points import accuracy_points, lever_points
from db.session import open_existing
from db.record import PlannedRun
from db.sets import config_key, configuration, run_key
from harness.cli import main
from harness.planning.sweep import build_request
from tests.support.cli import printed
from tests.support.stored_runs import DOCS, MODEL, SAMPLING, TASKS
from tests.support.sqlite import query

POLICIES, DTYPES = ("per-loop", "shared-last"), ("auto", "int8")
ARGV = [
    "run",
    "--model",
    "zoo:ouro-tiny",
    "--loops",
    "4",
    "--kv-policy",
    ",".join(POLICIES),
    "--kv-dtype",
    ",".join(DTYPES),
    "--tasks",
    "chain3,c30k4",
    "--limit",
    "20",
    "--samples",
    "1",
    "--temperature",
    "0",
    "--no-report",
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The issue's sweep of ARGV in a fresh database, and what `loopeval run` printed."""
    db = tmp_path_factory.mktemp("kv") / "m.db"
    return db, printed([*ARGV, "--db", f"sqlite:///{db}"])


# What each of ARGV's settings stores: the model's own policy (per-loop) and dtype (auto) resolve to none named.
STORED = [(None, None), (None, "int8"), ("shared-last", None), ("shared-last", "int8")]


def test_one_finished_run_per_policy_and_dtype_each_stored_with_them(swept: tuple[Path, str]) -> None:
    db, _ = swept
    runs = query(db, "SELECT model_spec, loops, kv_policy, kv_dtype, status, exit_threshold FROM runs ORDER BY id")
    assert runs == [("zoo:ouro-tiny", 4, p, d, "finished", None) for p, d in STORED]


def test_results_json_gives_each_run_its_kv_policy_dtype_and_bytes_per_token(
    swept: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = swept
    assert main(["results", "--db", f"sqlite:///{db}", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    per_token = {(r["kv_policy"], r["kv_dtype"]): r["kv_bytes_per_token"] for r in runs}
    assert set(per_token) == {(p, d) for p in POLICIES for d in DTYPES} and all(v > 0 for v in per_token.values())
    for dtype in DTYPES:  # shared-last keeps one entry per layer and token where per-loop keeps r = 4
        assert per_token["shared-last", dtype] * 4 == per_token["per-loop", dtype]
    for policy in POLICIES:  # one byte a value and a scale per token and head, against float32's four bytes
        assert per_token[policy, "int8"] <= 0.30 * per_token[policy, "auto"]
    for run in runs:  # the identity holds what differs from the model's own, so a point shows it
        own = {"kv_policy": "per-loop", "kv_dtype": "auto"}
        assert {k: run["overrides"].get(k, own[k]) for k in own} == {k: run[k] for k in own}
        assert not {k for k in own if run["overrides"].get(k) == own[k]}, "the model's own is never in its identity"


def test_results_name_each_row_by_its_policy_and_dtype(
    swept: tuple[Path, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, log = swept
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["results", "--db", f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    for policy, dtype in STORED:  # the table and the log name a run by what it sets beyond the model's own
        assert re.search(rf"│ {' '.join(v for v in (policy, dtype) if v)} +│", out), out
        assert f"zoo:ouro-tiny r=4{''.join(f' {v}' for v in (policy, dtype) if v)}: finished" in log, log


def test_a_repeat_is_skipped_and_every_run_keeps_its_own_identity(
    swept: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = swept
    assert main([*ARGV, "--db", f"sqlite:///{db}"]) == 0
    assert "all 4 runs identical to finished runs 1-4" in capsys.readouterr().out
    assert len(query(db, "SELECT id FROM runs")) == 4


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--kv-policy", "shared-max"],
            "--kv-policy must be one of standard, gated, per-loop, shared-last, shared-mean, shared-ema, latest-m4",
        ),
        (
            ["--kv-policy", "shared-ema:1.5"],
            "--kv-policy shared-ema:ALPHA needs ALPHA in (0, 1) (the newest loop's weight), got 'shared-ema:1.5'",
        ),
        (["--kv-policy", "shared-ema:0"], "needs ALPHA in (0, 1)"),
        (["--kv-policy", "shared-ema:nan"], "needs ALPHA in (0, 1)"),
        (["--kv-policy", "shared-last:0.5"], "--kv-policy must be one of"),
        (["--kv-policy", ","], "--kv-policy must be comma-separated names"),
        (["--kv-dtype", "int4"], "--kv-dtype must be one of auto, int8, fp8, got 'int4'"),
        (["--kv-policy", "shared-last", "--model", "zoo:qwen3-tiny-small"], "none of the sweep's models loops"),
    ],
)
def test_a_bad_kv_axis_is_one_line_and_exit_2_before_any_write(
    args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    model = [] if "--model" in args else ["--model", "zoo:ouro-tiny"]
    assert main(["run", *model, *args, "--limit", "1", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not db.exists(), "refused before the first write"


def test_a_policy_the_family_cannot_take_is_refused_at_plan_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MELT's one gated row per layer has no per-loop entries to keep: its adapter's inspector says so, in one line."""
    db = tmp_path / "r.sqlite"
    assert (
        main(
            [
                "run",
                "--model",
                "zoo:melt-tiny",
                "--loops",
                "4",
                "--kv-policy",
                "per-loop",
                "--limit",
                "1",
                "--db",
                str(db),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "per-loop" in err[0] and "melt" in err[0].lower(), err
    assert not db.exists()


def test_a_sweep_file_sweeps_the_same_axis_and_the_spec_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('models = ["zoo:ouro-tiny"]\nkv_policy = ["per-loop", "shared-ema"]\nkv_dtype = "auto,int8"\n')
    from_file = build_request({}, str(path)).specs
    from_flags = build_request(
        dict(models=["zoo:ouro-tiny"], kv_policies=["per-loop", "shared-ema:0.5"], kv_dtypes=["auto", "int8"])
    ).specs
    assert from_file == from_flags
    assert from_file[0].kv_policies == ("per-loop", "shared-ema:0.5"), (
        "one policy, one canonical text: ALPHA's default named"
    )
    assert from_file[0].kv_dtypes == ("auto", "int8")
    path.write_text('models = ["zoo:ouro-tiny"]\nkv_dtype = [8]\n')
    with pytest.raises(Exception, match="kv_dtype must be a non-empty list of strings"):
        build_request({}, str(path))
    path.write_text('models = [{spec = "zoo:ouro-tiny", overrides = {kv_dtype = "fp8"}}]\nkv_dtype = ["int8"]\n')
    with pytest.raises(
        Exception, match="--kv-dtype sweeps kv_dtype, so the model's own kv_dtype override cannot be kept"
    ):
        build_request({}, str(path))


def test_runs_off_the_axis_pass_no_kv_override() -> None:
    (spec,) = build_request(dict(models=["zoo:ouro-tiny"])).specs
    assert spec.kv_policies == () and spec.kv_dtypes == ()
    run = PlannedRun("zoo:ouro-tiny", 4, "synthetic", (), {}, 0)
    assert spec.run_overrides(run) == {"seed": 0}
    assert spec.run_overrides(replace(run, kv_policy="shared-last")) == {"seed": 0, "kv_policy": "shared-last"}
    assert spec.run_overrides(replace(run, kv_dtype="int8")) == {"seed": 0, "kv_dtype": "int8"}


def test_the_axis_joins_a_runs_identity_and_configuration_only_where_set() -> None:
    """A run stored before the axis (no kv columns) and one off it (NULL) have one key: the stored keep theirs."""
    before = {
        "model_spec": MODEL,
        "loops": 4,
        "seed": 0,
        "suite": "synthetic",
        "tasks": TASKS,
        "limit": DOCS,
        "sampling": SAMPLING,
        "data_fingerprint": "f" * 64,
        "spec": {"model_overrides": {MODEL: {"dtype": "float32"}}},
    }
    off_axis = before | {"kv_policy": None, "kv_dtype": None}
    assert run_key(off_axis) == run_key(before) and configuration(off_axis) == {"dtype": "float32"}
    shared = before | {"kv_policy": "shared-last", "kv_dtype": None}
    int8 = before | {"kv_policy": "shared-last", "kv_dtype": "int8"}
    assert len({run_key(before), run_key(shared), run_key(int8)}) == 3
    assert config_key(configuration(int8)) == '{"dtype":"float32","kv_dtype":"int8","kv_policy":"shared-last"}'


def test_a_point_is_named_by_its_policy_and_dtype_where_its_models_points_differ() -> None:
    configs = [{"kv_policy": p, "kv_dtype": d, "dtype": "float32"} for p in POLICIES for d in DTYPES]
    points = pd.DataFrame(
        {
            "model": [MODEL] * 4 + ["zoo:melt-tiny"],
            "config": [config_key(c) for c in configs] + [config_key({"kv_dtype": "int8"})],
        }
    )
    assert config_labels(points) == ["per-loop auto", "per-loop int8", "shared-last auto", "shared-last int8", ""]
    one_dtype = pd.DataFrame(
        {
            "model": [MODEL] * 2,
            "config": [
                config_key({"kv_policy": p, "kv_dtype": "int8", "exit_loop": i}) for i, p in enumerate(POLICIES)
            ],
        }
    )
    assert config_labels(one_dtype) == ["per-loop exit_loop=0", "shared-last exit_loop=1"], (
        "the policy first, the rest by name"
    )


def test_a_profile_measures_one_policy_and_dtype_and_stores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under shared-last int8 the KV allocated is the adapter's bytes per token for every token held, and the profile
    run keeps its policy and dtype; a policy the family cannot take is refused before the database exists."""
    db = tmp_path / "p.sqlite"
    assert (
        main(
            [
                "profile",
                "zoo:ouro-tiny",
                "--lengths",
                "16,32",
                "--decode-steps",
                "2",
                "--kv-policy",
                "shared-last",
                "--kv-dtype",
                "int8",
                "--json",
                "--db",
                str(db),
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    per_token = result["description"]["kv_bytes_per_token"]
    assert (result["description"]["kv_policy"], result["description"]["kv_dtype"]) == ("shared-last", "int8")
    assert [p["kv_bytes_allocated"] for p in result["points"]] == [per_token * (n + 2) for n in (16, 32)]
    assert query(db, "SELECT kind, kv_policy, kv_dtype FROM runs") == [("profile", "shared-last", "int8")]
    refused = tmp_path / "refused.sqlite"
    assert (
        main(["profile", "zoo:melt-tiny", "--lengths", "16", "--kv-policy", "shared-last", "--db", str(refused)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shared-last" in err[0] and not refused.exists(), err


def _blobs(html: str) -> dict:
    return json.loads(re.search(r'<script id="figures" type="application/json">(.*?)</script>', html).group(1))


def test_the_memory_levers_figure_sets_each_lever_against_its_models_own_cache(swept: tuple[Path, str]) -> None:
    """MELT at int8 and MELT as it is join the sweep's set (same tasks, docs, sampling): the figure draws Ouro's four
    settings and MELT's two, MELT's own cache as the reference its int8 saves against; the report draws it."""
    db, _ = swept
    common = [
        "--tasks",
        "chain3,c30k4",
        "--limit",
        "20",
        "--samples",
        "1",
        "--temperature",
        "0",
        "--db",
        f"sqlite:///{db}",
    ]
    with contextlib.redirect_stdout(io.StringIO()):
        assert (
            main(["run", "--model", "zoo:melt-tiny", "--loops", "4", "--kv-dtype", "int8", *common, "--no-report"]) == 0
        )
        assert main(["run", "--model", "zoo:melt-tiny", "--loops", "4", *common]) == 0
    engine = open_existing(f"sqlite:///{db}")
    try:
        points = lever_points(accuracy_points(engine, None)).set_index(["model", "kv_policy", "kv_dtype"])
    finally:
        engine.dispose()
    melt = [("zoo:melt-tiny", "gated", "auto"), ("zoo:melt-tiny", "gated", "int8")]
    assert sorted(points.index) == sorted([*(("zoo:ouro-tiny", p, d) for p in POLICIES for d in DTYPES), *melt])
    kv = points["kv_bytes_allocated"]
    assert kv["zoo:ouro-tiny", "shared-last", "auto"] < kv["zoo:ouro-tiny", "per-loop", "auto"]
    assert kv[melt[1]] < kv[melt[0]], "int8 saves on MELT's gated rows too"
    html = (db.parent / "report.html").read_text()
    assert "Memory levers" in html
    (key,) = [k for k in _blobs(html) if k.startswith("levers|") and k.endswith("|all")]
    data = _blobs(html)[key]["data"]
    drawn = [t for t in data if t.get("customdata")]
    settings = [(c[0], c[2], c[3]) for t in drawn for c in t["customdata"]]
    assert sorted(settings) == sorted([*(("zoo:ouro-tiny", p, d) for p in POLICIES for d in DTYPES), *melt])
    assert {s for t in drawn for s in t["marker"]["symbol"]} == {"triangle-up"}, "r=4's shape, as in every figure"
    held = {(c[0], c[2], c[3]): x for t in drawn for c, x in zip(t["customdata"], t["x"])}
    both = points["weights_bytes"] + points["kv_bytes_allocated"]
    assert held == pytest.approx({k: both[k] / 1e6 for k in held}), "x: weights + KV at its measured value, in MB"
    keys = [t["name"] for t in data if t.get("legendgroup", "").startswith("configuration ")]
    marks = [t for t in data if t.get("name") == "configuration marks"]
    assert keys[0] == "plain run (no mark)", "MELT's own point, no setting"
    assert sum(len(t["x"]) for t in marks) == 4, (
        "a mark on each lever: Ouro's three (per-loop auto is its own cache: no mark) and MELT's int8"
    )
    (menu,) = _blobs(html)[key]["layout"]["updatemenus"]
    assert [button["label"] for button in menu["buttons"]] == ["x: weights + KV", "x: KV alone"]
    alone = menu["buttons"][1]["args"][0]["x"]  # each trace's x once KV alone is picked
    kv_alone = {(c[0], c[2], c[3]): x for t in drawn for c, x in zip(t["customdata"], alone[data.index(t)])}
    assert kv_alone == pytest.approx({k: kv[k] / 1e6 for k in kv_alone}), "KV alone: the measured KV peak, in MB"
    spokes = {t["name"]: t["x"] for t in data if t.get("name", "").endswith(" levers")}
    assert {name: len(x) for name, x in spokes.items()} == {"zoo:melt-tiny levers": 3, "zoo:ouro-tiny levers": 9}


def test_a_set_without_the_kv_axis_draws_a_note_not_a_figure(tmp_path: Path) -> None:
    """Every point on the exit axis (so none left to compare), or none with a KV setting: no lever, one note."""
    from dashboards.cost_figures import memory_levers
    from db.store import Store
    from tests.support.stored_runs import store_run

    store = Store.open(str(tmp_path / "exits.sqlite"))
    try:
        store_run(store, [1.0] * DOCS, exit_threshold=0.5, exit_criterion="gate")
        exits_only = accuracy_points(store.engine, None)
        store_run(store, [1.0] * DOCS)
        plain = accuracy_points(store.engine, None)
    finally:
        store.close()
    for points in (exits_only, plain):
        assert lever_points(points).empty
        figure = memory_levers(points)
        assert not figure.data and "this set runs no KV policy or dtype" in figure.layout.annotations[0].text


def test_the_pages_name_each_run_by_its_policy_and_dtype(swept: tuple[Path, str]) -> None:
    """The runs table's column and the run selector's label; blank and absent off the axis."""
    from dashboards import views
    from db import queries

    db, _ = swept
    engine = open_existing(f"sqlite:///{db}")
    try:
        column = views.RUN_COLUMNS.index("KV policy and dtype")
        cells = {row[0]: row[column] for row in views.runs_table(engine)}
        labels = [views.run_label(run) for run in queries.runs(engine).itertuples()]
    finally:
        engine.dispose()
    named = [" ".join(v for v in setting if v) for setting in STORED]  # what each sets beyond the model's own
    assert [cells[run_id] for run_id in (1, 2, 3, 4)] == named
    assert labels[:4] == [
        f"run {i}: zoo:ouro-tiny r=4{f' {n}' if n else ''} (synthetic)" for i, n in enumerate(named, 1)
    ]
    assert all(cells[run_id] == "" for run_id in cells if run_id > 4 and "int8" not in labels[run_id - 1]), (
        "blank off the axis"
    )
