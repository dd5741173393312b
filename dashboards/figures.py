"""The dashboard figures: pure functions from query DataFrames (db/queries.py) to Plotly figures.

The static report and the served app draw the same figures from the same functions. Bytes are
scaled to one decimal unit per axis (B, KB, MB, GB; 1 GB = 1e9 bytes, as the MELT paper counts),
and a NULL measure is never drawn as zero: the figure names what was unavailable instead.

Stored strings (model specs, task and metric names) come from users and plugins. Plotly renders a
subset of HTML in legends, titles and hovers, `<a href>` included, so every stored string is
escaped (`plain`) before it reaches a figure: it shows as the text it is, never as markup.

The figures the report draws by the hundred (accuracy against memory, loops and compute, memory over a run)
are given to `go.Figure` whole, their traces and layout as dicts: Plotly validates at every `add_trace` and
`update_*` call, and a figure built up call by call (or by Plotly Express) took several times as long as the
same figure given whole (docs/benchmarks.md). The faceted ones (depth, probes) keep Plotly Express, which lays
out their panels.
"""

from __future__ import annotations

import html
import json
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from db.sets import KV_AXIS, config_fields, id_ranges
from measures import ANALYTIC, BY_NAME, BYTE_UNITS, COMPUTE_BY_NAME, GB, MEMORY_MEASURES, WEIGHTS_PLUS_KV

KV_ONLY = ("kv_bytes_allocated", "kv_bytes_reserved")  # the measures that leave the weights out
# What users quote as a model's memory: the answer says when one of them would rank another point first.
QUOTED_MEASURES = ("nvml_process", WEIGHTS_PLUS_KV, "kv_bytes_allocated", "rss")
# What each measure holds, said wherever a sentence names it: above all whether the weights are counted.
MEASURE_SCOPE: dict[str, str] = {
    "nvml_process": "the process's whole GPU memory, weights counted",
    WEIGHTS_PLUS_KV: "what the model holds, weights counted",
    "torch_allocated": "the tensors on the GPU, weights counted",
    **{name: "weights not counted" for name in KV_ONLY},
    ANALYTIC: "from the config, weights counted",
    "rss": "the whole process, weights counted",
}
DECIMAL_NOTE = "GB are decimal (1 GB = 1e9 bytes)"
# What the empty profile figure suggests: a shipped model at lengths its 512-token context holds (with the decode steps).
PROFILE_EXAMPLE = "loopeval profile zoo:melt-tiny --lengths 64,256,448"
PROBE_EXAMPLE = "loopeval probe zoo:ouro-tiny"  # what the empty probe figure suggests: a shipped looped model
# Models take these colours in turn (`model_colors`); a figure's other lines (a run's measures) take the second set,
# so no colour stands for a model in one figure and for something else in the next.
_PALETTE = (*px.colors.qualitative.Plotly, *px.colors.qualitative.Dark24)
_MEASURE_PALETTE = px.colors.qualitative.Dark2
# One shape per loop count r, r = 1 first (`loops_symbol`).
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "pentagon", "star", "hexagon", "triangle-down", "star-diamond",
            "hourglass", "triangle-left", "bowtie", "triangle-right", "octagon", "hexagram", "star-square")


_STORED_TEXT = ("model", "task", "metric", "suite", "phase", "group", "config_label")


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
    return frame.assign(**{c: frame[c].map(plain) for c in present})


def byte_unit(values: Sequence[float] | pd.Series | np.ndarray) -> tuple[str, float]:
    """The largest decimal unit (GB, MB, KB, B) that keeps the biggest finite value at or above 1."""
    finite = [abs(float(v)) for v in values if v is not None and np.isfinite(v)]
    largest = max(finite, default=0.0)
    for unit, scale in BYTE_UNITS:
        if largest >= scale:
            return unit, scale
    return "GB", GB  # nothing to scale: label the axis in the unit people expect


def unit_title(label: str, unit: str, scale: float) -> str:
    """Axis title naming the decimal unit, e.g. 'KV cache peak (decimal GB, 1e9 bytes)'."""
    if unit == "B":
        return f"{label} (bytes)"
    return f"{label} (decimal {unit}, {scale:.0e} bytes)".replace("e+0", "e")


def measure_label(measure: str, context_tokens: int | None = None) -> str:
    """Human label of a selectable measure; the analytic one names its context length."""
    label = MEMORY_MEASURES.get(measure, measure)
    if measure == ANALYTIC and context_tokens is not None:
        return f"{label} at {context_tokens} tokens"
    return label


def available_measures(points: pd.DataFrame) -> list[str]:
    """The selectable measures that some point has (on a CPU-only machine NVML and torch are unavailable), in order."""
    return [measure for measure in MEMORY_MEASURES if measure in points and points[measure].notna().any()]


def measure_words(measure: str, context_tokens: int | None = None) -> str:
    """A measure named for a sentence: its label and what it holds, 'weights + KV cache peak (what the model holds,
    weights counted)'."""
    scope = MEASURE_SCOPE.get(measure)
    return measure_label(measure, context_tokens) + (f" ({scope})" if scope else "")


def default_measure(points: pd.DataFrame) -> str:
    """The first selectable measure that any point has (`MEMORY_MEASURES` is in the default's order): the NVML
    process total where a GPU was measured, else weights + KV cache peak."""
    return next(iter(available_measures(points) or MEMORY_MEASURES))


