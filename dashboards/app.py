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

import functools
import logging
import math
import sys
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
from dash import Dash, Input, Output, State, dcc, html
from dash.dash_table.DataTable import DataTable
from dash.exceptions import DependencyException
from flask import abort, request
from sqlalchemy import Engine

from analysis.names import available_measures, loops_label
from analysis.points import DEFAULT_CONTEXT_TOKENS, accuracy_points
from dashboards import figures, views
from dashboards.data import SAMPLE_COLUMNS, SAMPLE_TEXT_CHARS, browse_samples, spread_note
from db import ResultsError, queries, sample_queries
from db.session import open_existing
from db.stored import hidden, hide_damaged
import measures

REFRESH_SECONDS = 10
WSGI_THREADS = 4  # requests waitress answers at once: a browser's few callbacks in parallel, on a laptop's cores
GRAPH_CONFIG: dcc.Graph.Config = {
    "displaylogo": False
}  # Plotly's logo links to plotly.com: no link in the page may leave it
ANSWER_STYLE = {"fontSize": "1.1em", "background": "#f2f6fc", "borderLeft": "4px solid #3a6fc4", "padding": "0.7em 1em"}
_ROW = {"display": "flex", "gap": "2em", "flexWrap": "wrap", "alignItems": "flex-start", "margin": "0.5em 0"}


def _labelled(label: str, control: Any, width: str | None = None) -> html.Div:
    return html.Div([html.Label(label, style={"fontWeight": "bold"}), control], style={"minWidth": width or "10em"})


def _doc_number(doc_id: str) -> int | str:
    """A numeric doc id as a number, so the table's sort puts doc 10 after doc 9."""
    return int(doc_id) if doc_id.isdigit() else doc_id


def set_choices(
    engine: Engine, set_id: str | None, measure: str | None
) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any], str]:
    """What the filters offer for the selected set: its own models and loop counts (all checked) and the memory
    measures some run of it has (NVML and torch only where a GPU was measured), keeping `measure` if it is one."""
    points = accuracy_points(engine, set_id) if set_id else pd.DataFrame(columns=["model", "loops"])
    models = sorted(points["model"].unique().tolist())
    loops = sorted(int(r) for r in points["loops"].dropna().unique())
    present = available_measures(points) or list(measures.MEMORY_MEASURES)
    options = [{"label": measures.MEMORY_MEASURES[key], "value": key} for key in present]
    return models, models, loops, loops, options, measure if measure in present else present[0]


# The accuracy view's own selectors (`views.SELECTORS` fills the others): their choices are the selected set's,
# filled by the `_tasks` and `_choices` callbacks. Element id -> (label, the empty control).
_OWN_CONTROLS: dict[str, tuple[str, Callable[[], Any]]] = {
    "task": ("task", lambda: dcc.Dropdown([], None, id="task", clearable=False)),
    "models": ("models", lambda: dcc.Checklist([], [], id="models")),
    "loops": ("loops", lambda: dcc.Checklist([], [], id="loops", inline=True)),
    "measure": ("memory measure", lambda: dcc.RadioItems([], None, id="measure")),
    "context": (
        "analytic context (tokens)",
        lambda: dcc.Input(id="context", type="number", min=1, step=1, value=DEFAULT_CONTEXT_TOKENS, debounce=True),
    ),
}
_WIDE = {"set": "32em"}  # set labels are long


def _control(engine: Engine, name: str) -> tuple[str, Any]:
    """(label, component) of the selector with element id `name`."""
    if name in _OWN_CONTROLS:
        label, make = _OWN_CONTROLS[name]
        return label, make()
    selector = views.SELECTORS[name]
    choices = selector.choices(engine)
    options = [{"label": label, "value": value} for value, label in choices]
    return selector.label, dcc.Dropdown(options, selector.first(engine, choices), id=name, clearable=False)


