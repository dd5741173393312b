"""One view layer: the report and the app draw every figure from `dashboards.views`, so they cannot drift.

On the real tiny sweep's database (conftest.py): a view registered once shows in both pages, each view's
figure is the same in the report and in the app's callback for the same selection, and the shared
choices (series thinning, titles, the runs table's columns) hold in both.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest
from dash import dcc

from analysis import names
from dashboards import trace_figures, views
from dashboards.app import create_app, set_choices
from dashboards.report import build_report, report_figures
import measures
from db import queries
from db.session import open_existing

pytestmark = pytest.mark.slow  # needs the real sweep of conftest.py


@pytest.fixture()
def engine(results_url: str):
    engine = open_existing(results_url)
    yield engine
    engine.dispose()


def _kv_peak(engine: Any, picked: views.Selection) -> pd.DataFrame:
    peaks = queries.memory_peaks(engine)
    return peaks[peaks["run_id"] == picked.run_id]


def _kv_bar(peaks: pd.DataFrame, picked: views.Selection) -> go.Figure:
    return go.Figure(
        go.Bar(x=["KV peak"], y=peaks["kv_bytes_allocated"].tolist()),
        layout={"title": f"KV peak of run {picked.run_id}"},
    )


EXTRA = views.View(
    title="KV peak per run",
    inputs=("run",),
    query=_kv_peak,
    plots=(views.Plot("kv-peak", "kvpeak", _kv_bar),),
    cases=lambda engine: [views.Selection(run_id=int(r)) for r in queries.runs(engine)["run_id"]],
)


def _callback(app: Any, view: views.View, values: dict[str, Any]) -> dict[str, Any]:
    """The view's callback as the browser calls it: `values` by element id, the timer's tick unset."""
    outputs = [("answer", "children")] * (view.answer is not None) + [(plot.id, "figure") for plot in view.plots]
    single = len(outputs) == 1
    body = {
        "output": f"{outputs[0][0]}.{outputs[0][1]}" if single else ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
        "outputs": ({"id": outputs[0][0], "property": outputs[0][1]} if single
                    else [{"id": i, "property": p} for i, p in outputs]),
        "inputs": [*({"id": name, "property": "value", "value": values[name]} for name in view.inputs),
                   {"id": "refresh", "property": "n_intervals", "value": None}],
        "changedPropIds": [], "state": [],
    }  # fmt: skip
    reply = app.server.test_client().post("/_dash-update-component", base_url="http://127.0.0.1:8050", json=body)
    assert reply.status_code == 200, reply.data[:500]
    return reply.get_json()["response"]


def _report_blobs(page: str) -> dict[str, Any]:
    return json.loads(re.search(r'<script id="figures" type="application/json">(.*?)</script>', page).group(1))


def test_a_view_registered_once_shows_in_the_report_and_the_app(engine, results_url: str, monkeypatch) -> None:
    monkeypatch.setattr(views, "VIEWS", [*views.VIEWS, EXTRA])
    run_id = int(queries.runs(engine)["run_id"].iloc[0])
    stored = float(queries.memory_peaks(engine).set_index("run_id").at[run_id, "kv_bytes_allocated"])

    page = build_report(engine)
    assert "<h2>KV peak per run</h2>" in page and '<div id="kv-peak" class="plot" style="height: 480px">' in page
    blob = _report_blobs(page)[f"kvpeak|{run_id}"]
    assert blob["data"][0]["y"] == [stored] and blob["layout"]["title"]["text"] == f"KV peak of run {run_id}"
    assert '"plots": [["kv-peak", "kvpeak"]]' in page  # the page's script draws it when the run selector changes

    app = create_app(results_url)
    layout = app.layout()
    assert isinstance(layout["kv-peak"], dcc.Graph) and "kv-peak.figure" in app.callback_map
    figure = _callback(app, EXTRA, {"run": run_id})["kv-peak"]["figure"]
    assert figure["data"][0]["y"] == [stored] and figure["layout"]["title"]["text"] == f"KV peak of run {run_id}"


def _selector_values(engine: Any, view: views.View, picked: views.Selection) -> dict[str, Any]:
    """The values the app's selectors hold for `picked`, its checklists ticking every model and loop count of the set."""
    models, _, loops, _, _, _ = set_choices(engine, picked.set_id, picked.measure)
    live = {"models": models, "loops": loops, "context": picked.context_tokens}
    return {name: live[name] if name in live else getattr(picked, views.FIELDS[name]) for name in view.inputs}


