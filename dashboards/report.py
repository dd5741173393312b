"""The static report: one self-contained HTML page that opens offline, built as a string (`build_report`; the
harness writes it to its file whole, `harness.report`).

plotly.js is embedded once (gzipped, unpacked by the page), every figure is embedded as JSON and
drawn by a few lines of inline script when a selector changes, so the file makes no network request
of any kind. Everything that
came from the database (model outputs above all, which are untrusted) is HTML-escaped, and the JSON
blobs escape `<`, `>` and `&` so no stored text can close the script element that holds them.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import gzip
import html
import json
import multiprocessing
import os
from datetime import datetime, UTC
from typing import Any
from collections.abc import Callable

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from sqlalchemy import Engine

from analysis.names import default_measure, loops_label, measure_label
from analysis.points import DEFAULT_CONTEXT_TOKENS, accuracy_points
from dashboards import figures, views
from dashboards.data import SAMPLE_COLUMNS, SAMPLE_TEXT_CHARS, browse_samples
from db import ResultsError, queries, sample_queries
from db.headline import SUITE
import measures

PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _script_json(value: Any) -> str:
    """JSON safe to place inside <script>: no stored string can end the element or open a comment."""
    return json.dumps(value).replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


@functools.cache
def packed_plotlyjs() -> str:
    """plotly.js gzipped and base64-encoded: 1.9 MB in the page instead of 4.8 MB; the page unpacks it."""
    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), 9, mtime=0)).decode("ascii")


def _figure_json(fig: go.Figure) -> Any:
    return json.loads(pio.to_json(fig, validate=False))


def _options(values: list[Any], labels: list[str] | None = None, selected: Any = None) -> str:
    labels = labels or [str(v) for v in values]
    return "".join(
        f'<option value="{html.escape(str(v))}"{" selected" if v == selected else ""}>{html.escape(label)}</option>'
        for v, label in zip(values, labels)
    )


def _runs_table(engine: Engine) -> str:
    """Every run with status, samples, suite-average accuracy and memory peaks (`views.runs_table`), as escaped text."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in views.RUN_COLUMNS)
    rows = [
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in views.runs_table(engine)
    ]
    return f"<table class='runs'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


SAMPLE_PAGE_ROWS = 20  # the browser draws one page of rows at a time, so the page stays short
_NUMBERS = {"score": float, "prompt_tokens": int, "generated_tokens": int}  # may be missing: null, never NaN


def _sample_cell(column: str, value: Any) -> Any:
    """One cell of the sample browser as JSON: loops as the figures label them, a missing number as null."""
    if column == "loops":
        return loops_label(value)
    if column in _NUMBERS:
        return None if pd.isna(value) else _NUMBERS[column](value)
    return value


def _sample_rows(engine: Engine) -> list[list[Any]]:
    """The sample browser's rows (`data.browse_samples`), as JSON lists in `data.SAMPLE_COLUMNS` order.

    The page's script puts each cell in with textContent, so stored text never becomes markup.
    """
    rows = browse_samples(engine).to_dict("records")
    return [[_sample_cell(column, row[column]) for column in SAMPLE_COLUMNS] for row in rows]


def _shared_template(blobs: dict[str, Any]) -> Any:
    """Take the layout template out of every figure (about 7 KB each, the same in all): the page puts it back once."""
    template = next((blob["layout"].get("template") for blob in blobs.values() if isinstance(blob, dict)), None)
    for blob in blobs.values():
        if isinstance(blob, dict) and blob["layout"].get("template") == template:
            blob["layout"].pop("template", None)
    return template


