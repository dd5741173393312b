"""The figures of what accuracy costs besides the memory axis: compute (loops or seconds per token), energy, and
the KV cache each memory lever leaves.

Pure functions from a set's points to Plotly figures, as `dashboards.figures` (whose escaping, colours and notes
they share): the report and the app draw them from the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.claims import MLPERF_RETAINED
from analysis.names import NOT_MEASURED, byte_unit, exit_label, loops_label, measure_label, point_label, series_name
from analysis.points import lever_points
from dashboards.figures import (
    DECIMAL_NOTE,
    _mark_trace,
    config_marks,
    configuration,
    mark_keys,
    _colors_of,
    _empty,
    _footnote,
    _legend_key,
    _measured,
    _plain_frame,
    _point_names,
    _pooled_note,
    _runs_text,
    _with_set,
    loops_symbol,
    plain,
    unit_title,
)
from measures import COMPUTE_BY_NAME, KB

# The compute axes of the accuracy-against-compute figures: `measures.COMPUTE_MEASURES` columns of `dashboards.data`.
COMPUTE_AXES: tuple[str, ...] = ("loops_per_token", "seconds_per_token")


def compute_varies(points: pd.DataFrame) -> bool:
    """Whether a set's points spread along the compute axis: an exit threshold swept, or a model run at several r."""
    if points.empty:
        return False
    return bool(points["exit_threshold"].notna().any() or points.groupby("model")["loops"].nunique().gt(1).any())


def _readable(label: str, unit: str) -> tuple[str, str, float]:
    """A compute axis in the unit its values read best in: seconds per token in milliseconds (a tiny model's token
    takes 0.002 s: "2 ms"), anything else as stored. (label, unit, factor from the stored value)."""
    if unit == "s":
        return label.replace("seconds", "milliseconds"), "ms", 1000.0
    return label, unit, 1.0


def accuracy_vs_compute(
    points: pd.DataFrame, axis: str, task: str = "all", colors: Mapping[str, str] | None = None
) -> go.Figure:
    """Accuracy against what a generated token cost (`axis`: mean loops per token, or generate seconds per token),
    one line per model (and r, where exit thresholds are swept) through its points in threshold order, then r.

    Where a lower exit threshold saves loops without losing accuracy, the line runs left level; the hover names
    each point's threshold. Drawn only where the set varies compute (`compute_varies`), else a note says how to.
    """
    measure = COMPUTE_BY_NAME[axis]
    label, unit, scale = _readable(measure.label, measure.unit)
    title = _with_set(f"Accuracy against {label}: {plain(task)}", points)
    if not compute_varies(points) or points[axis].isna().all():
        return _empty(
            title,
            "nothing to compare here: this set varies neither the exit threshold nor the loops. "
            "Sweep them with `loopeval run --exit-threshold 0.5,0.8,1.0` or `--loops 1,2,4`.",
        )
    palette = _colors_of(points["model"], colors)
    frame = _exit_lines(_plain_frame(points[points[axis].notna()]))
    frame["runs"] = _runs_text(frame)
    frame["named"] = [
        series_name(model, None, None, config)
        for model, config in zip(frame["model"], frame.get("config_label", [""] * len(frame)))
    ]
    frame = frame.sort_values(["line", "exit_threshold", "loops"], na_position="last")
    x_title = f"{label} ({unit})"
    hover = (
        f"model=%{{customdata[0]}}<br>{x_title}=%{{x}}<br>accuracy=%{{y}}<br>exit threshold=%{{customdata[1]}}"
        "<br>r=%{customdata[2]}<br>runs=%{customdata[3]}<extra></extra>"
    )
    traces, named = [], set()
    for (model, _), rows in frame.groupby(["model", "line"], sort=False):  # lines in the order they were sorted
        traces.append(
            {
                "type": "scatter",
                "x": rows[axis].to_numpy() * scale,
                "y": rows["accuracy"].to_numpy(),
                "error_y": {"array": rows["stderr"].to_numpy(dtype=float)},
                "mode": "lines+markers",
                "name": model,
                "legendgroup": model,
                "showlegend": model not in named,
                "line": {"color": palette[model]},
                "marker": {"symbol": rows["loops"].map(loops_symbol).tolist(), "size": 9},
                "customdata": rows[["named", "exit", "loops", "runs"]].to_numpy(),
                "hovertemplate": hover,
            }
        )
        named.add(model)
    notes = [
        f"{label}: {'from the samples the runs stored' if axis == 'loops_per_token' else 'time inside generate, prefill included'}",
        *_pooled_note(points),
    ]
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "legend": {"title": {"text": "model (a line per r where exit thresholds vary)"}, "tracegroupgap": 0},
            "xaxis": {"title": {"text": x_title}},
            "yaxis": {"range": [-0.05, 1.05], "title": {"text": f"accuracy ({frame['metric'].iloc[0]})"}},
            "annotations": [note],
            "margin": {"t": 60, **margin},
        },
    )