def pareto_mask(memory: Sequence[float], accuracy: Sequence[float]) -> np.ndarray:
    """True for each point no other point dominates (no more memory and no less accuracy, one strictly better).

    Equal points do not dominate each other, so ties both stay on the frontier.
    """
    x = np.asarray(memory, dtype=float)
    y = np.asarray(accuracy, dtype=float)
    no_worse = (x[None, :] <= x[:, None]) & (y[None, :] >= y[:, None])  # [i, j]: j is no worse than i
    better = (x[None, :] < x[:, None]) | (y[None, :] > y[:, None])
    return ~(no_worse & better).any(axis=1)


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


def loops_symbol(loops: object) -> str:
    """A loop count's marker, the same in every figure: r = 1 a circle, 2 a square, 3 a diamond, 4 a triangle, ...
    (an unknown count an open circle). Kept apart so a marker per configuration (exit threshold) can refine it."""
    return "circle-open" if pd.isna(loops) else _SYMBOLS[(int(loops) - 1) % len(_SYMBOLS)]


MESSAGE_WIDTH = 90  # characters per line of a note: a long list of runs wraps instead of running off both edges


def _note(text: str) -> dict[str, Any]:
    """A note inside the plot area (empty data, unavailable measures), wrapped to fit it: a layout annotation."""
    lines = textwrap.wrap(text, MESSAGE_WIDTH, break_long_words=False, break_on_hyphens=False)
    return {"text": "<br>".join(lines), "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False,
            "font": {"size": 13, "color": "#555"}}


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
    return go.Figure(layout={"title": {"text": title}, "xaxis": {"visible": False}, "yaxis": {"visible": False},
                             "annotations": [_note(text)]})


def _with_set(title: str, points: pd.DataFrame) -> str:
    """The title with the evaluation set its points belong to (`db.sets`; one set per figure) as a subtitle."""
    if "set_label" not in points or points.empty:
        return title
    return f"{title}<br><sup>{plain(points['set_label'].iloc[0])}</sup>"


def exit_label(threshold: float | None, criterion: str | None) -> str:
    """A run's point on the per-token exit axis as tables, hovers and legends name it: 'gate 0.5', 'kl 0.1';
    '-' off the axis (the model's own exit policy)."""
    if threshold is None or threshold != threshold:
        return "-"
    return f"{threshold:g}" if criterion is None or criterion != criterion else f"{criterion} {threshold:g}"


def loops_label(loops: object) -> str:
    """How a loop count reads everywhere: `r=4`. A plain transformer is r=1 (one pass, T = 1), as the
    queries store it; an unknown count (NaN) reads `r=?` rather than `r=nan`."""
    return "r=?" if pd.isna(loops) else f"r={int(loops)}"


def config_labels(points: pd.DataFrame) -> list[str]:
    """Each point's configuration (`db.sets.configuration`, the `config` column) as far as it tells the point apart
    from the same model's other points: the fields whose values differ among them, 'dtype=bfloat16 exit_loop=2', the
    KV policy and dtype first and by their values alone, as people name them ('shared-last int8'); '' where the model
    has one configuration in the set (or the frame has no `config`)."""
    if "config" not in points:
        return [""] * len(points)
    fields = [config_fields(key) for key in points["config"]]
    of_model: dict[str, list[dict[str, Any]]] = {}
    for model, config in zip(points["model"], fields):
        of_model.setdefault(model, []).append(config)

    def tells_apart(model: str, name: str) -> bool:  # the model's points do not all hold one value of it
        return len({_config_value(c[name]) if name in c else None for c in of_model[model]}) > 1

    def label(name: str, value: Any) -> str:
        return _config_value(value) if name in KV_AXIS else f"{name}={_config_value(value)}"

    def order(name: str) -> tuple[int, str]:  # the KV axis first, policy before dtype, then the overrides by name
        return (KV_AXIS.index(name), "") if name in KV_AXIS else (len(KV_AXIS), name)

    return [" ".join(label(name, config[name]) for name in sorted(config, key=order) if tells_apart(model, name))
            for model, config in zip(points["model"], fields)]


def _config_value(value: Any) -> str:
    """An override's value as a name shows it: text as written, anything else as JSON ('bfloat16', '2', 'true')."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def series_name(model: str, threshold: float | None, criterion: str | None, config: str = "") -> str:
    """A line of a figure against r: the model with its configuration (`config_labels`), and its exit threshold
    where the set sweeps one, so the points of two configurations or thresholds at one r are two lines, never a
    zigzag of one."""
    name = f"{model} {config}" if config else model
    return name if threshold is None or threshold != threshold else f"{name} exit {exit_label(threshold, criterion)}"


def point_label(row: Any) -> str:
    """A point's loops, its exit threshold where the set sweeps one and its configuration where the model has several
    (`config_labels`, the `config_label` column): 'r=4', 'r=4 exit gate 0.5', 'r=4 dtype=bfloat16'. The configuration is
    stored text: a figure escapes its frame first (`_plain_frame`)."""
    threshold = getattr(row, "exit_threshold", None)
    exit_at = "" if threshold is None or threshold != threshold else f" exit {plain(exit_label(threshold, row.exit_criterion))}"
    config = getattr(row, "config_label", "")
    return f"{loops_label(row.loops)}{exit_at}{f' {config}' if config else ''}"


def point_name(row: Any) -> str:
    """How a sentence names a point: 'zoo:ouro-tiny r=4 exit gate 0.9'."""
    return f"{row.model} {point_label(row)}"


def _point_names(frame: pd.DataFrame) -> str:
    return ", ".join(point_name(row) for row in frame.itertuples())


def _measured(points: pd.DataFrame, measure: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points with the measure, points without it): the second are named, never drawn as zero."""
    if measure not in points:
        return points.iloc[0:0], points
    return points[points[measure].notna()].copy(), points[points[measure].isna()]


