"""`loopeval results` as the answer: accuracy per GB ranked within one evaluation set, the frontier marked,
memory in readable units, filters, per-task scores, profiles apart, `--json` with every field, 100 columns."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from db.headline import rounded
from db.sets import run_set
from db.store import Store
from harness.cli import main
from tests.support.rich_tables import body_rows
from tests.support.stored_runs import store_run

SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 4, "seed": 0, "stop": []}
LONG = "transformers:/models/checkpoints/a-rather-long-directory-name/ouro-1.4b-thinking-step-120000"
TASKS = ["addition", "chain2", "lookup"]


def _run(
    store: Store,
    sweep: str,
    model: str,
    loops: int | None,
    scores: dict[str, float],
    kv: int,
    limit: int | None = None,
    status: str = "finished",
    per_token: int | None = None,
) -> int:
    run_id = store.create_run(
        sweep_id=sweep,
        model_spec=model,
        adapter=model.partition(":")[0],
        loops=loops,
        suite="synthetic",
        tasks=list(scores) or TASKS,
        limit=limit,
        sampling=SAMPLING,
        seed=0,
        data_fingerprint="d" * 64,
        status=status,
        model_config=None if per_token is None else {"kv_bytes_per_token": per_token},
    )
    if status == "finished":
        store.set_metrics(run_id, {t: {"pass@k:k=1&n=4": (v, 0.05)} for t, v in scores.items()})
    store.set_memory_peaks(run_id, {"weights_bytes": 1_000_000, "kv_bytes_allocated": kv, "nvml_process": None})
    return run_id


@pytest.fixture()
def db(tmp_path: Path) -> str:
    """Two sweeps on one set, a third on another (fewer items), a failed run and a profile."""
    path = tmp_path / "r.sqlite"
    store = Store.open(str(path))
    _run(store, "aaaa1111", "zoo:ouro-tiny", 2, dict(zip(TASKS, (0.2, 0.6, 1.0))), 400_000, per_token=2048)
    _run(store, "aaaa1111", "zoo:ouro-tiny", 4, dict(zip(TASKS, (0.3, 0.7, 1.0))), 800_000, per_token=4096)
    _run(store, "bbbb2222", LONG, None, dict(zip(TASKS, (0.5, 0.9, 1.0))), 3_000_000_000)  # no KV per token described
    _run(store, "bbbb2222", "zoo:melt-tiny", 4, dict(zip(TASKS, (0.1, 0.5, 1.0))), 200_000, per_token=1024)
    _run(store, "bbbb2222", "zoo:melt-tiny", 8, {}, 0, status="failed", per_token=1024)
    profile = store.create_run(
        sweep_id="cccc3333", kind="profile", model_spec="preset:melt-tiny", adapter="preset", suite="profile"
    )
    store.add_profile_points(
        profile,
        [
            dict(
                context_tokens=n,
                batch=1,
                loops=2,
                weights_bytes=1_000_000,
                kv_bytes_analytic=100 * n,
                kv_bytes_allocated=100 * n,
                rss=200_000_000,
            )
            for n in (16, 64)
        ],
    )
    store.finish_run(profile, "finished")
    _run(store, "dddd4444", "zoo:ouro-tiny", 4, {"chain2": 0.9}, 800_000, limit=5)  # the latest sweep: another set
    store.close()
    return str(path)


def _results(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["results", *args]) == 0
    return capsys.readouterr().out


def _rows(out: str, table: int = 0) -> list[list[str]]:
    """The rows of the `table`-th table: the ranking (0), what a generated token cost (1)."""
    return body_rows(out)[table]


def test_the_latest_set_is_shown_and_the_others_named(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _results(capsys, "--db", db)
    assert out.splitlines()[0].startswith("set ") and "chain2 · first 5 per task" in out.splitlines()[0]
    assert [row[1:4] for row in _rows(out)] == [
        ["zoo:ouro-tiny", "4", "0.900 ± 0.098"]
    ]  # one seed a row: no seeds column
    assert "other evaluation sets" in out and "addition, chain2, lookup · all items" in out and "(5 runs)" in out
    assert re.search(
        r"1 profile run: \S*loopeval results --profiles --db " + re.escape(db) + "$", out, re.M
    )  # runs as printed


def test_one_set_is_ranked_by_accuracy_per_gb_with_the_frontier(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store.read(db)
    older = next(r["set_id"] for r in store.run_summaries() if r["sweep_id"] == "aaaa1111")
    store.close()
    out = _results(capsys, "--db", db, "--set", older, "--measure", "weights_bytes + kv_bytes_allocated")
    # accuracy = mean over the three tasks, ± 1.96 x its stderr; memory = 1 MB weights + KV; per GB = accuracy / (bytes / 1e9);
    # KV/token as the adapter described it (n/a where it did not)
    # * beside the rank marks the Pareto frontier
    assert _rows(out) == [
        ["1*", "zoo:melt-tiny", "4", "0.533 ± 0.057", "1.2 MB", "444", "4"],
        ["2*", "zoo:ouro-tiny", "2", "0.600 ± 0.057", "1.4 MB", "429", "1"],
        ["3*", "zoo:ouro-tiny", "4", "0.667 ± 0.057", "1.8 MB", "370", "2"],
        ["4*", LONG, "1", "0.800 ± 0.057", "3 GB", "0.267", "3"],
        ["", "zoo:melt-tiny", "8", "failed", "n/a", "n/a", "5"],  # no score: listed last, never ranked
    ]
    # the same rows under the same ranks: what a generated token cost; these runs stored no samples or timings
    assert _rows(out, 1) == [
        ["1*", "zoo:melt-tiny", "4", "1.02 KB", "n/a", "n/a", "n/a"],
        ["2*", "zoo:ouro-tiny", "2", "2.05 KB", "n/a", "n/a", "n/a"],
        ["3*", "zoo:ouro-tiny", "4", "4.1 KB", "n/a", "n/a", "n/a"],
        ["4*", LONG, "1", "n/a", "n/a", "n/a", "n/a"],
        ["", "zoo:melt-tiny", "8", "1.02 KB", "n/a", "n/a", "n/a"],
    ]
    assert "KV/token: what one more token of context adds" in re.sub(r"\s+", " ", out)
    flat = re.sub(r"\s+", " ", out)
    assert "memory: weights + KV cache peak (what the model holds, weights counted)," in flat
    assert "decimal units (1 GB = 1e9 bytes)" in flat
    assert "pass@k" not in out


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("weights_bytes + kv_bytes_peak", "weights_bytes + kv_bytes_allocated"),
        ("kv_bytes_peak", "kv_bytes_allocated"),
        ("rss_peak", "rss"),
    ],
)
def test_a_measure_named_as_before_0007_prints_the_same_table(
    db: str, capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    """Commands written before the peaks took the series' names keep working: the old name is today's measure."""
    assert _results(capsys, "--db", db, "--measure", old) == _results(capsys, "--db", db, "--measure", new)


def test_an_unknown_measure_is_one_line_and_exit_2(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["results", "--db", db, "--measure", "kv_bytes_maximum"]) == 2
    err = capsys.readouterr().err
    assert "--measure must be one of" in err and "kv_bytes_maximum" in err and "Traceback" not in err


def test_filters_narrow_the_runs(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _results(capsys, "--db", db, "--sweep", "aaaa")
    assert [(row[1], row[2]) for row in _rows(out)] == [("zoo:ouro-tiny", "2"), ("zoo:ouro-tiny", "4")]
    assert [(row[1], row[2]) for row in _rows(out, 1)] == [("zoo:ouro-tiny", "2"), ("zoo:ouro-tiny", "4")]
    assert "other evaluation sets" not in out
    out = _results(capsys, "--db", db, "--model", "zoo:melt-tiny")
    assert {row[1] for row in _rows(out)} == {"zoo:melt-tiny"}
    out = _results(capsys, "--db", db, "--last", "2")  # the profile and the latest run
    assert len(_rows(out)) == 1 and "1 profile run" in out
    out = _results(capsys, "--db", db, "--suite", "synthetic", "--tasks")
    assert [row[3:5] for row in _rows(out)] == [
        ["chain2", "0.900 ± 0.098"],
        ["[arithmetic]", "0.900"],
        ["mean", "0.900 ± 0.098"],
    ]


def test_per_task_scores_and_profiles_have_their_own_views(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = _results(capsys, "--db", db, "--sweep", "aaaa", "--tasks")
    assert [row[:5] for row in _rows(out)][:6] == [
        ["zoo:ouro-tiny", "2", "1", "addition", "0.200 ± 0.098"],
        ["", "", "", "chain2", "0.600 ± 0.098"],
        ["", "", "", "lookup", "1.000 ± 0.098"],
        ["", "", "", "[arithmetic]", "0.400"],
        ["", "", "", "[recall]", "1.000"],
        ["", "", "", "mean", "0.600 ± 0.057"],
    ]  # task groups (db.headline.TASK_GROUPS) before the mean
    out = _results(capsys, "--db", db, "--profiles")
    assert _rows(out) == [["6", "preset:melt-tiny", "2", "1", "16-64", "1 MB", "6.4 KB", "6.4 KB", "200 MB rss"]]


def test_json_keeps_every_field_and_follows_the_filters(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    runs = json.loads(_results(capsys, "--db", db, "--json"))
    assert [r["id"] for r in runs] == [1, 2, 3, 4, 5, 6, 7]
    first = runs[0]
    for key in (
        "sweep_id",
        "model",
        "loops",
        "suite",
        "tasks",
        "status",
        "n_samples",
        "metrics",
        "pass_at_1",
        "stderr",
        "memory",
        "kv_bytes_per_token",
        "limit",
        "sampling",
        "seed",
        "data_fingerprint",
        "set_id",
        "set_label",
    ):
        assert key in first, key
    assert (
        first["set_id"]
        == run_set(dict(suite="synthetic", tasks=TASKS, limit=None, sampling=SAMPLING, data_fingerprint="d" * 64)).id
    )
    assert runs[5]["kind"] == "profile" and runs[5]["set_id"] is None
    only = json.loads(_results(capsys, "--db", db, "--json", "--set", first["set_id"], "--model", "zoo:ouro-tiny"))
    assert [r["id"] for r in only] == [1, 2]


def test_fits_100_columns_without_cutting_names(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    for args in ([], ["--sweep", "bbbb"], ["--sweep", "bbbb", "--tasks"], ["--profiles"]):
        out = _results(capsys, "--db", db, *args)
        assert max(len(line) for line in out.splitlines()) <= 100, out
        assert "…" not in out, out
    folded = "".join(re.sub(r"\s", "", row[1]) for row in _rows(_results(capsys, "--db", db, "--sweep", "bbbb")))
    assert LONG in folded, "the long model name is wrapped, never cut"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--sweep", "zzzz"], "--sweep zzzz: no stored sweep"),
        (["--model", "zoo:nope"], "--model zoo:nope: no stored run"),
        (["--suite", "paper"], "--suite paper: no stored run"),
        (["--set", "00000000"], "--set 00000000: no such evaluation set"),
        (["--measure", "bogus"], "--measure must be one of"),
        (["--rank", "bogus"], "--rank must be one of per-gb, accuracy, per-layer-pass, speed"),
    ],
)
def test_a_filter_that_matches_nothing_is_one_line_and_exit_2(
    db: str, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    for json_flag in ([], ["--json"]):
        if json_flag and args[0] in ("--measure", "--rank"):
            continue  # --json prints every field, the measure and the order are not chosen there
        assert main(["results", "--db", db, *args, *json_flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_results_and_the_readme_table_script_print_one_mean_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A suite mean of exactly 0.1425 sums to 0.14250000000000002 in one task order and 0.1425 (a hair below) in
    another; `results` and scripts/results_tables.py must print the same digits whichever order each sums in."""
    scores = {"c30k2": 0.03, "c30k4": 0.48, "c30k6": 0.044, "c30k8": 0.016}
    orders = {f"{sum(p) / 4:.3f}" for p in itertools.permutations(scores.values())}
    assert orders == {"0.142", "0.143"}, "the case this test is about: the plain format depends on the summing order"
    path = str(tmp_path / "r.sqlite")
    store = Store.open(path)
    run_id = _run(store, "eeee5555", "zoo:melt-tiny", 1, scores, 2_500_000)
    # the suite mean as stored beside the tasks: 0.1425 exactly as the float nearest to it, a hair below
    store.set_metrics(
        run_id, {**{t: {"pass@k:k=1&n=4": (v, 0.05)} for t, v in scores.items()}, "all": {"pass@1": (0.1425, None)}}
    )
    store.close()
    shown = _rows(_results(capsys, "--db", path))[0][3]
    listed = subprocess.run(
        [sys.executable, "scripts/results_tables.py"],
        input=_results(capsys, "--db", path, "--json"),
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    average = listed.stdout.splitlines()[2].split(" | ")[-4]
    assert shown.split(" ± ")[0] == average == rounded(0.1425)


def test_configurations_are_rows_of_their_own_and_the_answer_comes_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two configurations of ouro-tiny r=4 (float32, bfloat16) and melt-tiny: a row each, a config column saying what
    tells the model's rows apart, and last the answer naming the best point and the measure, with whether the weights
    are counted and what another measure would rank first (stored_runs: 2 MB of weights a run)."""
    path = str(tmp_path / "configs.sqlite")
    store = Store.open(path)
    store_run(store, [1.0, 1.0, 1.0, 0.0])
    store_run(store, [1.0, 1.0, 0.0, 0.0], overrides={"dtype": "bfloat16"}, kv=500_000)
    store_run(store, [1.0, 0.0, 0.0, 0.0], model="zoo:melt-tiny", kv=100_000)
    store.close()
    out = _results(capsys, "--db", path)
    assert [row[1:4] + row[5:7] for row in _rows(out)] == [  # model, r, config; memory (weights + KV), pass@1 per GB
        ["zoo:ouro-tiny", "4", "", "3 MB", "250"],
        ["zoo:ouro-tiny", "4", "dtype=bfloat16", "2.5 MB", "200"],
        ["zoo:melt-tiny", "4", "", "2.1 MB", "119"],
    ]
    flat = re.sub(r"\s+", " ", out).strip()
    assert (
        "memory: weights + KV cache peak (what the model holds, weights counted)" in flat
        and "config: what tells a model's rows apart" in flat
    )
    assert flat[flat.index("Best by") :] == (
        "Best by pass@1 per GB of weights + KV cache peak (what the model holds, weights counted): zoo:ouro-tiny r=4 "
        "(0.750 at 3 MB), 250 pass@1 per GB; the frontier: zoo:melt-tiny r=4 (0.250 at 2.1 MB) → zoo:ouro-tiny r=4 "
        "dtype=bfloat16 (0.500 at 2.5 MB) → zoo:ouro-tiny r=4 (0.750 at 3 MB); by KV cache peak alone, zoo:melt-tiny "
        "r=4 would rank first."
    )
    flat = re.sub(r"\s+", " ", _results(capsys, "--db", path, "--measure", "kv_bytes_allocated")).strip()
    assert "memory: KV cache peak (weights not counted)" in flat
    assert flat.endswith("; by weights + KV cache peak, zoo:ouro-tiny r=4 would rank first.")
    assert [row[1] for row in _rows(_results(capsys, "--db", path, "--tasks")) if row[1]] == [
        "4",
        "4 dtype=bfloat16",
        "4",
    ]
    runs = json.loads(_results(capsys, "--db", path, "--json"))
    assert [r["overrides"] for r in runs] == [{}, {"dtype": "bfloat16"}, {}]


def test_piped_without_columns_the_answer_and_the_title_are_one_line_each(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Into a pipe or a file (capsys is neither a terminal) with no $COLUMNS the answer is its own whole line, never
    wrapped between a value and its unit ("2.02" / "MB"), and a table's title is not wrapped to the table's width."""
    monkeypatch.delenv("COLUMNS", raising=False)
    lines = _results(capsys, "--db", db).splitlines()
    answer = lines[-1]
    assert answer.startswith("Best by pass@1 per GB") and answer.endswith(").") and len(answer) > 150, lines
    assert main(["estimate", "ouro-1.4b", "--tokens", "32000"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.startswith("preset:ouro-1.4b: 32000 tokens x batch 1") and title.endswith(")"), title