def report_figures(
    engine: Engine, context_tokens: int = DEFAULT_CONTEXT_TOKENS, processes: int | None = None
) -> dict[str, Any]:
    """Every figure (Plotly JSON) and answer sentence of every view (`views.VIEWS`), for every choice of its
    selectors, keyed as the page's script asks for them (`View.key`). Views fed by the same query (accuracy against
    memory and against compute) share each case's data.

    Plotly builds a few hundred figures for a sweep (the default job's report's time: docs/benchmarks.md), so the
    cases are shared out among `processes` forked processes (default: the cores this process may use); the figures
    are the same, and come back in the same order, as drawn in one process."""
    cases: dict[tuple[Any, views.Selection], list[views.View]] = {}
    colors = views.palette(engine)
    for view in views.VIEWS:
        for case in view.cases(engine):
            cases.setdefault(
                (view.query, dataclasses.replace(case, context_tokens=context_tokens, colors=colors)), []
            ).append(view)
    jobs = list(cases.items())
    processes = min(len(jobs), processes or len(os.sched_getaffinity(0)))
    parts = _in_processes(lambda k: [_draw_case(engine, *job) for job in jobs[k::processes]], processes, engine)
    drawn = [parts[k % processes][k // processes] for k in range(len(jobs))]  # back in the order of `jobs`
    return {key: blob for blobs in drawn for key, blob in blobs.items()}


def _draw_case(engine: Engine, job: tuple[Any, views.Selection], shown_in: list[views.View]) -> dict[str, Any]:
    """One case's query, then every figure and answer drawn from its data by the views it feeds."""
    query, case = job
    data = query(engine, case)
    blobs: dict[str, Any] = {}
    for view in shown_in:
        for picked in view.variants(case):
            if view.answer is not None:
                blobs[view.key("answer", picked)] = view.answer(data, picked)
            for plot in view.plots:
                blobs[view.key(plot.key, picked)] = _figure_json(plot.draw(data, picked))
    return blobs


def _in_processes(part: Callable[[int], Any], processes: int, engine: Engine) -> list[Any]:
    """[part(0), ..., part(processes - 1)], part 0 drawn here and each other in a forked process, sent back pickled.

    No pooled database connection crosses the fork (`engine.dispose()` first): each process opens its own. An error
    in a forked process is raised here, as if the part had been drawn here."""
    if processes <= 1:
        return [part(0)]
    context = multiprocessing.get_context("fork")
    engine.dispose()
    forked = []
    for k in range(1, processes):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=_send, args=(writer, part, k, engine), daemon=True, name=f"loopeval report {k}"
        )
        process.start()
        writer.close()
        forked.append((reader, process))
    try:
        results = [part(0)]
        for reader, process in forked:
            try:
                failed, value = reader.recv()
            except EOFError:  # the process died before it could say why (killed)
                failed, value = True, None
            process.join()
            if failed:
                raise value or ResultsError(
                    f"a process drawing the report's figures ended with exit code {process.exitcode}"
                )
            results.append(value)
        return results
    finally:  # after an error here, or in one of them, the others are not waited for
        for _, process in forked:
            if process.is_alive():
                process.kill()
                process.join()


def _send(writer: Any, part: Callable[[int], Any], k: int, engine: Engine) -> None:
    """In a forked process: part k, or the error it raised, sent back through `writer`; then its own connections closed."""
    try:
        writer.send((False, part(k)))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to be raised in the parent
        writer.send((True, exc))
    finally:
        engine.dispose()


def _selectors(engine: Engine, measure: str, context_tokens: int) -> dict[str, str]:
    """Each selector's <label> and <select>, by element id: those `views.SELECTORS` fills, then the accuracy
    view's own (every set's tasks, every memory measure with `measure` selected)."""
    controls = {}
    for name, selector in views.SELECTORS.items():
        choices = selector.choices(engine)
        selected = selector.default(engine) if selector.default else None  # else the browser shows the first
        controls[name] = (selector.label, _options([v for v, _ in choices], [label for _, label in choices], selected))
    tasks = sorted(
        {task for set_id in queries.eval_sets(engine)["set_id"] for task in queries.tasks(engine, set_id)},
        key=lambda task: (task != SUITE, task),
    )
    controls["task"] = ("task", _options(tasks))
    labels = [measure_label(m, context_tokens) for m in measures.MEMORY_MEASURES]
    controls["measure"] = ("memory measure", _options(list(measures.MEMORY_MEASURES), labels, selected=measure))
    return {
        name: f'<label>{html.escape(label)} <select id="{name}">{options}</select></label>'
        for name, (label, options) in controls.items()
    }


def empty_plots(blobs: dict[str, Any]) -> dict[str, str]:
    """The plots (element id) with no data in any drawing, each with its empty figure's note (what fills it): the page
    leaves them out and prints the note as one line, instead of a blank figure (`figures._empty` marks them)."""
    left_out = {}
    for view in views.VIEWS:
        for plot in view.plots:
            drawn = [blob for key, blob in blobs.items() if key == plot.key or key.startswith(plot.key + "|")]
            notes = [(blob["layout"].get("meta") or {}).get("empty") for blob in drawn]
            if drawn and all(notes):
                left_out[plot.id] = str(notes[0])
    return left_out


def _sections(selectors: dict[str, str], left_out: dict[str, str]) -> str:
    """One <section> per view: its title, note, selectors and a plot element per figure; a figure with no data
    (`empty_plots`) is one line saying how to fill it, and a view with none to draw shows no selectors."""
    sections = []
    for view, shown in views.sections():
        note = f'<p class="note">{html.escape(view.note)}</p>\n' if view.note else ""
        drawn = [plot for plot in view.plots if plot.id not in left_out]
        controls = "".join(selectors[name] + "\n" for name in shown if name in view.keyed) if drawn else ""
        plots = "".join(
            f'<div id="{plot.id}" class="plot" style="height: {plot.height}px"></div>\n'
            if plot.id not in left_out
            else f'<p class="note empty" id="{plot.id}-empty">No data for this figure yet: '
            f"{html.escape(left_out[plot.id])}.</p>\n"
            for plot in view.plots
        )
        sections.append(f"<section><h2>{html.escape(view.title)}</h2>\n{note}{controls}{plots}</section>\n")
    return "".join(sections)


def _page_views(left_out: dict[str, str]) -> list[dict[str, Any]]:
    """What the page's script needs of each view: the selectors that key its figures, its plots (those drawn), its
    answer; a view with no plot drawn reads no selector (the page shows none: `_sections`)."""
    page = []
    for view in views.VIEWS:
        plots = [[plot.id, plot.key] for plot in view.plots if plot.id not in left_out]
        page.append({"inputs": list(view.keyed) if plots else [], "plots": plots, "answer": view.answer is not None})
    return page


def build_report(engine: Engine, context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> str:
    """The whole report as one HTML string (plotly.js inlined, no external reference)."""
    queries.require_results(engine)
    blobs = report_figures(engine, context_tokens)
    left_out = empty_plots(blobs)
    template = _shared_template(blobs)
    sets = queries.eval_sets(engine)  # the default first: the set of the newest scored run
    measure = default_measure(accuracy_points(engine, None, SUITE, context_tokens))  # the first any point has
    opening = views.Selection(set_id=sets["set_id"].iloc[0], measure=measure) if len(sets) else None
    answer = blobs.get(views.ACCURACY.key("answer", opening), "") if opening else "No evaluated runs yet."
    samples = _sample_rows(engine)
    sample_tasks = sorted({row[3] for row in samples})
    sample_models = sorted({row[1] for row in samples})
    total = sample_queries.count_samples(engine)
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return _TEMPLATE.format(
        csp=REPORT_CSP,
        plotlyjs=packed_plotlyjs(),
        generated=html.escape(generated),
        answer=html.escape(answer),
        view_sections=_sections(_selectors(engine, measure, context_tokens), left_out),
        runs_table=_runs_table(engine),
        sample_task_options=_options(["*", *sample_tasks], ["all tasks", *sample_tasks]),
        sample_model_options=_options(["*", *sample_models], ["all models", *sample_models]),
        sample_head="".join(f"<th>{html.escape(c)}</th>" for c in SAMPLE_COLUMNS.values()),
        samples_note=html.escape(
            f"{len(samples)} of {total} samples, spread evenly over every run, task and verdict "
            f"(the served app filters them in the database)"
            if len(samples) < total
            else f"all {total} samples"
        )
        + html.escape(f"; texts over {SAMPLE_TEXT_CHARS} characters are cut"),
        decimal_note=html.escape(figures.DECIMAL_NOTE),
        figures_json=_script_json(blobs),
        template_json=_script_json(template),
        views_json=_script_json(_page_views(left_out)),
        samples_json=_script_json(
            {"columns": list(SAMPLE_COLUMNS.values()), "rows": samples, "pageRows": SAMPLE_PAGE_ROWS}
        ),
        config_json=_script_json(PLOT_CONFIG),
    )


# The report runs offline: nothing may be fetched, framed, submitted or used as a base for links.
REPORT_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
    "font-src data:; form-action 'none'; base-uri 'none'"
)

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>loopeval report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
h1 {{ margin-bottom: 0.2em; }} .note {{ color: #555; }}
.answer {{ font-size: 1.1em; background: #f2f6fc; border-left: 4px solid #3a6fc4; padding: 0.7em 1em; max-width: 75em; }}
table {{ border-collapse: collapse; font-size: 13px; }} th, td {{ border: 1px solid #ddd; padding: 3px 6px; vertical-align: top; }}
th {{ background: #f3f3f3; }} pre {{ margin: 0; white-space: pre-wrap; max-width: 32em; max-height: 12em; overflow: auto; }}
label {{ margin-right: 1em; }} section {{ margin-top: 2em; }}
</style>
<script id="plotlyjs" type="application/gzip;base64">{plotlyjs}</script>
</head><body>
<h1>loopeval report</h1>
<p class="note">Generated {generated}. {decimal_note}. Unavailable measures are named, never drawn as zero.</p>
<p id="answer" class="answer">{answer}</p>
{view_sections}<section><h2>Runs</h2>{runs_table}</section>
<section><h2>Samples</h2>
<p class="note">{samples_note}. Model outputs are shown as plain text.</p>
<label>task <select id="sample-task">{sample_task_options}</select></label>
<label>model <select id="sample-model">{sample_model_options}</select></label>
<label>show <select id="sample-verdict"><option value="*">all</option><option value="correct">correct</option><option value="wrong">wrong</option></select></label>
<button id="sample-previous">previous</button> <span id="sample-page"></span> <button id="sample-next">next</button>
<table id="samples"><thead><tr>{sample_head}</tr></thead><tbody></tbody></table>
</section>
<script id="figures" type="application/json">{figures_json}</script>
<script id="template" type="application/json">{template_json}</script>
<script id="views" type="application/json">{views_json}</script>
<script id="sample-data" type="application/json">{samples_json}</script>
<script id="plot-config" type="application/json">{config_json}</script>
<script>
// No link in this page may leave it: stored strings are escaped, and any anchor a library draws is inert
// (Plotly's SVG anchors carry xlink:href, not href, so every <a> is matched).
document.addEventListener("click", (event) => {{ if (event.target.closest("a")) event.preventDefault(); }}, true);
const json = (id) => JSON.parse(document.getElementById(id).textContent);
// plotly.js comes gzipped (a third of its 4.8 MB): unpack it in the browser and run it as an inline script.
async function loadPlotly() {{
  const packed = Uint8Array.from(atob(document.getElementById("plotlyjs").textContent), (c) => c.charCodeAt(0));
  const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
  const script = document.createElement("script");
  script.textContent = await new Response(stream).text();
  document.head.append(script);
}}
const FIGURES = json("figures"), TEMPLATE = json("template"), CONFIG = json("plot-config"), SAMPLES = json("sample-data");
const VIEWS = json("views");
const value = (id) => document.getElementById(id).value;
function draw(div, key) {{
  const fig = FIGURES[key] || {{data: [], layout: {{title: {{text: "no data for this selection"}}}}}};
  Plotly.react(div, fig.data, {{...fig.layout, template: TEMPLATE}}, CONFIG);
}}
// A view's figures are keyed by its selectors' values ("acc|<set>|<task>|<measure>"), as views.View.key writes them.
function drawView(view) {{
  const picked = view.inputs.map((id) => "|" + value(id)).join("");
  if (view.answer) document.getElementById("answer").textContent = FIGURES["answer" + picked] || "No runs for this selection.";
  for (const [div, key] of view.plots) draw(div, key + picked);
}}
// The sample browser draws one page of the filtered rows; cells are set as text, never as markup.
const column = (name) => SAMPLES.columns.indexOf(name);
const TEXT_COLUMNS = new Set(["prompt", "output", "gold"].map(column));
let samplePage = 0;
function drawSamples() {{
  const wanted = [["sample-task", column("task")], ["sample-model", column("model")], ["sample-verdict", column("verdict")]]
    .map(([id, index]) => [value(id), index]);
  const rows = SAMPLES.rows.filter((row) => wanted.every(([want, index]) => want === "*" || row[index] === want));
  const pages = Math.max(1, Math.ceil(rows.length / SAMPLES.pageRows));
  samplePage = Math.min(Math.max(samplePage, 0), pages - 1);
  const first = samplePage * SAMPLES.pageRows, shown = rows.slice(first, first + SAMPLES.pageRows);
  const body = document.querySelector("#samples tbody");
  body.replaceChildren(...shown.map((row) => {{
    const tr = document.createElement("tr");
    row.forEach((cell, index) => {{
      const td = tr.insertCell(), text = cell === null ? "" : String(cell);
      if (TEXT_COLUMNS.has(index)) {{ const pre = document.createElement("pre"); pre.textContent = text; td.append(pre); }}
      else td.textContent = text;
    }});
    return tr;
  }}));
  document.getElementById("sample-page").textContent =
    rows.length ? `rows ${{first + 1}}-${{first + shown.length}} of ${{rows.length}} (page ${{samplePage + 1}} of ${{pages}})` : "no samples match";
}}
for (const view of VIEWS) for (const id of view.inputs) document.getElementById(id).addEventListener("change", () => drawView(view));
for (const id of ["sample-task", "sample-model", "sample-verdict"])
  document.getElementById(id).addEventListener("change", () => {{ samplePage = 0; drawSamples(); }});
document.getElementById("sample-previous").addEventListener("click", () => {{ samplePage -= 1; drawSamples(); }});
document.getElementById("sample-next").addEventListener("click", () => {{ samplePage += 1; drawSamples(); }});
drawSamples();
loadPlotly().then(() => VIEWS.forEach(drawView));
</script>
</body></html>
"""
