"""The per-token exit axis end to end: `loopeval run --exit-threshold` stores one run per threshold, each sample's
loops per generated token, and `loopeval results` and the report show what a token cost beside what it scored.

One real sweep (the trained zoo Ouro, the synthetic suite, a real SQLite file) feeds the tests of this module; bad
values are refused in one line with exit code 2 before any database exists.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dashboards.data import depth_points
from db.session import open_existing
from db.record import PlannedRun
from db.sets import run_key
from db.store import Store
from harness.cli import main
from harness.measurement.sampler import MemorySampler
from harness.planning.plan import stored_spec
from harness.planning.sweep import build_request
from tests.support.cli import printed
from tests.support.rich_tables import body_rows
from tests.support.sqlite import query

THRESHOLDS = (0.5, 0.8, 1.0)
ARGV = [
    "run",
    "--model",
    "zoo:ouro-tiny",
    "--exit-threshold",
    "0.5,0.8,1.0",
    "--loops",
    "4",
    "--limit",
    "3",
    "--samples",
    "1",
]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sweep of ARGV in a fresh database (report written beside it), and what `loopeval run` printed."""
    db = tmp_path_factory.mktemp("exit") / "r.sqlite"
    return db, printed([*ARGV, "--db", str(db)])


def _mean_loops(db: Path, run_id: int) -> float:
    """Loops per generated token over the run, weighing each sample by its tokens, from the stored samples."""
    ((loops, tokens),) = query(
        db,
        "SELECT SUM(loops_used * generated_tokens), SUM(generated_tokens) FROM samples "
        "WHERE run_id = ? AND loops_used IS NOT NULL",
        run_id,
    )
    return loops / tokens


def test_one_run_per_threshold_with_its_threshold_and_criterion(swept: tuple[Path, str]) -> None:
    db, _ = swept
    runs = query(
        db, "SELECT id, model_spec, loops, exit_threshold, exit_criterion, status, energy_joules FROM runs ORDER BY id"
    )
    assert [r[1:6] for r in runs] == [("zoo:ouro-tiny", 4, t, "gate", "finished") for t in THRESHOLDS]
    if (
        MemorySampler().energy_joules() is None and "nvml" in MemorySampler().unavailable
    ):  # no NVML here: unavailable, not 0
        assert all(r[6] is None for r in runs)


def test_each_sample_stores_the_loops_each_token_ran(swept: tuple[Path, str]) -> None:
    db, _ = swept
    means = {}
    for run_id, threshold in zip((1, 2, 3), THRESHOLDS):
        rows = query(
            db,
            "SELECT loops_histogram, loops_used, generated_tokens, decode_seconds, latency_seconds FROM samples "
            "WHERE run_id = ?",
            run_id,
        )
        assert len(rows) == 7 * 3  # the synthetic suite's 7 default tasks x 3 docs x 1 sample
        for histogram, mean, tokens, decode, latency in rows:
            counts = {int(r): n for r, n in json.loads(histogram).items()}
            assert sum(counts.values()) == tokens and set(counts) <= {1, 2, 3, 4}
            assert sum(r * n for r, n in counts.items()) / tokens == pytest.approx(mean)
            assert 0 < decode <= latency  # the adapter's decode time, within its prefill + decode
        means[threshold] = _mean_loops(db, run_id)
    assert means[1.0] == 4.0, "at threshold 1 every token runs all r loops"
    assert means[0.5] < means[0.8] <= means[1.0], "a lower threshold exits earlier"