def _exit_lines(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its `exit` label and `line`: a model's runs without a threshold make one line through its r; the
    runs of a swept threshold make a line per (model, r), which ends at the same model's run at that r without a
    threshold (its own exit policy, every loop for the tiny zoo), drawn on both lines. A threshold that keeps every
    loop (gate 1.0) decodes the same tokens as that run, so the default sweep does not run it twice."""
    frame = frame.assign(
        exit=[exit_label(t, c) for t, c in zip(frame["exit_threshold"], frame["exit_criterion"])]
    )  # escaped
    swept = frame["exit_threshold"].notna()
    at_r = " r=" + frame["loops"].astype(int).astype(str)
    config = frame.get("config_label", pd.Series("", index=frame.index))
    model = frame["model"] + np.where(
        config != "", " " + config, ""
    )  # a configuration's points make lines of their own
    frame["line"] = model + np.where(swept, at_r, "")
    ends = frame[~swept & (model + at_r).isin(frame.loc[swept, "line"])]
    return pd.concat([frame, ends.assign(line=(model + at_r)[ends.index])], ignore_index=True)


ENERGY_NOTE = "energy: NVML's counter over each run (the device's: other processes on it count too), one run's mean"


def accuracy_vs_energy(points: pd.DataFrame, task: str = "all", colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against the GPU energy one run of each point drew, its pass@1 per kJ in the hover: what accuracy a
    joule buys, beside what a gigabyte buys. Where no run had an energy counter (no NVML, a CPU) the figure says so
    and draws nothing, never a point at zero joules."""
    title = _with_set(f"Accuracy against GPU energy: {plain(task)}", points)
    shown, missing = _measured(points, "energy_joules")
    if shown.empty:
        return _empty(
            title,
            f"GPU energy: {NOT_MEASURED} for every run here; pass@1 per kJ needs a GPU's counter: run the job on an NVIDIA GPU (NVML) to fill it",
        )
    palette = _colors_of(points["model"], colors)
    shown = _plain_frame(shown).assign(kj=shown["energy_joules"] / KB)
    shown = shown.assign(
        r=[point_label(row) for row in shown.itertuples()],
        runs=_runs_text(shown),
        per_kj=[f"{a / kj:.3g}" for a, kj in zip(shown["accuracy"], shown["kj"])],
    )
    hover = (
        "model %{customdata[0]}<br>%{customdata[1]}<br>accuracy %{y:.3f}<br>%{x:.3g} kJ a run"
        "<br>%{customdata[2]} pass@1 per kJ<br>%{customdata[3]}<extra></extra>"
    )
    traces = [
        {
            "type": "scatter",
            "x": rows["kj"].to_numpy(),
            "y": rows["accuracy"].to_numpy(),
            "mode": "markers",
            "error_y": {"type": "data", "array": rows["stderr"].to_numpy(dtype=float)},
            "name": model,
            "marker": {"color": palette[model], "size": 12, "symbol": rows["loops"].map(loops_symbol).tolist()},
            "customdata": rows[["model", "r", "per_kj", "runs"]].to_numpy(),
            "hovertemplate": hover,
        }
        for model, rows in shown.groupby("model", sort=True)
    ]
    notes = [ENERGY_NOTE, *_pooled_note(shown)] + (
        [f"{NOT_MEASURED}: {_point_names(missing)}"] if not missing.empty else []
    )
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "legend": {"title": {"text": "model (shape: r)"}},
            "xaxis": {"rangemode": "tozero", "title": {"text": "GPU energy of a run (kJ)"}},
            "yaxis": {"range": [-0.05, 1.05], "title": {"text": f"accuracy ({shown['metric'].iloc[0]})"}},
            "annotations": [note],
            "margin": margin,
        },
    )


