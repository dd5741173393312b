"""The static report: one self-contained HTML file that opens offline.

plotly.js is embedded once, every figure is embedded as JSON and drawn by a few lines of inline
script when a selector changes, so the file makes no network request of any kind. Everything that
came from the database (model outputs above all, which are untrusted) is HTML-escaped, and the JSON
blobs escape `<`, `>` and `&` so no stored text can close the script element that holds them.
"""

from __future__ import annotations

import html
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from sqlalchemy import Engine

from dashboards import figures
from dashboards.data import DEFAULT_CONTEXT_TOKENS, accuracy_points
from db import ResultsError, measures, queries
from db.session import open_existing

MAX_REPORT_SAMPLES = 2000  # newest first; the served app browses all of them
MAX_SERIES_POINTS = 1500  # per run: longer series are reduced to bucket maxima (peaks survive)
PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _script_json(value: Any) -> str:
    """JSON safe to place inside <script>: no stored string can end the element or open a comment."""
    return json.dumps(value).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _figure_json(fig: go.Figure) -> Any:
    return json.loads(pio.to_json(fig, validate=False))


def _reduce_series(series: pd.DataFrame, limit: int = MAX_SERIES_POINTS) -> pd.DataFrame:
    """At most `limit` rows: each bucket of consecutive ticks keeps its maximum per measure, so peaks stay visible."""
    if len(series) <= limit:
        return series
    bucket = pd.Series(range(len(series)), index=series.index) * limit // len(series)
    aggregations = {column: ("max" if column in measures.SERIES_MEASURES else "first") for column in series.columns}
    return series.groupby(bucket.to_numpy()).agg(aggregations)


def _options(values: list[Any], labels: list[str] | None = None, selected: Any = None) -> str:
    labels = labels or [str(v) for v in values]
    return "".join(f'<option value="{html.escape(str(v))}"{" selected" if v == selected else ""}>'
                   f'{html.escape(label)}</option>' for v, label in zip(values, labels))


def _runs_table(engine: Engine) -> str:
    """Every run with status, samples, suite-average accuracy and memory peaks (escaped text only)."""
    table = queries.runs(engine, kind=None)
    peaks = queries.memory_peaks(engine)
    table = table.merge(peaks, on="run_id", how="left")
    averages = queries.suite_means(queries.metrics(engine))
    table = table.merge(averages[["run_id", "metric", "value"]], on="run_id", how="left")
    columns = ["nvml_process_peak", "torch_allocated_peak", "weights_bytes", "kv_bytes_peak", "rss_peak"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in
                   ["run", "sweep", "kind", "model", "loops", "suite", "set", "status", "samples", "pass@1 (suite mean)", *columns])
    rows = []
    for row in table.to_dict("records"):
        accuracy = "" if pd.isna(row.get("value")) else f"{row['value']:.3f} ({row['metric']})"
        cells = [row["run_id"], row["sweep_id"], row["kind"], row["model"],
                 "" if pd.isna(row["loops"]) else int(row["loops"]), row["suite"],
                 "" if pd.isna(row["set_id"]) else row["set_id"], row["status"],
                 row["n_samples"], accuracy, *(measures.byte_text(row.get(c)) for c in columns)]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f"<table class='runs'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _samples_table(engine: Engine) -> tuple[str, list[str], list[str], int, int]:
    """The sample browser's rows; every cell is escaped text, filters read only data attributes."""
    frame = queries.samples(engine, limit=MAX_REPORT_SAMPLES)
    rows = []
    for row in frame.to_dict("records"):
        verdict = "unscored" if pd.isna(row["score"]) else ("correct" if row["score"] >= 1.0 else "wrong")
        cells = [row["run_id"], row["model"], row["loops"], row["task"], row["doc_id"], row["sample_index"]]
        texts = [row["prompt"], row["output"], row["gold"]]
        numbers = ["" if pd.isna(row["score"]) else f"{row['score']:g}",
                   *("" if pd.isna(row[c]) else int(row[c]) for c in ("prompt_tokens", "generated_tokens"))]
        rows.append(
            f'<tr data-task="{html.escape(str(row["task"]))}" data-model="{html.escape(str(row["model"]))}" '
            f'data-verdict="{verdict}">'
            + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
            + "".join(f"<td><pre>{html.escape('' if t is None else str(t))}</pre></td>" for t in texts)
            + "".join(f"<td>{html.escape(str(c))}</td>" for c in numbers)
            + f"<td>{verdict}</td></tr>"
        )
    head = "".join(f"<th>{c}</th>" for c in ["run", "model", "loops", "task", "doc", "sample", "prompt", "output",
                                               "gold", "score", "prompt tokens", "generated tokens", "verdict"])
    table = f"<table id='samples'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    return (table, sorted(frame["task"].unique().tolist()), sorted(frame["model"].unique().tolist()),
            len(frame), queries.count_samples(engine))