def test_results_show_the_thresholds_as_rows_and_what_a_token_cost(
    swept: tuple[Path, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, _ = swept
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["results", "--db", str(db), "--rank", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out, out
    ranking, compute = body_rows(out)
    assert sorted(row[3] for row in ranking) == ["0.5", "0.8", "1"], (
        "a row per threshold (of the gate), named in its key"
    )
    accuracies = [float(row[4].split(" ± ")[0]) for row in ranking]
    assert accuracies == sorted(accuracies, reverse=True), "--rank accuracy: best pass@1 first"
    assert [row[:4] for row in compute] == [row[:4] for row in ranking], "the same rows under the same ranks"
    by_run = {row[-1]: row for row in ranking}
    for run_id, threshold in zip((1, 2, 3), THRESHOLDS):
        row = next(r for r in compute if r[3] == f"{threshold:g}")
        loops = _mean_loops(db, run_id)
        assert row[5] == f"{loops:.3g}", "loops/token: the tokens' mean of the stored samples"
        assert row[6] == f"{2 * loops:.3g}", "layers/token: ouro-tiny's 2 shared layers per loop, no prelude or coda"
        assert float(row[7].replace(",", "")) > 0
        assert str(run_id) in by_run


def _array(value: Any) -> list[float]:
    """A Plotly JSON array: a list, or the typed-array form plotly.py writes ({dtype, bdata})."""
    if isinstance(value, dict):
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


def test_the_report_draws_accuracy_against_loops_per_token(swept: tuple[Path, str]) -> None:
    db, _ = swept
    html = (db.parent / "report.html").read_text()
    assert "Accuracy against compute" in html
    blobs = json.loads(re.search(r'<script id="figures" type="application/json">(.*?)</script>', html).group(1))
    (key,) = [k for k in blobs if k.startswith("compute-loops|") and k.endswith("|all")]
    (trace,) = blobs[key]["data"]
    assert _array(trace["x"]) == pytest.approx([_mean_loops(db, run_id) for run_id in (1, 2, 3)]), (
        "joined in threshold order"
    )
    assert "exit threshold" in trace["hovertemplate"] and [c[1] for c in trace["customdata"]] == [
        "gate 0.5",
        "gate 0.8",
        "gate 1",
    ]
    assert blobs[key.replace("compute-loops", "compute-time")]["data"], "and against generate time per token"
    memory = blobs[key.replace("compute-loops", "acc") + "|kv_bytes_allocated"]["data"]
    named = {c[0] for trace in memory if trace.get("customdata") for c in trace["customdata"]}
    assert named == {"r=4 exit gate 0.5", "r=4 exit gate 0.8", "r=4 exit gate 1"}, (
        "the memory figure's hover tells them apart"
    )
    lines = {trace["name"] for trace in blobs[key.replace("compute-loops", "loops") + "|kv_bytes_allocated"]["data"]}
    assert not any("exit gate" in str(name) for name in lines), (
        "against r: each model's plain runs only; the thresholds are drawn against compute (above)"
    )
    engine = open_existing(f"sqlite:///{db}")
    depth = depth_points(engine, key.split("|")[1])
    engine.dispose()
    assert sorted(depth["model"].unique()) == [f"zoo:ouro-tiny exit gate {t:g}" for t in THRESHOLDS], "so is depth"


def test_a_repeat_is_skipped_and_resume_finds_each_threshold(
    swept: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = swept
    store = Store.read(str(db))
    try:
        rows = [store.get_run(run_id) for run_id in (1, 2, 3)]
        (request_spec,) = build_request(
            dict(
                models=["zoo:ouro-tiny"], exit_thresholds=[0.5, 0.8, 1.0], loops=[4], limit=3, samples=1, db_url=str(db)
            )
        ).specs
        assert [stored_spec(run, str(db)) for run in rows] == [request_spec] * 3, "the stored spec round-trips"
        keys = [run_key({c.name: getattr(run, c.name) for c in run.__table__.columns}) for run in rows]
        assert len(set(keys)) == 3, "two thresholds are two runs"
    finally:
        store.close()
    assert main([*ARGV, "--db", str(db), "--no-report"]) == 0
    assert "all 3 runs identical to finished runs 1-3" in capsys.readouterr().out
    assert len(query(db, "SELECT id FROM runs")) == 3


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--exit-threshold", "1.5"],
            "--exit-threshold must be a number in [0, 1] for the gate criterion, got 1.5",
        ),
        (["--exit-threshold", "nan"], "must be a number in [0, 1] for the gate criterion, got nan"),
        (["--exit-threshold", "-0.1"], "got -0.1"),
        (["--exit-threshold", "half"], "--exit-threshold must be comma-separated numbers"),
        (
            ["--exit-threshold", "0.5", "--exit-criterion", "loudness"],
            "--exit-criterion must be one of gate, kl, entropy",
        ),
        (["--exit-criterion", "kl"], "--exit-criterion applies only with --exit-threshold"),
        (
            ["--exit-threshold", "-1", "--exit-criterion", "entropy"],
            "must be a finite number >= 0 for the entropy criterion",
        ),
        (["--exit-threshold", "0.5", "--model", "zoo:lab-baseloop"], "zoo:lab-baseloop has no exit gate"),
        (["--exit-threshold", "0.5", "--model", "zoo:qwen3-tiny-small"], "none of the sweep's models loops"),
    ],
)
def test_a_bad_exit_axis_is_one_line_and_exit_2_before_any_write(
    args: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    model = [] if "--model" in args else ["--model", "zoo:ouro-tiny"]
    assert main(["run", *model, *args, "--limit", "1", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not db.exists(), "refused before the first write"


def test_a_sweep_file_sweeps_the_same_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('models = ["zoo:ouro-tiny"]\nexit_threshold = [1.0, 0.5]\nexit_criterion = "gate"\n')
    from_file = build_request({}, str(path)).specs
    from_flags = build_request(dict(models=["zoo:ouro-tiny"], exit_thresholds=[0.5, 1.0])).specs
    assert (
        from_file == from_flags and from_file[0].exit_thresholds == (0.5, 1.0) and from_file[0].exit_criterion == "gate"
    )
    path.write_text('models = ["zoo:ouro-tiny"]\nexit_threshold = [0.5, "high"]\n')
    with pytest.raises(Exception, match="exit_threshold must be a non-empty list of finite numbers"):
        build_request({}, str(path))


def test_runs_off_the_axis_pass_no_exit_override() -> None:
    (spec,) = build_request(dict(models=["zoo:ouro-tiny"])).specs
    assert spec.exit_thresholds == () and spec.exit_criterion is None
    assert "exit_threshold" not in spec.run_overrides(_run())
    (kl,) = build_request(dict(models=["zoo:ouro-tiny"], exit_thresholds=[0.1], exit_criterion="kl")).specs
    assert kl.run_overrides(_run(exit_threshold=0.1, exit_criterion="kl")) == {
        "seed": 0,
        "exit_threshold": 0.1,
        "exit_criterion": "kl",
    }
    (gate,) = build_request(dict(models=["zoo:ouro-tiny"], exit_thresholds=[0.5])).specs
    assert gate.run_overrides(_run(exit_threshold=0.5, exit_criterion="gate")) == {"seed": 0, "exit_threshold": 0.5}, (
        "the engine's default criterion is not passed"
    )


def _run(**axes: Any) -> PlannedRun:
    """A run of zoo:ouro-tiny at r = 4 at these points of the axes."""
    return PlannedRun("zoo:ouro-tiny", 4, "synthetic", (), {}, 0, **axes)


def _energy_of(sampler: MemorySampler) -> Any:
    sampler.start()
    sum(range(100_000))
    sampler.stop()
    return sampler.energy_joules()


def test_gpu_energy_is_unavailable_without_nvml_and_a_delta_with_it() -> None:
    """NVML's total-energy counter, read at the start and on request: None (n/a) where there is no NVML, never 0."""
    sampler = MemorySampler()
    energy = _energy_of(sampler)
    if "nvml" in sampler.unavailable or "nvml_energy" in sampler.unavailable:
        assert energy is None
    else:  # a GPU with the counter (Volta and newer): joules spent on the device meanwhile
        assert energy is not None and energy >= 0