def _mlperf_lines(
    frame: pd.DataFrame, palette: Mapping[str, str], axes: list[str]
) -> list[tuple[dict[str, Any], dict[str, list[Any]]]]:
    """Per model with its own point (no configuration) among `frame`: a dashed line at 99% of its accuracy (MLPerf's
    bar for an optimisation, `analysis.claims.MLPERF_RETAINED`) across the figure, and 'holds 99%' over each of its
    levers at or above it; each trace with its x on each of the figure's axes."""
    drawn: list[tuple[dict[str, Any], dict[str, list[Any]]]] = []
    for model, rows in frame.groupby("model", sort=True):
        own = rows[rows["configuration"] == ""]
        if own.empty:
            continue
        bar = MLPERF_RETAINED * float(own["accuracy"].iloc[0])
        line = {"color": palette[model], "dash": "dash", "width": 1}
        drawn.append(
            ({"type": "scatter", "mode": "lines", "y": [bar, bar], "line": line, "name": f"99% of {model}",
              "showlegend": False, "hoverinfo": "name"}, {name: [0, float(frame[name].max())] for name in axes})
        )  # fmt: skip
        held = rows[(rows["configuration"] != "") & (rows["accuracy"] >= bar)]
        drawn.append(
            ({"type": "scatter", "mode": "text", "y": held["accuracy"].to_numpy(), "text": ["holds 99%"] * len(held),
              "textposition": "top center", "showlegend": False, "hoverinfo": "skip"},
             {name: held[name].tolist() for name in axes})
        )  # fmt: skip
    return drawn


LEVERS_EXAMPLE = "loopeval run --model zoo:ouro-tiny --loops 4 --kv-policy per-loop,shared-last --kv-dtype auto,int8"
# The levers figure's x axes, the first drawn when it opens (its menu switches): what the model holds, then KV alone.
LEVER_AXES = {"weights + KV": "weights_bytes + kv_bytes_allocated", "KV alone": "kv_bytes_allocated"}
LEVER_MEASURE = "kv_bytes_allocated"  # the measure every drawn lever point has