def _view_section(engine: Engine, view: views.View, shown: tuple[str, ...]) -> list[Any]:
    """A view's heading, note, the selectors `shown` with it (one alone as a bare dropdown, several as a labelled
    row), answer and graphs."""
    controls = [_control(engine, name) for name in shown]
    selectors = [control for _, control in controls]
    if len(controls) > 1:
        row = [_labelled(label, control, _WIDE.get(control.id)) for label, control in controls]
        selectors = [html.Div(row, style=_ROW)]
    return [
        html.H2(view.title),
        *([html.P(view.note)] if view.note else []),
        *selectors,
        *([html.P(id="answer", style=ANSWER_STYLE)] if view.answer else []),
        *(dcc.Graph(id=plot.id, config=GRAPH_CONFIG, style={"height": f"{plot.height}px"}) for plot in view.plots),
    ]


def _layout(engine: Engine) -> html.Div:
    """Built on every page load, so a reload sees runs added since the server started."""
    models = sorted(queries.runs(engine)["model"].unique().tolist())
    return html.Div(
        [
            html.H1("loopeval"),
            html.P(
                f"Accuracy per gigabyte, live from the results database. {figures.DECIMAL_NOTE}. "
                "Unavailable measures are named, never drawn as zero."
            ),
            *(html.P(line, className="skipped") for line in hidden(engine)),
            *(part for view, shown in views.sections() for part in _view_section(engine, view, shown)),
            html.H2("Samples"),
            html.Div(
                [
                    _labelled(
                        "task",
                        dcc.Dropdown(
                            sample_queries.sample_tasks(engine), None, id="sample-task", placeholder="all tasks"
                        ),
                    ),
                    _labelled("model", dcc.Dropdown(models, None, id="sample-model", placeholder="all models"), "20em"),
                    _labelled(
                        "show",
                        dcc.RadioItems(
                            [
                                {"label": "all", "value": "all"},
                                {"label": "correct", "value": "correct"},
                                {"label": "wrong", "value": "wrong"},
                            ],
                            "all",
                            id="sample-verdict",
                            inline=True,
                        ),
                    ),
                ],
                style=_ROW,
            ),
            html.P(id="sample-count"),
            DataTable(
                id="samples",
                columns=[{"name": label, "id": key} for key, label in SAMPLE_COLUMNS.items()],
                page_size=20,
                sort_action="native",
                style_cell={
                    "whiteSpace": "pre-wrap",
                    "textAlign": "left",
                    "verticalAlign": "top",
                    "maxWidth": "28em",
                    "fontFamily": "monospace",
                    "fontSize": "12px",
                },
            ),
            dcc.Interval(id="refresh", interval=REFRESH_SECONDS * 1000),
        ],
        style={"fontFamily": "system-ui, sans-serif", "margin": "1.5em"},
    )


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
    "measure.value": lambda value: value is None or value in measures.MEMORY_MEASURES, "context.value": _number,
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
    return _values_problem(body.get("inputs"), spec["inputs"], "inputs") or _values_problem(
        body.get("state", []), spec["state"], "state"
    )


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


def serve(app: Dash, host: str, port: int, log_requests: bool = False) -> None:
    """Serve `app` with waitress, a production WSGI server (Flask's own server is for development and says so on
    start-up), until Ctrl+C. Waitress logs no requests; with `log_requests` each answered request is one line on
    stderr (address, method, path, status)."""
    from waitress import serve as serve_wsgi

    if log_requests:
        app.server.after_request(_logged)
    # A body far over Flask's MAX_CONTENT_LENGTH is refused by waitress from its Content-Length, before it is read
    # (waitress buffers a body whole before the app sees it); one just over still reaches Flask's 413 and headers.
    # _quiet: no logging.basicConfig of waitress's own, which would print every app warning a second time.
    serve_wsgi(
        app.server, host=host, port=port, threads=WSGI_THREADS, max_request_body_size=2 * MAX_REQUEST_BYTES, _quiet=True
    )


def _logged(response: Any) -> Any:
    print(f"{request.remote_addr} {request.method} {request.path} {response.status_code}", file=sys.stderr, flush=True)
    return response


