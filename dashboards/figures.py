"""The dashboard figures: pure functions from query DataFrames (db/queries.py) to Plotly figures.

The static report and the served app draw the same figures from the same functions. Bytes are
scaled to one decimal unit per axis (B, KB, MB, GB; 1 GB = 1e9 bytes, as the MELT paper counts),
and a NULL measure is never drawn as zero: the figure names what was unavailable instead.

Stored strings (model specs, task and metric names) come from users and plugins. Plotly renders a
subset of HTML in legends, titles and hovers, `<a href>` included, so every stored string is
escaped (`plain`) before it reaches a figure: it shows as the text it is, never as markup.

The figures of a set's points against memory and loops are here, with what every figure shares (escaping, colours,
notes); those against compute, energy and the memory levers are in `dashboards.cost_figures`, those of loops and
memory traces in `dashboards.trace_figures`.
What a point is, how it is named and ranked, is `analysis/`'s. The figures the report draws by the hundred are given
to `go.Figure` whole, their traces and layout as dicts: Plotly validates at every `add_trace` and `update_*` call,
and a figure built up call by call (or by Plotly Express) took several times as long as the same figure given
whole (docs/benchmarks.md).
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from analysis.names import (
    byte_unit,
    loops_label,
    measure_label,
    point_label,
    point_name,
    series_name,
)
from analysis.ranking import pareto_mask
from db.sets import id_ranges
from measures import GB

DECIMAL_NOTE = "GB are decimal (1 GB = 1e9 bytes)"
# Models take these colours in turn (`model_colors`); a figure's other lines (a run's measures) take the second set,
# so no colour stands for a model in one figure and for something else in the next.
_PALETTE = (*px.colors.qualitative.Plotly, *px.colors.qualitative.Dark24)
_MEASURE_PALETTE = px.colors.qualitative.Dark2
# One shape per loop count r, r = 1 first (`loops_symbol`).
_SYMBOLS = (
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "pentagon",
    "star",
    "hexagon",
    "triangle-down",
    "star-diamond",
    "hourglass",
    "triangle-left",
    "bowtie",
    "triangle-right",
    "octagon",
    "hexagram",
    "star-square",
)


_STORED_TEXT = ("model", "task", "metric", "suite", "phase", "group", "config_label", "exit_criterion")


def plain(value: object) -> str:
    """A stored string as Plotly text: markup characters escaped, so `<a href=...>` shows as written.

    Quotes become numeric references: Plotly decodes `&#34;` but knows no `&quot;`, which it would
    show as those six characters.
    """
    return html.escape(str(value)).replace("&quot;", "&#34;")


def _plain_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy whose stored-string columns are escaped for Plotly (see `plain`)."""
    present = [c for c in _STORED_TEXT if c in frame]
    if not present or frame.empty:
        return frame
    return frame.assign(**{c: frame[c].map(plain, na_action="ignore") for c in present})


def unit_title(label: str, unit: str, scale: float) -> str:
    """Axis title naming the decimal unit, e.g. 'KV cache peak (decimal GB, 1e9 bytes)'."""
    if unit == "B":
        return f"{label} (bytes)"
    return f"{label} (decimal {unit}, {scale:.0e} bytes)".replace("e+0", "e")


def model_colors(models: Iterable[str], first: Iterable[str] = ()) -> dict[str, str]:
    """One colour per model for a whole page: the `first` models (the page's opening set), then the others, each
    sorted by name, onto the palette in turn, so the models the page opens on get its first, strongest colours. Every
    figure of the page takes its colours from this one map, so a figure showing a few models keeps each one's colour."""
    first = sorted(set(first))
    order = first + sorted(set(models) - set(first))
    return {model: _PALETTE[index % len(_PALETTE)] for index, model in enumerate(order)}


