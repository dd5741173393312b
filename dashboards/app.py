"""The served dashboard (Dash): the report's figures, live from the database, with filters.

Every callback queries the database again, and a timer redraws every few seconds, so a sweep that
is still running fills in while you watch. Model outputs reach the page only through Dash's
DataTable, which renders strings as text (no markdown, no HTML), so untrusted output cannot run.

The app has no login, so what it answers is guarded (`_guard`): only requests naming an allowed
host in their Host header (a DNS-rebinding page names its own), bodies up to MAX_REQUEST_BYTES
(else 413), callback requests whose shape and values match a declared callback (else 400, one
line, no stack trace), and no page or file but the app's own (404). Every answer carries the
security headers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
from dash import Dash, Input, Output, State, dash_table, dcc, html
from dash.exceptions import DependencyException
from flask import abort, request
from sqlalchemy import Engine

from dashboards import figures
from dashboards.data import (DEFAULT_CONTEXT_TOKENS, SAMPLE_BUDGET, SAMPLE_TEXT_CHARS, accuracy_points, browse_samples,
                             depth_points, probe_title, profile_points, set_choice)
from db import queries
from db.session import open_existing
import measures

REFRESH_SECONDS = 10
SAMPLE_COLUMNS = {
    "run_id": "run", "model": "model", "loops": "loops", "task": "task", "doc_id": "doc", "sample_index": "sample",
    "prompt": "prompt", "output": "output", "gold": "gold", "score": "score", "prompt_tokens": "prompt tokens",
    "generated_tokens": "generated tokens", "verdict": "verdict",
}
GRAPH_CONFIG = {"displaylogo": False}  # Plotly's logo links to plotly.com: no link in the page may leave it
ANSWER_STYLE = {"fontSize": "1.1em", "background": "#f2f6fc", "borderLeft": "4px solid #3a6fc4", "padding": "0.7em 1em"}
_ROW = {"display": "flex", "gap": "2em", "flexWrap": "wrap", "alignItems": "flex-start", "margin": "0.5em 0"}


def _labelled(label: str, control: Any, width: str | None = None) -> html.Div:
    return html.Div([html.Label(label, style={"fontWeight": "bold"}), control], style={"minWidth": width or "10em"})


def _filtered(points: pd.DataFrame, models: list[str] | None, loops: list[int] | None) -> pd.DataFrame:
    """Keep the selected models and loop counts (an empty selection keeps nothing, as the checkboxes show)."""
    return points[points["model"].isin(models or []) & points["loops"].isin(loops or [])]


def _doc_number(doc_id: str) -> int | str:
    """A numeric doc id as a number, so the table's sort puts doc 10 after doc 9."""
    return int(doc_id) if doc_id.isdigit() else doc_id


def set_choices(engine: Engine, set_id: str | None, measure: str | None) -> tuple[list, list, list, list, list, str]:
    """What the filters offer for the selected set: its own models and loop counts (all checked) and the memory
    measures some run of it has (NVML and torch only where a GPU was measured), keeping `measure` if it is one."""
    points = accuracy_points(engine, set_id) if set_id else pd.DataFrame(columns=["model", "loops"])
    models = sorted(points["model"].unique().tolist())
    loops = sorted(int(r) for r in points["loops"].dropna().unique())
    present = figures.available_measures(points) or list(figures.MEMORY_MEASURES)
    options = [{"label": figures.MEMORY_MEASURES[key], "value": key} for key in present]
    return models, models, loops, loops, options, measure if measure in present else present[0]