def create_app(db_url: str, hosts: Collection[str] = LOOPBACK_NAMES) -> Dash:
    """The Dash app reading `db_url`, answering requests for `hosts` (see `allowed_hosts`); raises
    db.ResultsError when the database is missing or holds no runs."""
    engine = open_existing(db_url)
    queries.require_results(engine)
    app = Dash(__name__, title="loopeval", serve_locally=True)
    reading = functools.partial(_around_damage, engine, app.server.logger)
    for line in hide_damaged(engine):
        app.server.logger.warning(line)
    app.index_string = app.index_string.replace("</body>", f"<script>{INERT_LINKS}</script></body>")
    app.layout = reading(lambda: _layout(engine))
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.server.before_request(_guard(app, set(hosts)))
    app.server.register_error_handler(DependencyException, lambda _: ("not found", 404))  # a path Dash does not serve
    app.server.register_error_handler(ResultsError, _database_problem(app.server.logger))
    app.server.after_request(_secure)

    @app.callback(Output("task", "options"), Output("task", "value"), Input("set", "value"))
    @reading
    def _tasks(set_id: str | None) -> tuple[list[str], str | None]:
        names = queries.tasks(engine, set_id) if set_id else []
        return names, names[0] if names else None

    @app.callback(
        Output("models", "options"),
        Output("models", "value"),
        Output("loops", "options"),
        Output("loops", "value"),
        Output("measure", "options"),
        Output("measure", "value"),
        Input("set", "value"),
        State("measure", "value"),
    )
    @reading
    def _choices(
        set_id: str | None, measure: str | None
    ) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any], str]:
        return set_choices(engine, set_id, measure)

    for view in views.VIEWS:
        _draw_view(app, engine, view, reading)

    @app.callback(
        Output("samples", "data"),
        Output("sample-count", "children"),
        Input("sample-task", "value"),
        Input("sample-model", "value"),
        Input("sample-verdict", "value"),
        Input("refresh", "n_intervals"),
    )
    @reading
    def _samples(
        task: str | None, model: str | None, verdict: str, _tick: int | None
    ) -> tuple[list[dict[str, Any]], str]:
        correct = {"correct": True, "wrong": False}.get(verdict)
        rows = browse_samples(engine, task=task, model=model, correct=correct)
        note = spread_note(rows)
        rows = rows.assign(loops=rows["loops"].map(loops_label), doc_id=rows["doc_id"].map(_doc_number))
        rows = rows[list(SAMPLE_COLUMNS)].astype(object).where(rows[list(SAMPLE_COLUMNS)].notna(), None)
        return rows.to_dict("records"), f"{note}; texts over {SAMPLE_TEXT_CHARS} characters are cut"

    return app


def _around_damage(engine: Engine, logger: logging.Logger, read: Callable[..., Any]) -> Callable[..., Any]:
    """`read` (a callback, the layout), which on a failure is read again around the runs damaged since the
    server started (`db.stored.hide_damaged`), each named in one line of the log and on the page; a failure
    that no damaged value explains is raised as it is."""

    @functools.wraps(read)
    def around(*values: Any) -> Any:
        try:
            return read(*values)
        except Exception:
            skipped = hide_damaged(engine)
            if not skipped:
                raise
            for line in skipped:
                logger.warning(line)
            return read(*values)

    return around


def _database_problem(logger: logging.Logger) -> Callable[[ResultsError], tuple[str, int]]:
    """The answer to a request the database failed (damaged or gone while the server runs): 503 with the
    one-line error, which the log shows as that one line, not a stack trace."""

    def answer(exc: ResultsError) -> tuple[str, int]:
        logger.error(str(exc))
        return str(exc), 503

    return answer


def _draw_view(app: Dash, engine: Engine, view: views.View, reading: Callable[..., Any]) -> None:
    """The view's callback: its selectors and the refresh timer in, its answer (if any) and figures out."""
    outputs = ([Output("answer", "children")] if view.answer else []) + [
        Output(plot.id, "figure") for plot in view.plots
    ]

    def draw(*values: Any) -> Any:
        # the last value, the timer's tick, is left out; the colours are the database's models', as in the report
        picked = views.selection(dict(zip(view.inputs, values)), views.palette(engine))
        data = view.query(engine, picked)
        drawn = ([view.answer(data, picked)] if view.answer else []) + [plot.draw(data, picked) for plot in view.plots]
        return tuple(drawn) if len(drawn) > 1 else drawn[0]

    inputs = [*(Input(name, "value") for name in view.inputs), Input("refresh", "n_intervals")]
    app.callback(*outputs, *inputs)(reading(draw))