def report_figures(engine: Engine, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> dict[str, Any]:
    """Every figure the report can show, as Plotly JSON keyed by what the selectors pick."""
    blobs: dict[str, Any] = {}
    for set_id in queries.eval_sets(engine)["set_id"]:
        for task in queries.tasks(engine, set_id):
            points = accuracy_points(engine, set_id, task, context_tokens)
            for measure in figures.MEMORY_MEASURES:
                label = figures.measure_label(measure, context_tokens)
                blobs[f"acc|{set_id}|{task}|{measure}"] = _figure_json(
                    figures.accuracy_vs_memory(points, measure, task, label))
                blobs[f"loops|{set_id}|{task}|{measure}"] = _figure_json(
                    figures.accuracy_vs_loops(points, measure, task, label))
    for row in queries.runs(engine).itertuples():
        series = _reduce_series(queries.memory_series(engine, row.run_id))
        title = f"Memory over run {row.run_id}: {row.model} r={row.loops} ({row.suite})"
        blobs[f"run|{row.run_id}"] = _figure_json(figures.memory_over_run(series, measures.SERIES_MEASURES, title))
    blobs["profile"] = _figure_json(figures.memory_vs_context(queries.profile_points(engine), measures.PROFILE_MEASURES))
    return blobs


def build_report(engine: Engine, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> str:
    """The whole report as one HTML string (plotly.js inlined, no external reference)."""
    queries.require_results(engine)
    blobs = report_figures(engine, context_tokens)
    sets = queries.eval_sets(engine)  # newest first: the latest sweep's set is the default
    task_names = sorted({key.split("|")[2] for key in blobs if key.startswith("acc|")}, key=lambda t: t != "all")
    eval_runs = queries.runs(engine)
    run_labels = [f"run {r.run_id}: {r.model} r={r.loops} ({r.suite})" for r in eval_runs.itertuples()]
    samples_html, sample_tasks, sample_models, shown, total = _samples_table(engine)
    measure_labels = [figures.measure_label(m, context_tokens) for m in figures.MEMORY_MEASURES]
    first_points = accuracy_points(engine, None, "all", context_tokens)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return _TEMPLATE.format(
        csp=REPORT_CSP,
        plotlyjs=get_plotlyjs(),
        generated=html.escape(generated),
        runs_table=_runs_table(engine),
        set_options=_options(sets["set_id"].tolist(), [f"{s.set_label} ({s.runs} runs)" for s in sets.itertuples()]),
        task_options=_options(task_names),
        measure_options=_options(list(figures.MEMORY_MEASURES), measure_labels,
                                 selected=figures.default_measure(first_points)),
        run_options=_options(eval_runs["run_id"].tolist(), run_labels),
        sample_task_options=_options(["*", *sample_tasks], ["all tasks", *sample_tasks]),
        sample_model_options=_options(["*", *sample_models], ["all models", *sample_models]),
        samples_table=samples_html,
        samples_note=html.escape(f"showing the newest {shown} of {total} samples" if shown < total
                                 else f"{total} samples"),
        decimal_note=html.escape(figures.DECIMAL_NOTE),
        figures_json=_script_json(blobs),
        config_json=_script_json(PLOT_CONFIG),
    )


def write_report(db_url: str, out: Path) -> Path:
    """Write the static report of the database at `db_url` to `out`; return its path.

    Raises `db.ResultsError` (one line, exit 2 in the CLI) when the database is missing or holds no runs;
    a missing SQLite file is not created.
    """
    engine = open_existing(db_url)
    try:
        text = build_report(engine)
    finally:
        engine.dispose()
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ResultsError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return out


# The report runs offline: nothing may be fetched, framed, submitted or used as a base for links.
REPORT_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
              "font-src data:; form-action 'none'; base-uri 'none'")

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>loopeval report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} .note {{ color: #555; }}
table {{ border-collapse: collapse; font-size: 13px; }} th, td {{ border: 1px solid #ddd; padding: 3px 6px; vertical-align: top; }}
th {{ background: #f3f3f3; }} pre {{ margin: 0; white-space: pre-wrap; max-width: 32em; max-height: 12em; overflow: auto; }}
label {{ margin-right: 1em; }} .plot {{ height: 520px; }} section {{ margin-top: 2em; }}
</style>
<script>{plotlyjs}</script>
</head><body>
<h1>loopeval report</h1>
<p class="note">Generated {generated}. {decimal_note}. Unavailable measures are named, never drawn as zero.</p>
<section><h2>Accuracy per gigabyte</h2>
<label>evaluation set <select id="set">{set_options}</select></label>
<label>task <select id="task">{task_options}</select></label>
<label>memory measure <select id="measure">{measure_options}</select></label>
<div id="accuracy-memory" class="plot"></div>
<div id="accuracy-loops" class="plot"></div>
</section>
<section><h2>Memory over a run</h2>
<label>run <select id="run">{run_options}</select></label>
<div id="memory-run" class="plot"></div>
</section>
<section><h2>Memory against context length</h2>
<div id="memory-context" class="plot"></div>
</section>
<section><h2>Runs</h2>{runs_table}</section>
<section><h2>Samples</h2>
<p class="note">{samples_note}. Model outputs are shown as plain text.</p>
<label>task <select id="sample-task">{sample_task_options}</select></label>
<label>model <select id="sample-model">{sample_model_options}</select></label>
<label>show <select id="sample-verdict"><option value="*">all</option><option value="correct">correct</option><option value="wrong">wrong</option></select></label>
{samples_table}
</section>
<script id="figures" type="application/json">{figures_json}</script>
<script id="plot-config" type="application/json">{config_json}</script>
<script>
// No link in this page may leave it: stored strings are escaped, and any anchor a library draws is inert
// (Plotly's SVG anchors carry xlink:href, not href, so every <a> is matched).
document.addEventListener("click", (event) => {{ if (event.target.closest("a")) event.preventDefault(); }}, true);
const FIGURES = JSON.parse(document.getElementById("figures").textContent);
const CONFIG = JSON.parse(document.getElementById("plot-config").textContent);
const value = (id) => document.getElementById(id).value;
function draw(div, key) {{
  const fig = FIGURES[key] || {{data: [], layout: {{title: {{text: "no data for this selection"}}}}}};
  Plotly.react(div, fig.data, fig.layout, CONFIG);
}}
function drawAccuracy() {{
  const key = [value("set"), value("task"), value("measure")].join("|");
  draw("accuracy-memory", "acc|" + key);
  draw("accuracy-loops", "loops|" + key);
}}
function filterSamples() {{
  const task = value("sample-task"), model = value("sample-model"), verdict = value("sample-verdict");
  for (const row of document.querySelectorAll("#samples tbody tr")) {{
    row.hidden = !((task === "*" || row.dataset.task === task) && (model === "*" || row.dataset.model === model)
                   && (verdict === "*" || row.dataset.verdict === verdict));
  }}
}}
for (const id of ["set", "task", "measure"]) document.getElementById(id).addEventListener("change", drawAccuracy);
document.getElementById("run").addEventListener("change", () => draw("memory-run", "run|" + value("run")));
for (const id of ["sample-task", "sample-model", "sample-verdict"]) document.getElementById(id).addEventListener("change", filterSamples);
drawAccuracy();
if (value("run")) draw("memory-run", "run|" + value("run"));
draw("memory-context", "profile");
</script>
</body></html>
"""