def accuracy_vs_memory(points: pd.DataFrame, measure: str, task: str = "all", label: str | None = None,
                       colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against memory, one marker per point (configuration), with error bars and the Pareto frontier.

    `points` is `queries.accuracy_memory(...)` (one evaluation set, named in the title) with the
    `measure` column present (see `dashboards.data.with_derived_measures`). Points whose measure is
    NULL are named, not plotted.
    Colour is the model and the marker's shape its loop count (a legend entry per shape), so no text
    label sits beside a point to collide with its neighbours; a model's points at one r and one memory (exit
    thresholds, configurations) are set side by side (`_spread`), each hover naming its point. The memory axis
    starts at zero: a few MB of noise on a 900 MB process must not look like a difference.
    """
    label = label or measure_label(measure)
    title = _with_set(f"Accuracy against memory: {plain(task)}, {label}", points)
    palette = _colors_of(points["model"], colors)
    points = _plain_frame(points)
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
    shown["runs"] = _runs_text(shown)
    shown["held"] = [f"{m:.4g}" for m in shown["memory"]]
    shown["x"] = shown["memory"] + _spread(shown)
    frontier = pareto_mask(shown["memory"], shown["accuracy"])
    symbols = {r: loops_symbol(r) for r in sorted(shown["loops"].unique())}
    traces = []
    for index, (model, rows) in enumerate(shown.groupby("model", sort=True)):
        ringed = frontier[shown.index.get_indexer(rows.index)]
        color, group = palette[model], f"model {index}"
        # The legend draws a trace's first marker; a per-point shape and ring would stand for the model there,
        # so the model's entry is a plain circle of its colour, toggling its points with it (`togglegroup`).
        traces.append(_legend_key(model, group, "model" if index == 0 else None, {"color": color, "size": 10, "symbol": "circle"}))
        traces.append({
            "type": "scatter", "x": rows["x"].to_numpy(), "y": rows["accuracy"].to_numpy(),
            "error_y": {"type": "data", "array": rows["stderr"].to_numpy()},
            "mode": "markers", "name": model, "legendgroup": group, "showlegend": False,
            "marker": {"color": color, "size": 12, "symbol": rows["loops"].map(symbols).tolist(),
                       "line": {"color": "#222", "width": [2.5 if ring else 0 for ring in ringed]}},
            "customdata": rows[["r", "spread", "n_samples", "runs", "held"]].to_numpy(),
            "hovertemplate": (f"model {model}<br>%{{customdata[0]}}<br>accuracy %{{y:.3f}}%{{customdata[1]}}"
                              f"<br>%{{customdata[4]}} {unit}<br>samples %{{customdata[2]}}, %{{customdata[3]}}<extra></extra>"),
        })
    for index, (loops, symbol) in enumerate(symbols.items()):  # the shape key: drawn in the legend only
        traces.append(_legend_key(loops_label(loops), f"loops {loops}", "loops (shape)" if index == 0 else None,
                                  {"color": "#777", "size": 10, "symbol": symbol}))
    front = shown[frontier].sort_values(["memory", "accuracy"])
    traces.append({"type": "scatter", "x": front["x"].to_numpy(), "y": front["accuracy"].to_numpy(), "mode": "lines",
                   "line": {"shape": "hv", "dash": "dot", "color": "#222"}, "name": "Pareto frontier (ringed)", "hoverinfo": "skip"})
    top = max(1.0, float((shown["accuracy"] + shown["stderr"].fillna(0)).max()))
    notes = [DECIMAL_NOTE, *_pooled_note(shown)]
    if (shown["x"] != shown["memory"]).any():
        notes.append(SPREAD_NOTE)
    if not missing.empty:
        notes.append(f"{label} unavailable: {_point_names(missing)}")
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(data=traces, layout={
        "title": {"text": title}, "legend": {"groupclick": "togglegroup", "tracegroupgap": 2},
        "xaxis": {"rangemode": "tozero", "title": {"text": unit_title(label, unit, scale)}},
        "yaxis": {"range": [-0.05, top + 0.05], "title": {"text": f"accuracy ({shown['metric'].iloc[0]})"}},
        "annotations": [note], "margin": margin,
    })


SPREAD = 0.015  # of the memory axis's largest value: how far apart coincident points are set side by side
SPREAD_NOTE = "points of one model and r at one memory (exit thresholds, configurations) are set side by side; hover for each"


def _spread(points: pd.DataFrame) -> np.ndarray:
    """Sideways offsets (axis units) for the points of one model and r at one memory (to 3 significant digits): its
    exit thresholds and configurations, which would otherwise hide one another exactly. Centred on the true memory,
    in the order of their labels; 0 for a point alone there. Hovers give each point's own memory."""
    offsets = np.zeros(len(points))
    step = SPREAD * float(points["memory"].max())
    at = points["memory"].map(lambda memory: f"{memory:.3g}")
    for _, rows in points.groupby([points["model"], points["loops"], at], sort=False):
        order = points.index.get_indexer(rows.sort_values("r").index)
        offsets[order] = (np.arange(len(rows)) - (len(rows) - 1) / 2) * step
    return offsets


def _legend_key(name: str, group: str, title: str | None, marker: dict) -> dict[str, Any]:
    """A trace drawn in the legend only (no data), heading its legend group."""
    key = {"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name, "legendgroup": group,
           "marker": marker, "hoverinfo": "skip"}
    return key | ({"legendgrouptitle": {"text": title}} if title is not None else {})


def _seeds(points: pd.DataFrame) -> pd.Series:
    """How many seeds each point pools (1 where the frame does not say)."""
    return points["seeds"] if "seeds" in points else pd.Series(1, index=points.index)