def memory_levers(points: pd.DataFrame, task: str = "all", colors: Mapping[str, str] | None = None) -> go.Figure:
    """Accuracy against the memory each lever leaves (`lever_points`): colour the model, shape its loop count r as in
    every figure, and a black mark the lever (`config_marks`: KV policy and dtype), a thin line from the model's own
    point (its policy in its dtype) to each of its levers. What the figure asks: does a training-free policy
    (shared-last, shared-mean) reach the memory of MELT's trained gate at the accuracy of Ouro's per-loop KV, and what
    does int8 cost on top? The x axis is what the model holds (weights + KV cache peak) and, from its menu, the KV
    peak alone (`LEVER_AXES`); each point at its measured value, from zero."""
    title = _with_set(f"Memory levers: accuracy against memory, {plain(task)}", points)
    marks = config_marks(_plain_frame(points))  # the same marks as the accuracy figure's, of the escaped labels
    frame = _plain_frame(lever_points(points))
    frame = frame[frame[LEVER_MEASURE].notna()] if LEVER_MEASURE in frame else frame.iloc[0:0]
    if frame.empty:
        return _empty(
            title, f"nothing to compare here: this set runs no KV policy or dtype. Sweep them with {LEVERS_EXAMPLE}"
        )
    axes = {name: measure for name, measure in LEVER_AXES.items() if measure in frame and frame[measure].notna().all()}
    scaled = {name: byte_unit(frame[measure]) for name, measure in axes.items()}
    for name, measure in axes.items():
        frame[name] = frame[measure] / scaled[name][1]
    frame["stderr"] = frame["stderr"].astype(float)
    frame["configuration"] = [configuration(row) for row in frame.itertuples()]
    frame["runs"] = _runs_text(frame)
    frame["r"] = [loops_label(loops) for loops in frame["loops"]]
    frame["held"] = [
        ", ".join(f"{name} {row[name]:.4g} {scaled[name][0]}" for name in axes) for _, row in frame.iterrows()
    ]
    hover = (
        "%{customdata[0]} %{customdata[1]}<br>KV policy %{customdata[2]}, KV dtype %{customdata[3]}"
        "<br>accuracy %{y:.3f}<br>%{customdata[5]}<br>%{customdata[4]}<extra></extra>"
    )
    palette = _colors_of(frame["model"], colors)
    traces: list[dict[str, Any]] = []
    xs: list[dict[str, list[Any]]] = []  # each trace's x on each axis of the menu, in the order of `traces`
    for index, (model, rows) in enumerate(frame.groupby("model", sort=True)):
        color, group = palette[model], f"model {index}"
        traces.append(
            _legend_key(model, group, "model" if index == 0 else None, {"color": color, "size": 10, "symbol": "circle"})
        )
        xs.append(dict.fromkeys(axes, [None]))
        spokes = _spokes(rows, list(axes))
        if spokes is not None:
            traces.append(
                {"type": "scatter", "y": spokes["accuracy"], "mode": "lines", "name": f"{model} levers",
                 "legendgroup": group, "showlegend": False, "line": {"color": color, "width": 1},
                 "hoverinfo": "skip"}
            )  # fmt: skip
            xs.append({name: spokes[name] for name in axes})
        traces.append(
            {
                "type": "scatter",
                "y": rows["accuracy"].to_numpy(),
                "mode": "markers",
                "error_y": {"type": "data", "array": rows["stderr"].to_numpy()},
                "name": model,
                "legendgroup": group,
                "showlegend": False,
                "marker": {"color": color, "size": 13, "symbol": rows["loops"].map(loops_symbol).tolist()},
                "customdata": rows[["model", "r", "kv_policy", "kv_dtype", "runs", "held"]].to_numpy(),
                "hovertemplate": hover,
            }
        )
        xs.append({name: rows[name].tolist() for name in axes})
        for mark in _mark_trace(rows, next(iter(axes)), marks, group):
            traces.append(mark)
            xs.append({name: rows.loc[rows["configuration"] != "", name].tolist() for name in axes})
    for index, loops in enumerate(sorted(frame["loops"].unique())):
        traces.append(
            _legend_key(
                loops_label(loops),
                f"loops {loops}",
                "loops (shape)" if index == 0 else None,
                {"color": "#777", "size": 10, "symbol": loops_symbol(loops)},
            )
        )
        xs.append(dict.fromkeys(axes, [None]))
    for key in mark_keys(marks, frame["configuration"]):
        traces.append(key)
        xs.append(dict.fromkeys(axes, [None]))
    for trace, x in _mlperf_lines(frame, palette, list(axes)):
        traces.append(trace)
        xs.append(x)
    first = next(iter(axes))
    for trace, x in zip(traces, xs):
        trace["x"] = x[first]
    titles = {name: unit_title(measure_label(measure), *scaled[name]) for name, measure in axes.items()}
    top = max(1.0, float((frame["accuracy"] + frame["stderr"].fillna(0)).max()))
    notes = [
        f"each point at its measured memory; {DECIMAL_NOTE}",
        "a line joins a model's own point (its policy in its dtype, no mark) to each of its levers; dashed: MLPerf's "
        "99% of it, 'holds 99%' marks the levers at or above (paired intervals: `loopeval compare`)",
        *_pooled_note(frame),
    ]
    note, margin = _footnote(" · ".join(notes))
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "legend": {"groupclick": "togglegroup", "tracegroupgap": 2},
            "xaxis": {"rangemode": "tozero", "title": {"text": titles[first]}},
            "yaxis": {"range": [-0.05, top + 0.05], "title": {"text": f"accuracy ({frame['metric'].iloc[0]})"}},
            "annotations": [note],
            "margin": margin,
            "updatemenus": [_axis_menu(titles, xs)] if len(axes) > 1 else [],
        },
    )


def _spokes(rows: pd.DataFrame, axes: list[str]) -> dict[str, list[float | None]] | None:
    """A model's lines from its own point to each of its levers, as one trace's coordinates per x axis, the segments
    apart by None; None where the model has one point. Its own point is its run without a setting (no configuration)
    or, where a sweep set its own policy too, its largest KV cache: the one the levers save against."""
    if len(rows) < 2:
        return None
    plain_run = rows["configuration"] == ""
    start = rows[plain_run].iloc[0] if plain_run.any() else rows.loc[rows[LEVER_MEASURE].idxmax()]
    levers = rows.drop(index=start.name)
    return {
        column: [value for _, lever in levers.iterrows() for value in (start[column], lever[column], None)]
        for column in [*axes, "accuracy"]
    }


def _axis_menu(titles: Mapping[str, str], xs: list[dict[str, list]]) -> dict[str, Any]:
    """The levers figure's menu: one button per x axis, each setting every trace's x and the axis title."""
    return {
        "type": "dropdown",
        "direction": "down",
        "x": 1.0,
        "xanchor": "right",
        "y": 1.1,
        "yanchor": "bottom",
        "showactive": True,
        "buttons": [
            {
                "label": f"x: {name}",
                "method": "update",
                "args": [{"x": [x[name] for x in xs]}, {"xaxis.title.text": title}],
            }
            for name, title in titles.items()
        ],
    }