def test_each_view_draws_the_same_figure_in_the_report_and_the_app(engine, results_url: str) -> None:
    """Titles, thinning and selections alike: the app's callback returns what the report embeds for the same choice."""
    blobs = report_figures(engine)
    app = create_app(results_url)
    for view in views.VIEWS:
        for picked in [p for case in list(view.cases(engine))[:1] for p in list(view.variants(case))[:2]]:
            response = _callback(app, view, _selector_values(engine, view, picked))
            if view.answer is not None:
                assert response["answer"]["children"] == blobs[view.key("answer", picked)]
            for plot in view.plots:
                assert response[plot.id]["figure"] == blobs[view.key(plot.key, picked)], (plot.id, picked)


def test_the_report_draws_the_same_figures_in_forked_processes_as_in_one(engine) -> None:
    """The report shares its cases out among forked processes: every figure and answer, and their order, as drawn in one."""
    alone = report_figures(engine, processes=1)
    shared = report_figures(engine, processes=3)
    assert len(alone) >= 100 and list(shared.items()) == list(alone.items())


def _fails_on_the_second_run(engine: Any, picked: views.Selection) -> pd.DataFrame:
    if picked.run_id == int(queries.runs(engine)["run_id"].iloc[1]):
        raise ValueError(f"the query of run {picked.run_id} failed")
    return _kv_peak(engine, picked)


def test_an_error_in_a_forked_process_is_raised_by_the_report(engine, monkeypatch) -> None:
    """The second run's case is drawn in the forked process of two; its error reaches the caller as it was raised."""
    failing = views.View(
        title="KV peak per run", inputs=("run",), query=_fails_on_the_second_run, plots=EXTRA.plots, cases=EXTRA.cases
    )
    monkeypatch.setattr(views, "VIEWS", [failing])
    second = int(queries.runs(engine)["run_id"].iloc[1])
    with pytest.raises(ValueError, match=f"^the query of run {second} failed$"):
        report_figures(engine, processes=2)
    assert int(queries.runs(engine)["run_id"].iloc[1]) == second  # the caller's engine still answers after the fork


def test_memory_over_a_run_is_thinned_keeping_each_peak_and_titled_by_the_run(engine) -> None:
    runs = queries.runs(engine)
    run = runs.iloc[
        max(range(len(runs)), key=lambda i: len(queries.memory_series(engine, int(runs["run_id"].iloc[i]))))
    ]
    series = queries.memory_series(engine, int(run["run_id"]))
    thin = views.thinned(series, limit=3)
    assert len(series) > 3 and len(thin) == 3
    for measure in measures.SERIES_MEASURES:
        if series[measure].notna().any():
            assert thin[measure].max() == series[measure].max()
    (memory_run,) = [view for view in views.VIEWS if view.plots[0].id == "memory-run"]
    series, title = memory_run.query(engine, views.Selection(run_id=int(run["run_id"])))
    assert (
        title == f"Memory over run {run['run_id']}: {run['model']} {names.loops_label(run['loops'])} ({run['suite']})"
    )
    assert len(series) <= views.MAX_SERIES_POINTS