def _layout(engine: Engine) -> html.Div:
    """Built on every page load, so a reload sees runs added since the server started."""
    sets = queries.eval_sets(engine)  # the default first: the set of the newest scored run
    set_options = [{"label": set_choice(s), "value": s.set_id} for s in sets.itertuples()]
    eval_runs = queries.runs(engine)
    models = sorted(eval_runs["model"].unique().tolist())
    run_options = [{"label": f"run {r.run_id}: {r.model} {figures.loops_label(r.loops)} ({r.suite})", "value": r.run_id}
                   for r in eval_runs.itertuples()]
    probe_options = [{"label": probe_title(rows), "value": run_id} for run_id, rows in queries.probe_values(engine).groupby("run_id")]
    return html.Div([
        html.H1("loopeval"),
        html.P(f"Accuracy per gigabyte, live from the results database. {figures.DECIMAL_NOTE}. "
               "Unavailable measures are named, never drawn as zero."),
        html.Div([
            _labelled("evaluation set", dcc.Dropdown(
                set_options, set_options[0]["value"] if set_options else None, id="set", clearable=False), "32em"),
            _labelled("task", dcc.Dropdown([], None, id="task", clearable=False)),
            _labelled("models", dcc.Checklist([], [], id="models")),  # the set's own, filled by `_choices`
            _labelled("loops", dcc.Checklist([], [], id="loops", inline=True)),
            _labelled("memory measure", dcc.RadioItems([], None, id="measure")),
            _labelled("analytic context (tokens)", dcc.Input(
                id="context", type="number", min=1, step=1, value=DEFAULT_CONTEXT_TOKENS, debounce=True)),
        ], style=_ROW),
        html.P(id="answer", style=ANSWER_STYLE),
        dcc.Graph(id="accuracy-memory", config=GRAPH_CONFIG, style={"height": "560px"}),
        dcc.Graph(id="accuracy-loops", config=GRAPH_CONFIG, style={"height": "520px"}),
        html.H2("Depth extrapolation"),
        html.P("Accuracy per task group against the loop count r; the set opens on the widest sweep of r."),
        dcc.Dropdown(set_options, queries.depth_set(engine), id="depth-set", clearable=False),
        dcc.Graph(id="depth", config=GRAPH_CONFIG, style={"height": "480px"}),
        html.H2("Memory over a run"),
        dcc.Dropdown(run_options, run_options[0]["value"] if run_options else None, id="run", clearable=False),
        dcc.Graph(id="memory-run", config=GRAPH_CONFIG, style={"height": "480px"}),
        html.H2("Loop probes"),
        dcc.Dropdown(probe_options, probe_options[0]["value"] if probe_options else None, id="probe", clearable=False),
        dcc.Graph(id="probe-values", config=GRAPH_CONFIG, style={"height": "640px"}),
        html.H2("Memory against context length"),
        dcc.Graph(id="memory-context", config=GRAPH_CONFIG, style={"height": "480px"}),
        html.H2("Samples"),
        html.Div([
            _labelled("task", dcc.Dropdown(queries.sample_tasks(engine), None, id="sample-task",
                                           placeholder="all tasks")),
            _labelled("model", dcc.Dropdown(models, None, id="sample-model", placeholder="all models"), "20em"),
            _labelled("show", dcc.RadioItems(
                [{"label": "all", "value": "all"}, {"label": "correct", "value": "correct"},
                 {"label": "wrong", "value": "wrong"}], "all", id="sample-verdict", inline=True)),
        ], style=_ROW),
        html.P(id="sample-count"),
        dash_table.DataTable(
            id="samples", columns=[{"name": label, "id": key} for key, label in SAMPLE_COLUMNS.items()],
            page_size=20, sort_action="native",
            style_cell={"whiteSpace": "pre-wrap", "textAlign": "left", "verticalAlign": "top",
                        "maxWidth": "28em", "fontFamily": "monospace", "fontSize": "12px"},
        ),
        dcc.Interval(id="refresh", interval=REFRESH_SECONDS * 1000),
    ], style={"fontFamily": "system-ui, sans-serif", "margin": "1.5em"})


# Dash serves its own scripts and inline bootstrap; nothing may come from elsewhere, and the app may not be framed.
APP_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; form-action 'none'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
}


# A last line of defence, as in the report: no anchor drawn in the page (Plotly's SVG ones included) navigates.
INERT_LINKS = 'document.addEventListener("click", (e) => { if (e.target.closest("a")) e.preventDefault(); }, true);'


MAX_REQUEST_BYTES = 1 << 20  # a callback request is a few kB; a larger body is refused (413)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_INT64 = 1 << 63