def _colors_of(models: Iterable[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    """The page's map (`model_colors`; None: this figure's models alone) keyed by the escaped names the figure draws
    (`plain`); a model the map lacks (stored since the page was drawn) takes the next colour in turn."""
    known = dict(colors) if colors is not None else model_colors(models)
    for model in sorted(set(models) - known.keys()):
        known[model] = _PALETTE[len(known) % len(_PALETTE)]
    return {plain(model): color for model, color in known.items()}


def loops_symbol(loops: Any) -> str:
    """A loop count's marker, the same in every figure: r = 1 a circle, 2 a square, 3 a diamond, 4 a triangle, ...
    (an unknown count an open circle). Kept apart so a marker per configuration (exit threshold) can refine it."""
    return "circle-open" if pd.isna(loops) else _SYMBOLS[(int(loops) - 1) % len(_SYMBOLS)]


MESSAGE_WIDTH = 90  # characters per line of a note: a long list of runs wraps instead of running off both edges


def _note(text: str) -> dict[str, Any]:
    """A note inside the plot area (empty data, unavailable measures), wrapped to fit it: a layout annotation."""
    lines = textwrap.wrap(text, MESSAGE_WIDTH, break_long_words=False, break_on_hyphens=False)
    return {
        "text": "<br>".join(lines),
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "font": {"size": 13, "color": "#555"},
    }


# Pixels from the bottom of the plot area down to a footnote: below the tick labels (log ticks included) and the axis
# title, whatever the figure's height (a fraction of the plot area's height lands on the axis title in a short figure).
FOOTNOTE_GAP = 72
_LINE_PX = 18  # one line of a 13 px note


def _footnote(text: str) -> tuple[dict[str, Any], dict[str, int]]:
    """A note under the x axis title (`_note`, anchored by its top edge `FOOTNOTE_GAP` pixels below the plot area)
    and the bottom margin that holds it."""
    note = _note(text) | {"y": 0.0, "yanchor": "top", "yshift": -FOOTNOTE_GAP}
    lines = note["text"].count("<br>") + 1
    return note, {"b": FOOTNOTE_GAP + _LINE_PX * lines + 12}


def _add_footnote(fig: go.Figure, text: str) -> go.Figure:
    """Write a footnote (`_footnote`) under a figure Plotly Express drew."""
    note, margin = _footnote(text)
    return fig.add_annotation(note).update_layout(margin=margin)


def _empty(title: str, text: str) -> go.Figure:
    """A figure with no data: its note says why and how to fill it; `layout.meta.empty` holds the note unwrapped,
    so the report can leave the figure out and print the note as one line instead (`dashboards.report`)."""
    return go.Figure(
        layout={
            "title": {"text": title},
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "annotations": [_note(text)],
            "meta": {"empty": text},
        }
    )


def _with_set(title: str, points: pd.DataFrame) -> str:
    """The title with the evaluation set its points belong to (`db.sets`; one set per figure) as a subtitle."""
    if "set_label" not in points or points.empty:
        return title
    return f"{title}<br><sup>{plain(points['set_label'].iloc[0])}</sup>"


def _point_names(frame: pd.DataFrame) -> str:
    return ", ".join(point_name(row) for row in frame.itertuples())


def _measured(points: pd.DataFrame, measure: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points with the measure, points without it): the second are named, never drawn as zero."""
    if measure not in points:
        return points.iloc[0:0], points
    return points[points[measure].notna()].copy(), points[points[measure].isna()]


def accuracy_vs_memory(
    points: pd.DataFrame,
    measure: str,
    task: str = "all",
    label: str | None = None,
    colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """Accuracy against memory, one marker per point (configuration), with error bars and the Pareto frontier.

    `points` are `analysis.points.accuracy_points` rows (one evaluation set, named in the title) with the
    `measure` column present. Points whose measure is
    NULL are named, not plotted.
    Colour is the model, the marker's shape its loop count and a black mark over it its configuration (an exit
    threshold, a KV dtype or policy: `config_marks`), each with a legend entry, so no text label sits beside a point
    to collide with its neighbours. Every point is drawn at its measured memory: points that coincide (a model's exit
    thresholds scoring alike) keep their place, each hover names every point there and a small label counts them.
    The memory axis starts at zero: a few MB of noise on a 900 MB process must not look like a difference.
    """
    label = label or measure_label(measure)
    title = _with_set(f"Accuracy against memory: {plain(task)}, {label}", points)
    palette = _colors_of(points["model"], colors)
    points = _plain_frame(points)
    marks = config_marks(points)  # of the escaped labels: a stored override is drawn as text, as every name is
    if points.empty:
        return _empty(title, "no evaluated runs with this task yet")
    shown, missing = _measured(points, measure)
    if shown.empty:
        return _empty(title, f"{label}: unavailable for every run ({_point_names(missing)})")

    unit, scale = byte_unit(shown[measure])
    shown["memory"] = shown[measure] / scale
    shown["stderr"] = shown["stderr"].astype(float)
    shown["spread"] = [f" ± {e:.3f}" if np.isfinite(e) else "" for e in shown["stderr"]]
    shown["r"] = [point_label(row) for row in shown.itertuples()]
    shown["configuration"] = [configuration(row) for row in shown.itertuples()]
    shown["runs"] = _runs_text(shown)
    shown["held"] = [f"{m:.4g}" for m in shown["memory"]]
    shown["here"] = _also_here(shown)
    frontier = pareto_mask(shown["memory"], shown["accuracy"])
    symbols = {r: loops_symbol(r) for r in sorted(shown["loops"].unique())}
    traces = []
    for index, (model, rows) in enumerate(shown.groupby("model", sort=True)):
        ringed = frontier[shown.index.get_indexer(rows.index)]
        color, group = palette[model], f"model {index}"
        # The legend draws a trace's first marker; a per-point shape and ring would stand for the model there,
        # so the model's entry is a plain circle of its colour, toggling its points with it (`togglegroup`).
        traces.append(
            _legend_key(model, group, "model" if index == 0 else None, {"color": color, "size": 10, "symbol": "circle"})
        )
        traces.append(
            {
                "type": "scatter",
                "x": rows["memory"].to_numpy(),
                "y": rows["accuracy"].to_numpy(),
                "error_y": {"type": "data", "array": rows["stderr"].to_numpy()},
                "mode": "markers",
                "name": model,
                "legendgroup": group,
                "showlegend": False,
                "marker": {
                    "color": color,
                    "size": 12,
                    "symbol": rows["loops"].map(symbols).tolist(),
                    "line": {"color": "#222", "width": [2.5 if ring else 0 for ring in ringed]},
                },
                "customdata": rows[["r", "spread", "n_samples", "runs", "held", "here"]].to_numpy(),
                "hovertemplate": (
                    f"model {model}<br>%{{customdata[0]}}<br>accuracy %{{y:.3f}}%{{customdata[1]}}"
                    f"<br>%{{customdata[4]}} {unit}<br>samples %{{customdata[2]}}, %{{customdata[3]}}"
                    "%{customdata[5]}<extra></extra>"
                ),
            }
        )
        traces.extend(_mark_trace(rows, "memory", marks, group))
    for index, (loops, symbol) in enumerate(symbols.items()):  # the shape key: drawn in the legend only
        traces.append(
            _legend_key(
                loops_label(loops),
                f"loops {loops}",
                "loops (shape)" if index == 0 else None,
                {"color": "#777", "size": 10, "symbol": symbol},
            )
        )
    traces.extend(mark_keys(marks, shown["configuration"]))
    traces.extend(_count_labels(shown))
    front = shown[frontier].sort_values(["memory", "accuracy"])
    traces.append(
        {
            "type": "scatter",
            "x": front["memory"].to_numpy(),
            "y": front["accuracy"].to_numpy(),
            "mode": "lines",
            "line": {"shape": "hv", "dash": "dot", "color": "#222"},
            "name": "Pareto frontier (ringed)",
            "hoverinfo": "skip",
        }
    )
    top = max(1.0, float((shown["accuracy"] + shown["stderr"].fillna(0)).max()))
    notes = [DECIMAL_NOTE, *_pooled_note(shown)]
    if (shown["here"] != "").any():
        notes.append(COINCIDENT_NOTE)
    if not missing.empty:
        notes.append(f"{label} unavailable: {_point_names(missing)}")
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "legend": {"groupclick": "togglegroup", "tracegroupgap": 0},
            "xaxis": {"rangemode": "tozero", "title": {"text": unit_title(label, unit, scale)}},
            "yaxis": {"range": [-0.05, top + 0.05], "title": {"text": f"accuracy ({shown['metric'].iloc[0]})"}},
            "annotations": [note],
            "margin": margin,
        },
    )


COINCIDENT_NOTE = (
    "every point at its measured memory; a number beside a marker counts the points under it (hover lists them)"
)
# The black marks drawn over a point's marker, one per configuration of a set (`config_marks`): line-only symbols, so
# the model's colour and r's shape stay visible under them.
_MARKS = (
    "x-thin",
    "cross-thin",
    "asterisk",
    "line-ew",
    "line-ns",
    "y-up",
    "y-down",
    "hash",
    "line-ne",
    "line-nw",
    "y-left",
    "y-right",
)
MARK_STYLE = {"color": "#111", "size": 11, "line": {"color": "#111", "width": 1.8}}


def configuration(row: Any) -> str:
    """What sets a point apart from the model's plain run at its r (`point_label` without the loop count): 'exit gate
    0.5', 'int8', 'shared-last auto'; '' for the plain run."""
    return point_label(row).removeprefix(loops_label(row.loops)).strip()


def config_marks(points: pd.DataFrame) -> dict[str, str]:
    """One mark per configuration of a set's points (`configuration`, sorted; the plain run has none). Every figure of
    a set takes its marks from the whole set's points, so a configuration has one mark in all of them."""
    if points.empty:
        return {}
    labels = sorted({configuration(row) for row in points.itertuples()} - {""})
    return {label: _MARKS[index % len(_MARKS)] for index, label in enumerate(labels)}


def _mark_trace(rows: pd.DataFrame, x: str, marks: Mapping[str, str], group: str) -> list[dict[str, Any]]:
    """The marks over a model's points that have a configuration (`config_marks`), in the model's legend group so they
    hide with it; none where every point is the plain run. `rows` carry a `configuration` column."""
    marked = rows[rows["configuration"] != ""]
    if marked.empty:
        return []
    return [
        {
            "type": "scatter",
            "x": marked[x].to_numpy(),
            "y": marked["accuracy"].to_numpy(),
            "mode": "markers",
            "name": "configuration marks",
            "legendgroup": group,
            "showlegend": False,
            "marker": MARK_STYLE | {"symbol": marked["configuration"].map(marks).tolist()},
            "hoverinfo": "skip",
        }
    ]


def mark_keys(marks: Mapping[str, str], drawn: Iterable[str]) -> list[dict[str, Any]]:
    """The legend's configuration key: 'plain run (no mark)', then each drawn configuration beside its mark; none
    where every point drawn is a plain run."""
    present = set(drawn)
    if not present - {""}:
        return []  # every point the plain run: nothing to tell apart
    names = [("plain run (no mark)", "")] if "" in present else []
    names += [(label, mark) for label, mark in marks.items() if label in present]
    return [
        _legend_key(
            name,
            f"configuration {name}",
            "configuration (mark)" if index == 0 else None,
            MARK_STYLE | ({"symbol": mark} if mark else {"opacity": 0}),
        )
        for index, (name, mark) in enumerate(names)
    ]


def _coincident(points: pd.DataFrame) -> pd.Series:
    """A key per point shared by the points drawn on top of one another: a model's points at one memory (3 significant
    digits) and one accuracy (to 0.01)."""
    return points["memory"].map(lambda m: f"{m:.3g}") + "|" + points["accuracy"].map(lambda a: f"{a:.2f}")


def _also_here(points: pd.DataFrame) -> list[str]:
    """Each point's hover line naming the other points drawn at its place ('' where it is alone); a point's name is
    unique in its set."""
    names = (points["model"] + " " + points["r"]).tolist()
    keys = _coincident(points).tolist()
    together: dict[str, list[str]] = {}
    for key, name in zip(keys, names):
        together.setdefault(key, []).append(name)
    return [
        "<br>also here: " + ", ".join(other for other in together[key] if other != name)
        if len(together[key]) > 1
        else ""
        for key, name in zip(keys, names)
    ]


def _count_labels(points: pd.DataFrame) -> list[dict[str, Any]]:
    """A small '×N' beside each place where N points coincide (`_coincident`), so none hides unnoticed."""
    groups = points.groupby(_coincident(points), sort=True)
    places = [(rows["memory"].iloc[0], rows["accuracy"].max(), len(rows)) for _, rows in groups if len(rows) > 1]
    if not places:
        return []
    return [
        {
            "type": "scatter",
            "x": [x for x, _, _ in places],
            "y": [y for _, y, _ in places],
            "mode": "text",
            "text": [f"×{n}" for _, _, n in places],
            "textposition": "top right",
            "textfont": {"size": 11, "color": "#333"},
            "name": "points here",
            "showlegend": False,
            "hoverinfo": "skip",
        }
    ]


def _legend_key(name: str, group: str, title: str | None, marker: dict[str, Any]) -> dict[str, Any]:
    """A trace drawn in the legend only (no data), heading its legend group."""
    key = {
        "type": "scatter",
        "x": [None],
        "y": [None],
        "mode": "markers",
        "name": name,
        "legendgroup": group,
        "marker": marker,
        "hoverinfo": "skip",
    }
    return key | ({"legendgrouptitle": {"text": title}} if title is not None else {})


def _seeds(points: pd.DataFrame) -> pd.Series:
    """How many seeds each point pools (1 where the frame does not say)."""
    return points["seeds"] if "seeds" in points else pd.Series(1, index=points.index)


def _runs_text(points: pd.DataFrame) -> list[str]:
    """What each point is made of, for its hover: 'run 7', or '4 seeds pooled (runs 1-4)'."""
    if "run_ids" not in points:
        return [f"run {run_id}" for run_id in points.get("run_id", pd.Series("?", index=points.index))]
    return [
        f"{seeds} seeds pooled (runs {id_ranges(ids)})" if seeds > 1 else f"run {ids[0]}"
        for seeds, ids in zip(_seeds(points), points["run_ids"])
    ]


def _pooled_note(points: pd.DataFrame) -> list[str]:
    """The figure's note on seeds, when a point pools several: how they are combined."""
    most = int(_seeds(points).max()) if not points.empty else 1
    if most < 2:
        return []
    return [f"seeds pooled: a point's accuracy and error bar are over every item of all its seeds (up to {most})"]


def accuracy_vs_loops(
    points: pd.DataFrame,
    measure: str,
    task: str = "all",
    label: str | None = None,
    colors: Mapping[str, str] | None = None,
) -> go.Figure:
    """Accuracy against loops per model (left axis) with the memory measure on a second axis (right).

    Where the accuracy line flattens while the memory line keeps rising, extra depth stopped paying. A model's lines
    (one per exit threshold it ran at, where the set sweeps one) share its colour and its legend group: one legend
    entry per line, its memory line toggled with it. Drawn for the headline configurations only (`headline`): the
    exit thresholds and memory levers have figures of their own, and here they stacked a dozen markers at one r.
    """
    label = label or measure_label(measure)
    title = _with_set(f"Accuracy and memory against loops: {plain(task)}", points)
    points, left_out = headline(points)
    palette = _colors_of(points["model"], colors)
    keys = zip(
        *(
            points.get(column, [default] * len(points))
            for column, default in (
                ("model", ""),
                ("exit_threshold", None),
                ("exit_criterion", None),
                ("config_label", ""),
            )
        )
    )
    points = _plain_frame(points).assign(series=[plain(series_name(*key)) for key in keys])
    if points.empty:
        return _empty(title, "no evaluated runs with this task yet")
    has_memory = measure in points and points[measure].notna().any()
    unit, scale = byte_unit(points[measure]) if has_memory else ("GB", GB)
    traces = []
    for (model, series), rows in points.sort_values("loops").groupby(["model", "series"], sort=True):
        color = palette[model]
        traces.append(
            {
                "type": "scatter",
                "x": rows["loops"].to_numpy(),
                "y": rows["accuracy"].to_numpy(),
                "error_y": {"type": "data", "array": rows["stderr"].to_numpy(dtype=float)},
                "mode": "lines+markers",
                "name": series,
                "legendgroup": model,
                "line": {"color": color},
                "marker": {"symbol": rows["loops"].map(loops_symbol).tolist(), "size": 9},
                "customdata": _runs_text(rows),
                "xaxis": "x",
                "yaxis": "y",
                "hovertemplate": f"{series}<br>loops %{{x}}<br>accuracy %{{y:.3f}}<br>%{{customdata}}<extra></extra>",
            }
        )
        measured = rows[rows[measure].notna()] if has_memory else rows.iloc[0:0]
        if not measured.empty:
            traces.append(
                {
                    "type": "scatter",
                    "x": measured["loops"].to_numpy(),
                    "y": (measured[measure] / scale).to_numpy(),
                    "mode": "lines+markers",
                    "name": f"{series} {label}",
                    "legendgroup": model,
                    "showlegend": False,
                    "line": {"color": color, "dash": "dash"},
                    "xaxis": "x",
                    "yaxis": "y2",
                    "marker": {"symbol": [f"{loops_symbol(r)}-open" for r in measured["loops"]], "size": 9},
                    "hovertemplate": f"{series}<br>loops %{{x}}<br>%{{y:.3f}} {unit}<extra></extra>",
                }
            )
    loop_counts = sorted(int(r) for r in points["loops"].dropna().unique())
    axes = _secondary_y(
        {
            "title": {"text": "loops (r)"},
            "type": "log",
            "tickvals": loop_counts,
            "ticktext": [str(r) for r in loop_counts],
        },  # every r run
        {"title": {"text": f"accuracy ({points['metric'].iloc[0]})"}, "range": [-0.05, 1.05]},
        # Its own round ticks: ticks synced to the left axis's grid read 1.02, 5.08, 9.15 MB.
        {
            "title": {"text": unit_title(label, unit, scale)},
            "rangemode": "tozero",
            "showgrid": False,
            "tickmode": "auto",
        },
    )
    notes = [DECIMAL_NOTE if has_memory else f"{label}: unavailable for every run", *_pooled_note(points)]
    if left_out:
        notes.append(f"{left_out} points with an exit threshold or a KV setting are left out: {HEADLINE_NOTE}")
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            **axes,
            "title": {"text": title},
            "legend": {
                "title": {"text": "solid: accuracy · dashed: memory"},
                "groupclick": "toggleitem",
                "tracegroupgap": 4,
                "x": 1.08,
            },
            "annotations": [note],
            "margin": margin,
        },
    )


