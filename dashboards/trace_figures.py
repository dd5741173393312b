"""The figures of loops and of memory over time and context: depth extrapolation (a set's accuracy against r per task
group), the loop probes of one run, memory over one run, and memory against context length (`loopeval profile`).

Pure functions from query DataFrames to Plotly figures, as `dashboards.figures` (whose notes, colours and escaping they
share): the faceted ones (depth, probes) keep Plotly Express, which lays out their panels; the others are given whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from analysis.names import PROFILE_EXAMPLE, byte_unit, loops_label
from measures import BY_NAME
from dashboards.figures import (
    DECIMAL_NOTE,
    _add_footnote,
    _colors_of,
    _empty,
    _footnote,
    _legend_key,
    _MEASURE_PALETTE,
    _plain_frame,
    _pooled_note,
    _with_set,
    loops_symbol,
    plain,
    unit_title,
)

PROBE_EXAMPLE = "loopeval probe zoo:ouro-tiny"  # what the empty probe figure suggests: a shipped looped model


def _mark_trained_loops(fig: go.Figure, trained: pd.Series, colors: dict[str, str]) -> None:
    """A dotted vertical line at each model's trained T, in the model's colour, on every panel with data: the lines
    `add_vline(row="all", col="all")` draws, given at once: drawn by it, they were slow (docs/benchmarks.md)."""
    panels = list(dict.fromkeys((trace.xaxis or "x", trace.yaxis or "y") for trace in fig.data))
    fig.update_layout(
        shapes=[
            {
                "type": "line",
                "x0": float(value),
                "x1": float(value),
                "xref": x,
                "y0": 0,
                "y1": 1,
                "yref": f"{y} domain",
                "line": {"color": colors[model], "dash": "dot"},
                "opacity": 0.8,
            }
            for model, value in trained.dropna().items()
            for x, y in panels
        ]
    )


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
    fig = px.line(
        points,
        x="loops",
        y="accuracy",
        color="model",
        facet_col="group",
        markers=True,
        category_orders={"group": groups, "model": sorted(points["model"].unique())},
        color_discrete_map=palette,
        labels={"loops": "loops (r)", "accuracy": "pass@1"},
        hover_data=["runs", "seeds", "trained_loops"],
    )
    fig.for_each_trace(lambda trace: trace.update(marker_symbol=[loops_symbol(r) for r in trace.x]))
    _mark_trained_loops(fig, points.groupby("model")["trained_loops"].max(), palette)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))  # "group=knowledge" -> "knowledge"
    fig.update_yaxes(range=[-0.05, 1.05])
    fig.update_layout(title=title, margin={"t": 100})  # room for the set line above the panel titles
    pooled = _pooled_note(points)
    return _add_footnote(fig, pooled[0]) if pooled else fig


PROBE_LABELS = {
    "angular_distance": "angular distance / pi",
    "relative_update": "relative update norm",
    "state_variance": "normalised state variance",
    "interaction": "interaction (by lag k)",
}


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
    values = values.assign(
        panel=values["metric"].map(lambda m: PROBE_LABELS.get(m, plain(m))),
        series=[f"lag {int(k)}" if pd.notna(k) else "per loop" for k in values["lag"]],
    )
    # The model's colour, as in every figure; the interaction's lags told apart by their dash.
    fig = px.line(
        values,
        x="loop",
        y="value",
        color="model",
        line_dash="series",
        facet_col="panel",
        facet_col_wrap=2,
        markers=True,
        color_discrete_map=palette,
        category_orders={"panel": [p for p in PROBE_LABELS.values() if p in set(values["panel"])]},
        labels={"loop": "loop l", "value": ""},
        hover_data=["model", "lag"],
    )
    _mark_trained_loops(fig, values.groupby("model")["trained_loops"].max(), palette)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_yaxes(matches=None, showticklabels=True, rangemode="tozero")
    return fig.update_layout(title=f"{title} (dotted: trained T)", legend_title_text="")


def reading_label(measure: str) -> str:
    """A sampler reading as the legend names it: its measure's label without "peak" (a line over a run is every
    reading, not the peak), e.g. "KV cache used", "process RSS (CPU)"; the stored name where no label is known."""
    known = BY_NAME.get(measure)
    return measure if known is None else known.label.replace(" peak", "")


def memory_over_run(series: pd.DataFrame, measures: Sequence[str], title: str = "Memory over a run") -> go.Figure:
    """Each measure of the sampler against time (left) and against generated tokens (right), one line per measure.

    `title` may name stored strings (the run's model): it is shown as plain text.
    """
    title = plain(title)
    if series.empty:
        return _empty(title, "this run has no memory samples")
    present = [m for m in measures if m in series and series[m].notna().any()]
    missing = [reading_label(m) for m in measures if m not in present]
    if not present:
        return _empty(title, f"every measure unavailable: {', '.join(missing)}")
    unit, scale = byte_unit(np.concatenate([series[m].to_numpy(dtype=float) for m in present]))
    traces = []
    for index, measure in enumerate(present):
        color = _MEASURE_PALETTE[index % len(_MEASURE_PALETTE)]
        rows = series[series[measure].notna()]
        y = (rows[measure] / scale).to_numpy()
        for axis, x, x_label in (("", "t", "s"), ("2", "generated_tokens", "tokens")):
            traces.append(
                {
                    "type": "scatter",
                    "x": rows[x].to_numpy(),
                    "y": y,
                    "mode": "lines",
                    "name": reading_label(measure),
                    "legendgroup": measure,
                    "showlegend": axis == "",
                    "line": {"color": color},
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "hovertemplate": f"{reading_label(measure)}<br>%{{x}} {x_label}<br>%{{y:.3f}} {unit}<extra></extra>",
                }
            )
    # Log scale: on a CPU the process RSS is ~1000x the KV cache, and both must stay readable.
    layout = _side_by_side(
        ("against time", "against generated tokens"),
        {"title": {"text": "time since start (s)"}},
        {"title": {"text": "generated tokens"}},
        {"title": {"text": unit_title("memory", unit, scale) + ", log scale"}, "type": "log"},
    )
    notes = [DECIMAL_NOTE] + ([f"unavailable: {', '.join(missing)}"] if missing else [])
    note, margin = _footnote(" · ".join(notes))
    layout["annotations"].append(note)
    return go.Figure(
        data=traces,
        layout=layout | {"title": {"text": title}, "legend": {"title": {"text": "measure"}}, "margin": margin},
    )


def _side_by_side(
    titles: tuple[str, str], xaxis: dict[str, Any], xaxis2: dict[str, Any], yaxis: dict[str, Any]
) -> dict[str, Any]:
    """Two panels side by side sharing their y axis (the right one's labels hidden), a title above each, as
    `make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06, subplot_titles=titles)` lays them
    out (traces of the right panel name `xaxis="x2", yaxis="y2"`); `yaxis` is both panels'. Written out so the
    figure is given whole (see the module's docstring)."""
    left, right = [0.0, 0.47], [0.53, 1.0]
    above = [
        {
            "text": text,
            "x": (lo + hi) / 2,
            "y": 1.0,
            "xref": "paper",
            "yref": "paper",
            "xanchor": "center",
            "yanchor": "bottom",
            "showarrow": False,
            "font": {"size": 16},
        }
        for text, (lo, hi) in zip(titles, (left, right))
    ]
    return {
        "xaxis": {"anchor": "y", "domain": left, **xaxis},
        "xaxis2": {"anchor": "y2", "domain": right, **xaxis2},
        "yaxis": {"anchor": "x", "domain": [0.0, 1.0], **yaxis},
        "yaxis2": {
            "anchor": "x2",
            "domain": [0.0, 1.0],
            "matches": "y",
            "showticklabels": False,
            **{k: v for k, v in yaxis.items() if k != "title"},
        },
        "annotations": above,
    }


# The profile figure's keys: a line style per analytic term, a marker per measured measure (grey, in the legend only).
_ANALYTIC_DASH = {"analytic KV": "dot", "analytic weights + KV": "dash"}
_MEASURE_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "cross", "star")


def memory_vs_context(
    profile: pd.DataFrame, measures: Sequence[str], colors: Mapping[str, str] | None = None
) -> go.Figure:
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
    unit, scale = byte_unit(
        np.concatenate(
            [profile[m].to_numpy(dtype=float) for m in present]
            + [analytic.to_numpy(dtype=float), totals.to_numpy(dtype=float)]
        )
    )
    symbols = dict(zip(present, _MEASURE_SYMBOLS))
    traces = []
    for (model, loops, batch), rows in profile.groupby(["model", "loops", "batch"], dropna=False, sort=True):
        name, rows, color = (
            f"{model} {loops_label(loops)} b={batch}",
            rows.sort_values("context_tokens"),
            palette[model],
        )
        traces.append(_legend_key(name, name, None, {"color": color, "size": 10, "symbol": "circle"}))
        lines = {
            "analytic KV": rows["kv_bytes_analytic"],
            "analytic weights + KV": rows["weights_bytes"] + rows["kv_bytes_analytic"],
        }
        for kind, values in lines.items():
            if values.notna().any():
                traces.append(
                    _profile_trace(
                        name,
                        kind,
                        rows["context_tokens"],
                        values / scale,
                        unit,
                        {"mode": "lines", "line": {"color": color, "dash": _ANALYTIC_DASH[kind]}},
                    )
                )
        for measure, symbol in symbols.items():
            measured = rows[rows[measure].notna()]
            if not measured.empty:
                traces.append(
                    _profile_trace(
                        name,
                        measure,
                        measured["context_tokens"],
                        measured[measure] / scale,
                        unit,
                        {"mode": "markers", "marker": {"color": color, "symbol": symbol, "size": 9}},
                    )
                )
    for index, (kind, dash) in enumerate(_ANALYTIC_DASH.items()):  # the key: line styles, then marker shapes
        traces.append(
            {
                "type": "scatter",
                "x": [None],
                "y": [None],
                "mode": "lines",
                "name": kind,
                "legendgroup": "key",
                "line": {"color": "#777", "dash": dash},
                "hoverinfo": "skip",
            }
            | ({"legendgrouptitle": {"text": "key"}} if index == 0 else {})
        )
    traces += [
        _legend_key(measure, "key", None, {"color": "#777", "size": 9, "symbol": symbol})
        for measure, symbol in symbols.items()
    ]
    notes = [DECIMAL_NOTE] + ([f"unavailable: {', '.join(missing)}"] if missing else [])
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "legend": {"title": {"text": "markers: measured · lines: analytic"}, "tracegroupgap": 2},
            "xaxis": {"type": "log", "title": {"text": "context length (tokens)"}},
            "yaxis": {"type": "log", "title": {"text": unit_title("memory", unit, scale) + ", log scale"}},
            "annotations": [note],
            "margin": margin,
        },
    )


def _profile_trace(
    name: str, what: str, x: pd.Series, y: pd.Series, unit: str, style: dict[str, Any]
) -> dict[str, Any]:
    """One analytic line or one measure's markers of a profiled (model, r, batch): in its legend group, not its entry."""
    return {
        "type": "scatter",
        "x": x.to_numpy(),
        "y": y.to_numpy(),
        "name": f"{name} · {what}",
        "legendgroup": name,
        "showlegend": False,
        "hovertemplate": f"{name}<br>{what}<br>%{{x}} tokens<br>%{{y:.3f}} {unit}<extra></extra>",
        **style,
    }