def _text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _integer(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or (isinstance(value, list) and all(x is not None and check(x) for x in value))


def _number(value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value is None or (number and math.isfinite(value) and abs(value) < _INT64)


# What each callback input or state may hold, by "component.property": a request with anything else is refused
# before a callback runs. One missing here is refused too (tests check the table is complete).
INPUT_CHECKS: dict[str, Callable[[Any], bool]] = {
    "set.value": _text, "task.value": _text, "models.value": _list_of(_text), "loops.value": _list_of(_integer),
    "measure.value": lambda value: value is None or value in figures.MEMORY_MEASURES, "context.value": _number,
    "refresh.n_intervals": _integer, "depth-set.value": _text, "probe.value": _integer, "run.value": _integer,
    "sample-task.value": _text, "sample-model.value": _text,
    "sample-verdict.value": lambda value: value in ("all", "correct", "wrong"),
}  # fmt: skip


def _declared(component: Any) -> dict[str, str]:
    return {"id": component.component_id, "property": component.component_property}


def callback_problem(callbacks: dict[str, dict[str, Any]], body: Any) -> str | None:
    """What is wrong with a `_dash-update-component` request body, or None when it matches a callback."""
    if not isinstance(body, dict) or not isinstance(body.get("output"), str) or body["output"] not in callbacks:
        return "it names no callback of this app"
    spec = callbacks[body["output"]]
    outputs = [_declared(o) for o in spec["output"]] if isinstance(spec["output"], list) else _declared(spec["output"])
    if body.get("outputs") != outputs:
        return "its outputs do not match the callback"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(name, str) for name in changed):
        return "changedPropIds is not a list of names"
    return _values_problem(body.get("inputs"), spec["inputs"], "inputs") or _values_problem(body.get("state", []), spec["state"], "state")


def _values_problem(sent: Any, declared: list[dict[str, str]], part: str) -> str | None:
    """What is wrong with a request's inputs or state (each {id, property, value}) against the callback's."""
    if not isinstance(sent, list) or len(sent) != len(declared):
        return f"its {part} do not match the callback"
    for value, component in zip(sent, declared):
        if not isinstance(value, dict) or {k: value.get(k) for k in component} != component:
            return f"its {part} do not match the callback"
        name = f"{component['id']}.{component['property']}"
        if not INPUT_CHECKS.get(name, lambda _: False)(value.get("value")):  # an unset property comes without one
            return f"{name} cannot take the value sent"
    return None


def allowed_hosts(bound: str, extra: Collection[str] = ()) -> set[str]:
    """The host names a request may name: the bound address, loopback's names when it is loopback, and `extra`."""
    names = {bound.strip("[]").lower(), *(name.strip("[]").lower() for name in extra)}
    return names | set(LOOPBACK_NAMES) if names & set(LOOPBACK_NAMES) else names


def _request_host() -> str | None:
    """The host name the request's Host header names (port apart), None when it names none."""
    host = request.headers.get("Host", "")
    try:
        return None if "@" in host else urlsplit(f"//{host}").hostname
    except ValueError:  # an unbalanced IPv6 bracket
        return None


def _guard(app: Dash, hosts: set[str]) -> Callable[[], None]:
    """Runs before every request: refuses a foreign Host header (400), any page but the app's one (404:
    Dash would serve its index at every path) and a malformed callback (400)."""
    route = app.config.routes_pathname_prefix + "_dash-update-component"
    anywhere = app.config.routes_pathname_prefix + "<path:path>"

    def guard() -> None:
        if _request_host() not in hosts:
            abort(400, description="this server answers only requests for " + ", ".join(sorted(hosts)))
        if request.url_rule is not None and request.url_rule.rule == anywhere:
            abort(404)
        if request.path == route and request.method == "POST":
            try:
                body = request.get_json(silent=True)
            except RecursionError:
                body = None
            problem = callback_problem(app.callback_map, body)
            if problem:
                abort(400, description=f"malformed callback request: {problem}")

    return guard


def _secure(response: Any) -> Any:
    response.headers.update(APP_HEADERS)
    return response


def create_app(db_url: str, hosts: Collection[str] = LOOPBACK_NAMES) -> Dash:
    """The Dash app reading `db_url`, answering requests for `hosts` (see `allowed_hosts`); raises
    db.ResultsError when the database is missing or holds no runs."""
    engine = open_existing(db_url)
    queries.require_results(engine)
    app = Dash(__name__, title="loopeval", serve_locally=True)
    app.index_string = app.index_string.replace("</body>", f"<script>{INERT_LINKS}</script></body>")
    app.layout = lambda: _layout(engine)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.server.before_request(_guard(app, set(hosts)))
    app.server.register_error_handler(DependencyException, lambda _: ("not found", 404))  # a path Dash does not serve
    app.server.after_request(_secure)

    @app.callback(Output("task", "options"), Output("task", "value"), Input("set", "value"))
    def _tasks(set_id: str | None) -> tuple[list[str], str | None]:
        names = queries.tasks(engine, set_id) if set_id else []
        return names, names[0] if names else None

    @app.callback(
        Output("models", "options"), Output("models", "value"), Output("loops", "options"), Output("loops", "value"),
        Output("measure", "options"), Output("measure", "value"), Input("set", "value"), State("measure", "value"),
    )
    def _choices(set_id: str | None, measure: str | None) -> tuple[list, list, list, list, list, str]:
        return set_choices(engine, set_id, measure)

    @app.callback(
        Output("answer", "children"), Output("accuracy-memory", "figure"), Output("accuracy-loops", "figure"),
        Input("set", "value"), Input("task", "value"), Input("models", "value"), Input("loops", "value"),
        Input("measure", "value"), Input("context", "value"), Input("refresh", "n_intervals"),
    )
    def _accuracy(set_id: str | None, task: str | None, models: list[str], loops: list[int], measure: str,
                  context: int | None, _tick: int | None) -> tuple[str, Any, Any]:
        context = int(context) if context and context > 0 else DEFAULT_CONTEXT_TOKENS
        points = _filtered(accuracy_points(engine, set_id, task or "all", context), models, loops)
        label = figures.measure_label(measure, context)
        return (figures.answer(points, measure, label), figures.accuracy_vs_memory(points, measure, task or "all", label),
                figures.accuracy_vs_loops(points, measure, task or "all", label))

    @app.callback(Output("depth", "figure"), Input("depth-set", "value"), Input("refresh", "n_intervals"))
    def _depth(set_id: str | None, _tick: int | None) -> Any:
        return figures.accuracy_vs_depth(depth_points(engine, set_id) if set_id else pd.DataFrame())

    @app.callback(Output("probe-values", "figure"), Input("probe", "value"), Input("refresh", "n_intervals"))
    def _probe(run_id: int | None, _tick: int | None) -> Any:
        values = queries.probe_values(engine)
        values = values[values["run_id"] == run_id]
        return figures.loop_probes(values, probe_title(values) if not values.empty else "Loop probes")

    @app.callback(Output("memory-run", "figure"), Input("run", "value"), Input("refresh", "n_intervals"))
    def _memory_run(run_id: int | None, _tick: int | None) -> Any:
        series = queries.memory_series(engine, run_id) if run_id is not None else pd.DataFrame()
        return figures.memory_over_run(series, measures.SERIES_MEASURES, f"Memory over run {run_id}")

    @app.callback(Output("memory-context", "figure"), Input("refresh", "n_intervals"))
    def _memory_context(_tick: int | None) -> Any:
        return figures.memory_vs_context(profile_points(engine), measures.PROFILE_MEASURES)

    @app.callback(
        Output("samples", "data"), Output("sample-count", "children"),
        Input("sample-task", "value"), Input("sample-model", "value"), Input("sample-verdict", "value"),
        Input("refresh", "n_intervals"),
    )
    def _samples(task: str | None, model: str | None, verdict: str, _tick: int | None) -> tuple[list[dict], str]:
        correct = {"correct": True, "wrong": False}.get(verdict)
        rows = browse_samples(engine, task=task, model=model, correct=correct)
        rows = rows.assign(loops=rows["loops"].map(figures.loops_label), doc_id=rows["doc_id"].map(_doc_number))
        rows = rows[list(SAMPLE_COLUMNS)].astype(object).where(rows[list(SAMPLE_COLUMNS)].notna(), None)
        note = (f"{len(rows)} samples, spread evenly over every run, task and verdict that matches (at most about "
                f"{SAMPLE_BUDGET}); texts over {SAMPLE_TEXT_CHARS} characters are cut")
        return rows.to_dict("records"), note

    return app