HEADLINE_NOTE = "see Accuracy against compute (exit thresholds) and Memory levers (KV policies and dtypes)"


def headline(points: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """A set's headline points and how many were left out: each model's points without an exit threshold in its plain
    configuration (`configuration` ''); a model with no plain point keeps its points without an exit threshold."""
    if points.empty:
        return points, 0
    no_exit = points["exit_threshold"].isna()
    plain_run = no_exit & (points["config_label"] == "" if "config_label" in points else True)
    has_plain = points["model"].isin(points.loc[plain_run, "model"])
    keep = plain_run | (no_exit & ~has_plain)
    return points[keep], int((~keep).sum())


def _secondary_y(xaxis: dict[str, Any], yaxis: dict[str, Any], yaxis2: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The axes of one plot with a second y axis on the right, as `make_subplots(specs=[[{"secondary_y": True}]])`
    lays them out (traces on it name `yaxis="y2"`), each merged with its own settings: written out so the figure
    is given whole (see the module's docstring)."""
    return {
        "xaxis": {"anchor": "y", "domain": [0.0, 0.94], **xaxis},
        "yaxis": {"anchor": "x", "domain": [0.0, 1.0], **yaxis},
        "yaxis2": {"anchor": "x", "overlaying": "y", "side": "right", **yaxis2},
    }