def test_the_runs_table_shows_every_peak_the_views_choose(engine) -> None:
    """The report's runs table lists `measures.RUN_TABLE_MEASURES`, the KV pool reserved included, as stored."""
    page = build_report(engine)
    table = re.search(r"<table class='runs'>(.*?)</table>", page).group(1)
    assert re.findall(r"<th>(.*?)</th>", table) == list(views.RUN_COLUMNS)
    assert "kv_bytes_reserved" in measures.RUN_TABLE_MEASURES
    rows = {row[0]: row for row in views.runs_table(engine)}
    reserved = queries.memory_peaks(engine).set_index("run_id")["kv_bytes_reserved"]
    column = views.RUN_COLUMNS.index(measures.BY_NAME["kv_bytes_reserved"].label)
    assert {run_id: row[column] for run_id, row in rows.items()} == {
        run_id: measures.byte_text(reserved.get(run_id)) for run_id in rows
    }
    assert sum(row[column] != "n/a" for row in rows.values()) >= 4  # the engine runs store their pool
    energy = queries.runs(engine, kind=None).set_index("run_id")["energy_joules"]
    column = views.RUN_COLUMNS.index(measures.COMPUTE_BY_NAME["energy_joules"].label)
    assert {run_id: row[column] for run_id, row in rows.items()} == {
        run_id: measures.energy_text(energy.get(run_id)) for run_id in rows
    }
    if energy.isna().all():  # no NVML energy counter where these runs ran: unavailable, never 0
        assert {row[column] for row in rows.values()} == {"n/a"}


def test_selections_from_the_app_read_as_the_report_reads_them() -> None:
    """An unset task is the suite mean, a bad context the default, an unset checklist keeps nothing."""
    picked = views.selection({"set": "abc", "task": None, "context": -1, "models": None, "loops": [2]})
    assert picked == views.Selection(set_id="abc", task="all", models=(), loops=(2,))
    assert views.selection({"depth-set": "abc"}) == views.Selection(set_id="abc")
    assert views.selection({"probe": 7}) == views.Selection(run_id=7) == views.selection({"run": 7})


def test_memory_over_a_run_opens_on_a_run_of_the_default_set_in_both_pages(two_sets_url: str) -> None:
    """After the default job the recurrence lab's runs come first; the figure opens on the headline's set instead:
    here the later sweep's one run, not run 1 of the first sweep."""
    engine = open_existing(two_sets_url)
    runs, sets = queries.runs(engine), queries.run_sets(engine)
    latest = set(sets.loc[sets["set_id"] == queries.latest_set(engine), "run_id"])
    opening = views.SELECTORS["run"].first(engine, [(run_id, "") for run_id in runs["run_id"]])
    assert opening == min(latest) != runs["run_id"].min()
    page = build_report(engine)
    assert f'<option value="{opening}" selected>' in page  # the report's selector, as the app's
    probes = next(view for view in views.VIEWS if view.title == "Loop probes")
    assert [case.run_id for case in probes.cases(engine)] == [None], "no probe run: one case, saying how to make one"
    assert '"probe|": {' in page and trace_figures.PROBE_EXAMPLE in page, (
        "the empty selector's key: the drawing of that case"
    )
    engine.dispose()


def test_the_report_leaves_out_a_figure_without_data_and_says_how_to_fill_it(engine) -> None:
    """The tiny sweep has profiles but no probe run, and no GPU energy on a CPU: those two figures are one line each
    in the report (no blank plot, no selector), the profile figure is drawn, and the page's script draws neither."""
    if queries.probe_values(engine).shape[0] or _energy_measured(engine):
        pytest.skip("this machine measured what the test needs missing")
    page = build_report(engine)
    for plot, fill in (("probe-values", "loopeval probe"), ("accuracy-energy", "NVIDIA GPU")):
        assert f'<div id="{plot}"' not in page
        (line,) = re.findall(rf'<p class="note empty" id="{plot}-empty">([^<]*)</p>', page)
        assert line.startswith("No data for this figure yet: ") and fill in line
    assert '<div id="memory-context"' in page and 'id="memory-context-empty"' not in page
    assert '<select id="probe">' not in page, "no selector for a figure left out"
    drawn = [div for view in json.loads(_script(page, "views")) for div, _ in view["plots"]]
    assert "memory-context" in drawn and not {"probe-values", "accuracy-energy"} & set(drawn)


def _energy_measured(engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql("SELECT COUNT(*) FROM runs WHERE energy_joules IS NOT NULL").scalar())


def _script(page: str, element: str) -> str:
    return re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', page, flags=re.S).group(1)