def _runs_text(points: pd.DataFrame) -> list[str]:
    """What each point is made of, for its hover: 'run 7', or '4 seeds pooled (runs 1-4)'."""
    if "run_ids" not in points:
        return [f"run {run_id}" for run_id in points.get("run_id", pd.Series("?", index=points.index))]
    return [f"{seeds} seeds pooled (runs {id_ranges(ids)})" if seeds > 1 else f"run {ids[0]}"
            for seeds, ids in zip(_seeds(points), points["run_ids"])]


def _pooled_note(points: pd.DataFrame) -> list[str]:
    """The figure's note on seeds, when a point pools several: how they are combined."""
    most = int(_seeds(points).max()) if not points.empty else 1
    if most < 2:
        return []
    return [f"seeds pooled: a point's accuracy and error bar are over every item of all its seeds (up to {most})"]


def accuracy_vs_loops(points: pd.DataFrame, measure: str, task: str = "all", label: str | None = None,
                      colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against loops per model (left axis) with the memory measure on a second axis (right).

    Where the accuracy line flattens while the memory line keeps rising, extra depth stopped paying. A model's lines
    (one per exit threshold it ran at, where the set sweeps one) share its colour and its legend group: one legend
    entry per line, its memory line toggled with it.
    """
    label = label or measure_label(measure)
    title = _with_set(f"Accuracy and memory against loops: {plain(task)}", points)
    palette = _colors_of(points["model"], colors)
    keys = zip(*(points.get(column, [default] * len(points)) for column, default in
                 (("model", ""), ("exit_threshold", None), ("exit_criterion", None), ("config_label", ""))))
    points = _plain_frame(points).assign(series=[plain(series_name(*key)) for key in keys])
    if points.empty:
        return _empty(title, "no evaluated runs with this task yet")
    has_memory = measure in points and points[measure].notna().any()
    unit, scale = byte_unit(points[measure]) if has_memory else ("GB", GB)
    traces = []
    for (model, series), rows in points.sort_values("loops").groupby(["model", "series"], sort=True):
        color = palette[model]
        traces.append({
            "type": "scatter", "x": rows["loops"].to_numpy(), "y": rows["accuracy"].to_numpy(),
            "error_y": {"type": "data", "array": rows["stderr"].to_numpy(dtype=float)},
            "mode": "lines+markers", "name": series, "legendgroup": model, "line": {"color": color},
            "marker": {"symbol": rows["loops"].map(loops_symbol).tolist(), "size": 9},
            "customdata": _runs_text(rows), "xaxis": "x", "yaxis": "y",
            "hovertemplate": f"{series}<br>loops %{{x}}<br>accuracy %{{y:.3f}}<br>%{{customdata}}<extra></extra>",
        })
        measured = rows[rows[measure].notna()] if has_memory else rows.iloc[0:0]
        if not measured.empty:
            traces.append({
                "type": "scatter", "x": measured["loops"].to_numpy(), "y": (measured[measure] / scale).to_numpy(),
                "mode": "lines+markers", "name": f"{series} {label}", "legendgroup": model, "showlegend": False,
                "line": {"color": color, "dash": "dash"}, "xaxis": "x", "yaxis": "y2",
                "marker": {"symbol": [f"{loops_symbol(r)}-open" for r in measured["loops"]], "size": 9},
                "hovertemplate": f"{series}<br>loops %{{x}}<br>%{{y:.3f}} {unit}<extra></extra>",
            })
    loop_counts = sorted(int(r) for r in points["loops"].dropna().unique())
    axes = _secondary_y(
        {"title": {"text": "loops (r)"}, "type": "log", "tickvals": loop_counts, "ticktext": [str(r) for r in loop_counts]},  # every r run
        {"title": {"text": f"accuracy ({points['metric'].iloc[0]})"}, "range": [-0.05, 1.05]},
        # Its own round ticks: ticks synced to the left axis's grid read 1.02, 5.08, 9.15 MB.
        {"title": {"text": unit_title(label, unit, scale)}, "rangemode": "tozero", "showgrid": False,
         "tickmode": "auto"})
    notes = [DECIMAL_NOTE if has_memory else f"{label}: unavailable for every run", *_pooled_note(points)]
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(data=traces, layout={
        **axes, "title": {"text": title},
        "legend": {"title": {"text": "solid: accuracy · dashed: memory"}, "groupclick": "toggleitem",
                   "tracegroupgap": 4, "x": 1.08},
        "annotations": [note], "margin": margin,
    })


def _secondary_y(xaxis: dict, yaxis: dict, yaxis2: dict) -> dict[str, dict]:
    """The axes of one plot with a second y axis on the right, as `make_subplots(specs=[[{"secondary_y": True}]])`
    lays them out (traces on it name `yaxis="y2"`), each merged with its own settings: written out so the figure
    is given whole (see the module's docstring)."""
    return {"xaxis": {"anchor": "y", "domain": [0.0, 0.94], **xaxis}, "yaxis": {"anchor": "x", "domain": [0.0, 1.0], **yaxis},
            "yaxis2": {"anchor": "x", "overlaying": "y", "side": "right", **yaxis2}}


# The compute axes of the accuracy-against-compute figures: `measures.COMPUTE_MEASURES` columns of `dashboards.data`.
COMPUTE_AXES: tuple[str, ...] = ("loops_per_token", "seconds_per_token")


def compute_varies(points: pd.DataFrame) -> bool:
    """Whether a set's points spread along the compute axis: an exit threshold swept, or a model run at several r."""
    if points.empty:
        return False
    return bool(points["exit_threshold"].notna().any() or points.groupby("model")["loops"].nunique().gt(1).any())


def accuracy_vs_compute(points: pd.DataFrame, axis: str, task: str = "all",
                        colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against what a generated token cost (`axis`: mean loops per token, or generate seconds per token),
    one line per model (and r, where exit thresholds are swept) through its points in threshold order, then r.

    Where a lower exit threshold saves loops without losing accuracy, the line runs left level; the hover names
    each point's threshold. Drawn only where the set varies compute (`compute_varies`), else a note says how to.
    """
    measure = COMPUTE_BY_NAME[axis]
    title = _with_set(f"Accuracy against {measure.label}: {plain(task)}", points)
    if not compute_varies(points) or points[axis].isna().all():
        return _empty(title, "nothing to compare here: this set varies neither the exit threshold nor the loops. "
                             "Sweep them with `loopeval run --exit-threshold 0.5,0.8,1.0` or `--loops 1,2,4`.")
    palette = _colors_of(points["model"], colors)
    frame = _exit_lines(_plain_frame(points[points[axis].notna()]))
    frame["runs"] = _runs_text(frame)
    frame["named"] = [series_name(model, None, None, config) for model, config in
                      zip(frame["model"], frame.get("config_label", [""] * len(frame)))]
    frame = frame.sort_values(["line", "exit_threshold", "loops"], na_position="last")
    x_title = f"{measure.label} ({measure.unit})"
    hover = (f"model=%{{customdata[0]}}<br>{x_title}=%{{x}}<br>accuracy=%{{y}}<br>exit threshold=%{{customdata[1]}}"
             "<br>r=%{customdata[2]}<br>runs=%{customdata[3]}<extra></extra>")
    traces, named = [], set()
    for (model, _), rows in frame.groupby(["model", "line"], sort=False):  # lines in the order they were sorted
        traces.append({
            "type": "scatter", "x": rows[axis].to_numpy(), "y": rows["accuracy"].to_numpy(),
            "error_y": {"array": rows["stderr"].to_numpy(dtype=float)}, "mode": "lines+markers",
            "name": model, "legendgroup": model, "showlegend": model not in named, "line": {"color": palette[model]},
            "marker": {"symbol": rows["loops"].map(loops_symbol).tolist(), "size": 9},
            "customdata": rows[["named", "exit", "loops", "runs"]].to_numpy(), "hovertemplate": hover,
        })
        named.add(model)
    notes = [f"{measure.label}: {'from the samples the runs stored' if axis == 'loops_per_token' else 'time inside generate, prefill included'}",
             *_pooled_note(points)]
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(data=traces, layout={
        "title": {"text": title}, "legend": {"title": {"text": "model (a line per r where exit thresholds vary)"}, "tracegroupgap": 0},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"range": [-0.05, 1.05], "title": {"text": f"accuracy ({frame['metric'].iloc[0]})"}},
        "annotations": [note], "margin": {"t": 60, **margin},
    })


def _exit_lines(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its `exit` label and `line`: a model's runs without a threshold make one line through its r; the
    runs of a swept threshold make a line per (model, r), which ends at the same model's run at that r without a
    threshold (its own exit policy, every loop for the tiny zoo), drawn on both lines. A threshold that keeps every
    loop (gate 1.0) decodes the same tokens as that run, so the default sweep does not run it twice."""
    frame = frame.assign(exit=[plain(exit_label(t, c)) for t, c in zip(frame["exit_threshold"], frame["exit_criterion"])])
    swept = frame["exit_threshold"].notna()
    at_r = " r=" + frame["loops"].astype(int).astype(str)
    config = frame.get("config_label", pd.Series("", index=frame.index))
    model = frame["model"] + np.where(config != "", " " + config, "")  # a configuration's points make lines of their own
    frame["line"] = model + np.where(swept, at_r, "")
    ends = frame[~swept & (model + at_r).isin(frame.loc[swept, "line"])]
    return pd.concat([frame, ends.assign(line=(model + at_r)[ends.index])], ignore_index=True)


def _mark_trained_loops(fig: go.Figure, trained: pd.Series, colors: dict[str, str]) -> None:
    """A dotted vertical line at each model's trained T, in the model's colour, on every panel with data: the lines
    `add_vline(row="all", col="all")` draws, given at once: drawn by it, they were slow (docs/benchmarks.md)."""
    panels = list(dict.fromkeys((trace.xaxis or "x", trace.yaxis or "y") for trace in fig.data))
    fig.update_layout(shapes=[{"type": "line", "x0": float(value), "x1": float(value), "xref": x, "y0": 0, "y1": 1,
                               "yref": f"{y} domain", "line": {"color": colors[model], "dash": "dot"}, "opacity": 0.8}
                              for model, value in trained.dropna().items() for x, y in panels])


def accuracy_vs_depth(points: pd.DataFrame, colors: Mapping[str, str] | None = None) -> go.Figure:
    """Depth extrapolation: pass@1 against the loop count r, one panel per task group, the trained T dotted.

    `points` are `dashboards.data.depth_points` rows. Beyond T the model runs loops it never trained on;
    panels per group keep a knowledge drop from hiding inside the suite mean.
    """
    title = _with_set("Depth extrapolation: accuracy against loops r (dotted: trained T)", points)
    if points.empty:
        return _empty(title, "no evaluated runs in this evaluation set yet")
    palette = _colors_of(points["model"], colors)
    points = _plain_frame(points)
    groups = ["all", *sorted(g for g in points["group"].unique() if g != "all")]
    fig = px.line(points, x="loops", y="accuracy", color="model", facet_col="group", markers=True,
                  category_orders={"group": groups, "model": sorted(points["model"].unique())},
                  color_discrete_map=palette,
                  labels={"loops": "loops (r)", "accuracy": "pass@1"}, hover_data=["runs", "seeds", "trained_loops"])
    fig.for_each_trace(lambda trace: trace.update(marker_symbol=[loops_symbol(r) for r in trace.x]))
    _mark_trained_loops(fig, points.groupby("model")["trained_loops"].max(), palette)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))  # "group=knowledge" -> "knowledge"
    fig.update_yaxes(range=[-0.05, 1.05])
    fig.update_layout(title=title, margin={"t": 100})  # room for the set line above the panel titles
    pooled = _pooled_note(points)
    return _add_footnote(fig, pooled[0]) if pooled else fig


PROBE_LABELS = {"angular_distance": "angular distance / pi", "relative_update": "relative update norm",
                "state_variance": "normalised state variance", "interaction": "interaction (by lag k)"}


def loop_probes(values: pd.DataFrame, title: str, colors: Mapping[str, str] | None = None) -> go.Figure:
    """`loopeval probe` values of one run against the loop index l, one panel per metric, the trained T dotted.

    `values` are `db.queries.probe_values` rows of one run; interaction has one line per lag k (the loop
    skipped is l - k). Loops right of the dotted line run beyond the depth the model was trained to.
    """
    title = plain(title)
    if values.empty:
        return _empty(title, f"no probe runs yet: {PROBE_EXAMPLE} (or loopeval probe MODEL, any model) measures one")
    palette = _colors_of(values["model"], colors)
    values = _plain_frame(values)
    values = values.assign(panel=values["metric"].map(lambda m: PROBE_LABELS.get(m, plain(m))),
                           series=[f"lag {int(k)}" if pd.notna(k) else "per loop" for k in values["lag"]])
    # The model's colour, as in every figure; the interaction's lags told apart by their dash.
    fig = px.line(values, x="loop", y="value", color="model", line_dash="series", facet_col="panel", facet_col_wrap=2,
                  markers=True, color_discrete_map=palette,
                  category_orders={"panel": [p for p in PROBE_LABELS.values() if p in set(values["panel"])]},
                  labels={"loop": "loop l", "value": ""}, hover_data=["model", "lag"])
    _mark_trained_loops(fig, values.groupby("model")["trained_loops"].max(), palette)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_yaxes(matches=None, showticklabels=True, rangemode="tozero")
    return fig.update_layout(title=f"{title} (dotted: trained T)", legend_title_text="")


def memory_over_run(series: pd.DataFrame, measures: Sequence[str], title: str = "Memory over a run") -> go.Figure:
    """Each measure of the sampler against time (left) and against generated tokens (right), one line per measure.

    `title` may name stored strings (the run's model): it is shown as plain text.
    """
    title = plain(title)
    if series.empty:
        return _empty(title, "this run has no memory samples")
    present = [m for m in measures if m in series and series[m].notna().any()]
    missing = [m for m in measures if m not in present]
    if not present:
        return _empty(title, f"every measure unavailable: {', '.join(missing)}")
    unit, scale = byte_unit(np.concatenate([series[m].to_numpy(dtype=float) for m in present]))
    traces = []
    for index, measure in enumerate(present):
        color = _MEASURE_PALETTE[index % len(_MEASURE_PALETTE)]
        rows = series[series[measure].notna()]
        y = (rows[measure] / scale).to_numpy()
        for axis, x, x_label in (("", "t", "s"), ("2", "generated_tokens", "tokens")):
            traces.append({
                "type": "scatter", "x": rows[x].to_numpy(), "y": y, "mode": "lines", "name": measure, "legendgroup": measure,
                "showlegend": axis == "", "line": {"color": color}, "xaxis": f"x{axis}", "yaxis": f"y{axis}",
                "hovertemplate": f"{measure}<br>%{{x}} {x_label}<br>%{{y:.3f}} {unit}<extra></extra>",
            })
    # Log scale: on a CPU the process RSS is ~1000x the KV cache, and both must stay readable.
    layout = _side_by_side(("against time", "against generated tokens"), {"title": {"text": "time since start (s)"}},
                           {"title": {"text": "generated tokens"}},
                           {"title": {"text": unit_title("memory", unit, scale) + ", log scale"}, "type": "log"})
    notes = [DECIMAL_NOTE] + ([f"unavailable: {', '.join(missing)}"] if missing else [])
    note, margin = _footnote(" · ".join(notes))
    layout["annotations"].append(note)
    return go.Figure(data=traces, layout=layout | {"title": {"text": title}, "legend": {"title": {"text": "measure"}},
                                                   "margin": margin})


def _side_by_side(titles: tuple[str, str], xaxis: dict, xaxis2: dict, yaxis: dict) -> dict[str, Any]:
    """Two panels side by side sharing their y axis (the right one's labels hidden), a title above each, as
    `make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06, subplot_titles=titles)` lays them
    out (traces of the right panel name `xaxis="x2", yaxis="y2"`); `yaxis` is both panels'. Written out so the
    figure is given whole (see the module's docstring)."""
    left, right = [0.0, 0.47], [0.53, 1.0]
    above = [{"text": text, "x": (lo + hi) / 2, "y": 1.0, "xref": "paper", "yref": "paper", "xanchor": "center",
              "yanchor": "bottom", "showarrow": False, "font": {"size": 16}} for text, (lo, hi) in zip(titles, (left, right))]
    return {"xaxis": {"anchor": "y", "domain": left, **xaxis}, "xaxis2": {"anchor": "y2", "domain": right, **xaxis2},
            "yaxis": {"anchor": "x", "domain": [0.0, 1.0], **yaxis},
            "yaxis2": {"anchor": "x2", "domain": [0.0, 1.0], "matches": "y", "showticklabels": False,
                       **{k: v for k, v in yaxis.items() if k != "title"}},
            "annotations": above}


# The profile figure's keys: a line style per analytic term, a marker per measured measure (grey, in the legend only).
_ANALYTIC_DASH = {"analytic KV": "dot", "analytic weights + KV": "dash"}
_MEASURE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star")


def memory_vs_context(profile: pd.DataFrame, measures: Sequence[str],
                      colors: Mapping[str, str] | None = None) -> go.Figure:
    """`loopeval profile` points: measured memory (markers) beside the analytic lines, against context length.

    A legend entry per (model, r, batch) in the model's colour, toggling its lines and markers, then one key of the
    line styles and marker shapes: a legend that stays a few lines long however many measures each run has."""
    title = "Memory against context length (loopeval profile)"
    if profile.empty:
        return _empty(title, f"no profile runs yet: {PROFILE_EXAMPLE} measures some")
    palette = _colors_of(profile["model"], colors)
    profile = _plain_frame(profile)
    present = [m for m in measures if m in profile and profile[m].notna().any()]
    missing = [m for m in measures if m not in present]
    analytic = profile["kv_bytes_analytic"]
    totals = profile["weights_bytes"] + analytic
    unit, scale = byte_unit(np.concatenate([profile[m].to_numpy(dtype=float) for m in present]
                                           + [analytic.to_numpy(dtype=float), totals.to_numpy(dtype=float)]))
    symbols = dict(zip(present, _MEASURE_SYMBOLS))
    traces = []
    for (model, loops, batch), rows in profile.groupby(["model", "loops", "batch"], dropna=False, sort=True):
        name, rows, color = f"{model} {loops_label(loops)} b={batch}", rows.sort_values("context_tokens"), palette[model]
        traces.append(_legend_key(name, name, None, {"color": color, "size": 10, "symbol": "circle"}))
        lines = {"analytic KV": rows["kv_bytes_analytic"], "analytic weights + KV": rows["weights_bytes"] + rows["kv_bytes_analytic"]}
        for kind, values in lines.items():
            if values.notna().any():
                traces.append(_profile_trace(name, kind, rows["context_tokens"], values / scale, unit,
                                             {"mode": "lines", "line": {"color": color, "dash": _ANALYTIC_DASH[kind]}}))
        for measure, symbol in symbols.items():
            measured = rows[rows[measure].notna()]
            if not measured.empty:
                traces.append(_profile_trace(name, measure, measured["context_tokens"], measured[measure] / scale, unit,
                                             {"mode": "markers", "marker": {"color": color, "symbol": symbol, "size": 9}}))
    for index, (kind, dash) in enumerate(_ANALYTIC_DASH.items()):  # the key: line styles, then marker shapes
        traces.append({"type": "scatter", "x": [None], "y": [None], "mode": "lines", "name": kind, "legendgroup": "key",
                       "line": {"color": "#777", "dash": dash}, "hoverinfo": "skip"}
                      | ({"legendgrouptitle": {"text": "key"}} if index == 0 else {}))
    traces += [_legend_key(measure, "key", None, {"color": "#777", "size": 9, "symbol": symbol})
               for measure, symbol in symbols.items()]
    notes = [DECIMAL_NOTE] + ([f"unavailable: {', '.join(missing)}"] if missing else [])
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(data=traces, layout={
        "title": {"text": title}, "legend": {"title": {"text": "markers: measured · lines: analytic"}, "tracegroupgap": 2},
        "xaxis": {"type": "log", "title": {"text": "context length (tokens)"}},
        "yaxis": {"type": "log", "title": {"text": unit_title("memory", unit, scale) + ", log scale"}},
        "annotations": [note], "margin": margin,
    })


def _profile_trace(name: str, what: str, x: pd.Series, y: pd.Series, unit: str, style: dict[str, Any]) -> dict[str, Any]:
    """One analytic line or one measure's markers of a profiled (model, r, batch): in its legend group, not its entry."""
    return {"type": "scatter", "x": x.to_numpy(), "y": y.to_numpy(), "name": f"{name} · {what}", "legendgroup": name,
            "showlegend": False, "hovertemplate": f"{name}<br>{what}<br>%{{x}} tokens<br>%{{y:.3f}} {unit}<extra></extra>",
            **style}


# The memory levers: a marker shape per KV policy, filled in the model's dtype and hollow when quantized.
KV_MARKERS = {"per-loop": "circle", "shared-last": "square", "shared-mean": "diamond", "shared-ema": "triangle-up",
              "latest-m4": "pentagon", "gated": "star", "standard": "hexagon"}
KV_FILL = {"auto": "", "int8": "-open", "fp8": "-open-dot"}
LEVERS_EXAMPLE = "loopeval run --model zoo:ouro-tiny --loops 4 --kv-policy per-loop,shared-last --kv-dtype auto,int8"
LEVER_MEASURE = "kv_bytes_allocated"


def _kv_setting(config: str, described: Any) -> tuple[str, str]:
    """A point's (KV policy, KV dtype): as swept (its configuration), else as its adapter described itself."""
    swept, described = config_fields(config), described if isinstance(described, dict) else {}
    return (str(swept.get("kv_policy") or described.get("kv_policy") or "?"),
            str(swept.get("kv_dtype") or described.get("kv_dtype") or "auto"))


def lever_points(points: pd.DataFrame) -> pd.DataFrame:
    """The points the memory-levers figure compares, with their `kv_policy` and `kv_dtype`: those a sweep set a KV
    policy or dtype on (`db.sets.KV_AXIS`), and, as the reference each lever saves against, the same model's point at
    that r without any setting (its own policy in its own dtype) where no swept point is that already. Off the exit
    axis only: an exit changes accuracy too, so it would not compare like with like."""
    frame = points[points["exit_threshold"].isna()] if not points.empty else points
    swept = frame["config"].map(lambda key: bool(set(config_fields(key)) & set(KV_AXIS))) if not frame.empty else None
    if swept is None or not swept.any():
        return frame.iloc[0:0].assign(kv_policy=[], kv_dtype=[])
    levers = set(zip(frame.loc[swept, "model"], frame.loc[swept, "loops"]))
    keep = np.array([(model, loops) in levers and (on or config == "")
                     for model, loops, on, config in zip(frame["model"], frame["loops"], swept, frame["config"])])
    frame, swept = frame[keep], swept[keep]
    settings = [_kv_setting(c, d) for c, d in zip(frame["config"], frame.get("model_config", [None] * len(frame)))]
    frame = frame.assign(kv_policy=[p for p, _ in settings], kv_dtype=[d for _, d in settings], swept=swept)
    frame = frame.sort_values("swept", ascending=False, kind="stable")  # a swept point stands for its setting
    return frame.drop_duplicates(["model", "loops", "kv_policy", "kv_dtype"]).drop(columns="swept").sort_index()


def memory_levers(points: pd.DataFrame, task: str = "all", colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against the KV cache each memory lever leaves (`lever_points`): colour the model, shape the KV policy,
    filled in the model's dtype and hollow in int8 (dotted in fp8). What the figure asks: does a training-free policy
    (shared-last, shared-mean) reach the memory of MELT's trained gate at the accuracy of Ouro's per-loop KV, and what
    does int8 cost on top? The memory is each point's measured KV peak (`kv_bytes_allocated`), from zero."""
    title = _with_set(f"Memory levers: accuracy against KV cache, {plain(task)}", points)
    frame = _plain_frame(lever_points(points))
    frame = frame[frame[LEVER_MEASURE].notna()] if LEVER_MEASURE in frame else frame.iloc[0:0]
    if frame.empty:
        return _empty(title, "nothing to compare here: this set runs no KV policy or dtype. "
                             f"Sweep them with {LEVERS_EXAMPLE}")
    unit, scale = byte_unit(frame[LEVER_MEASURE])
    frame["memory"] = frame[LEVER_MEASURE] / scale
    frame["stderr"] = frame["stderr"].astype(float)
    frame["symbol"] = [KV_MARKERS.get(policy.partition(":")[0], "x") + KV_FILL.get(dtype, "")
                       for policy, dtype in zip(frame["kv_policy"], frame["kv_dtype"])]
    frame["runs"] = _runs_text(frame)
    frame["r"] = [loops_label(loops) for loops in frame["loops"]]
    hover = (f"%{{customdata[0]}} %{{customdata[1]}}<br>KV policy %{{customdata[2]}}, KV dtype %{{customdata[3]}}"
             f"<br>accuracy %{{y:.3f}}<br>KV %{{x:.4g}} {unit}<br>%{{customdata[4]}}<extra></extra>")
    palette, traces = _colors_of(frame["model"], colors), []
    for index, (model, rows) in enumerate(frame.groupby("model", sort=True)):
        color, group = palette[model], f"model {index}"
        traces.append(_legend_key(model, group, "model" if index == 0 else None, {"color": color, "size": 10, "symbol": "circle"}))
        traces.append({
            "type": "scatter", "x": rows["memory"].to_numpy(), "y": rows["accuracy"].to_numpy(), "mode": "markers",
            "error_y": {"type": "data", "array": rows["stderr"].to_numpy()}, "name": model, "legendgroup": group,
            "showlegend": False, "marker": {"color": color, "size": 13, "symbol": rows["symbol"].tolist(), "line": {"width": 2}},
            "customdata": rows[["model", "r", "kv_policy", "kv_dtype", "runs"]].to_numpy(), "hovertemplate": hover,
        })
    for index, policy in enumerate(dict.fromkeys(p.partition(":")[0] for p in frame["kv_policy"])):
        traces.append(_legend_key(policy, f"policy {policy}", "KV policy (shape)" if index == 0 else None,
                                  {"color": "#777", "size": 10, "symbol": KV_MARKERS.get(policy, "x")}))
    for index, dtype in enumerate(dict.fromkeys(frame["kv_dtype"])):
        traces.append(_legend_key(dtype, f"dtype {dtype}", "KV dtype (fill)" if index == 0 else None,
                                  {"color": "#777", "size": 10, "symbol": "circle" + KV_FILL.get(dtype, ""), "line": {"width": 2}}))
    top = max(1.0, float((frame["accuracy"] + frame["stderr"].fillna(0)).max()))
    notes = [f"KV: each point's measured KV cache peak ({BY_NAME[LEVER_MEASURE].label}); {DECIMAL_NOTE}",
             "a model's point without a KV setting is its own policy in its own dtype", *_pooled_note(frame)]
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(data=traces, layout={
        "title": {"text": title}, "legend": {"groupclick": "togglegroup", "tracegroupgap": 2},
        "xaxis": {"rangemode": "tozero", "title": {"text": unit_title("KV cache", unit, scale)}},
        "yaxis": {"range": [-0.05, top + 0.05], "title": {"text": f"accuracy ({frame['metric'].iloc[0]})"}},
        "annotations": [note], "margin": margin,
    })
