"""The claims' figures (pure, as every figure): each lever's retained accuracy against its reference with the paired
interval and MLPerf's 99% line, and pass@1 by generation length for the lever points and their references.

What they draw is `analysis.claims`'s: `retained` (a row per lever point, its comparison's numbers and sentence) and
`length_table` (a row per point and length bin).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from analysis.claims import MLPERF_RETAINED
from dashboards.figures import MESSAGE_WIDTH, _colors_of, _empty, _footnote, plain

LEVER_DASHES = ("dot", "dash", "dashdot", "longdash", "longdashdot")  # a lever's line, its reference's solid
HOLDS = "#2a9d4b"  # a lever at or above the 99% line
FAILS = "#c0392b"
CLAIMS_EXAMPLE = "loopeval run --model zoo:ouro-tiny --loops 4 --kv-policy shared-last --kv-dtype auto,int8 --samples 2"


def retained_accuracy(table: pd.DataFrame, set_label: str | None = None) -> go.Figure:
    """One row per lever point (`analysis.claims.retained`): its pass@1 as a share of its reference's on the same
    items, with the paired bootstrap 95% interval, against MLPerf's 99% line; green where the share holds it, red
    where not, the hover giving the comparison's sentence."""
    title = "Retained accuracy: each lever against its reference" + (
        f"<br><sup>{plain(set_label)}</sup>" if set_label else ""
    )
    frame = table[table["retained"].notna()] if not table.empty else table
    if frame.empty:
        return _empty(title, f"no lever point with its reference in this set. Sweep one with {CLAIMS_EXAMPLE}")
    frame = frame.iloc[::-1]  # the first lever on top
    names = [plain(f"{lever} ({axis})") for lever, axis in zip(frame["lever"], frame["axis"])]
    trace = {
        "type": "scatter",
        "mode": "markers",
        "x": frame["retained"].to_numpy(),
        "y": names,
        "error_x": {
            "type": "data",
            "symmetric": False,
            "array": (frame["retained_high"] - frame["retained"]).to_numpy(),
            "arrayminus": (frame["retained"] - frame["retained_low"]).to_numpy(),
        },
        "marker": {"size": 12, "color": [HOLDS if holds else FAILS for holds in frame["holds"]]},
        "customdata": np.array(
            [
                ["<br>".join(textwrap.wrap(plain(text), MESSAGE_WIDTH)), _share(lever), _share(reference)]
                for text, lever, reference in zip(frame["sentence"], frame["cut_lever"], frame["cut_reference"])
            ]
        ),
        "hovertemplate": "retained %{x:.3f}<br>%{customdata[0]}<br>cut off by the token budget: lever "
        "%{customdata[1]}, reference %{customdata[2]}<extra></extra>",
        "showlegend": False,
    }
    line = {"type": "line", "yref": "paper", "y0": 0, "y1": 1, "x0": MLPERF_RETAINED, "x1": MLPERF_RETAINED}
    note, margin = _footnote(
        "retained: the lever's pass@1 over its reference's (same model, r and items; the model's own KV, or fixed "
        "depth), bars the paired bootstrap 95% interval (`loopeval compare LEVER REFERENCE`). Dashed: MLPerf's 99% "
        "line; green holds it, red does not."
    )
    return go.Figure(
        data=[trace],
        layout={
            "title": {"text": title},
            "xaxis": {"title": {"text": "retained accuracy (lever / reference)"}, "rangemode": "tozero"},
            "yaxis": {"automargin": True},
            "shapes": [line | {"line": {"dash": "dash", "color": "#555"}}],
            "annotations": [
                note,
                {
                    "x": MLPERF_RETAINED,
                    "y": 1,
                    "xref": "x",
                    "yref": "paper",
                    "text": "99%",
                    "showarrow": False,
                    "yanchor": "bottom",
                },
            ],  # fmt: skip
            "margin": margin | {"l": 20},
        },
    )


def _share(value: float | None) -> str:
    return "n/a" if value is None or value != value else f"{value:.0%}"


def accuracy_by_length(
    table: pd.DataFrame, set_label: str | None = None, colors: Mapping[str, str] | None = None
) -> go.Figure:
    """pass@1 of the samples in each generated-length bin (`analysis.claims.length_table`), a line per lever point
    and per reference: a lever whose damage grows with length falls away from its reference at the right. The hover
    gives the samples in the bin and, for a lever, the share whose output left the reference's."""
    title = "Accuracy by generation length: the levers and their references" + (
        f"<br><sup>{plain(set_label)}</sup>" if set_label else ""
    )
    if table.empty:
        return _empty(title, f"no lever point with its reference in this set. Sweep one with {CLAIMS_EXAMPLE}")
    order = list(dict.fromkeys(table.sort_values("low")["bin"]))
    models = [name.split(" ")[0] for name in table["name"]]
    palette = _colors_of(models, colors)
    traces, dashes = [], iter(LEVER_DASHES * len(table))
    for name, rows in table.groupby("name", sort=False):
        rows = rows.set_index("bin").reindex([b for b in order if b in set(rows["bin"])])
        lever = rows["diverged"].notna().any()
        left = ["-" if d != d else f"{d:.0%}" for d in rows["diverged"]]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": list(rows.index),
                "y": rows["pass_at_1"].to_numpy(),
                "name": plain(name),
                "line": {"color": palette[plain(str(name).split(" ")[0])], "dash": next(dashes) if lever else "solid"},
                "customdata": np.array([[int(n), text] for n, text in zip(rows["samples"], left)], dtype=object),
                "hovertemplate": f"{plain(name)}<br>%{{x}} tokens: pass@1 %{{y:.3f}} over %{{customdata[0]}} samples"
                "<br>left the reference's output: %{customdata[1]}<extra></extra>",
            }
        )
    note, margin = _footnote(
        "each sample on its own, binned by the tokens it generated; solid: a reference (no lever), broken: a lever "
        "point, in its model's colour. `loopeval results --by-length` prints the same bins."
    )
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "xaxis": {"title": {"text": "generated tokens"}, "type": "category", "categoryorder": "array",
                      "categoryarray": order},
            "yaxis": {"title": {"text": "pass@1 of the samples"}, "range": [-0.05, 1.05]},
            "annotations": [note],
            "margin": margin,
        },
    )  # fmt: skip


def metrics_from_samples(
    table: pd.DataFrame, set_label: str | None = None, colors: Mapping[str, str] | None = None
) -> go.Figure:
    """Each point's pass@k for every k up to its n samples per problem, maj@n and avg@n (`analysis.claims.
    sample_metrics`): a line per point in its model's colour, the metrics along x; `loopeval results --metric`
    ranks by any of them."""
    title = "pass@k, maj@n and avg@n from the stored samples" + (
        f"<br><sup>{plain(set_label)}</sup>" if set_label else ""
    )
    if table.empty:
        return _empty(title, "no point of this set has stored samples")
    order = list(dict.fromkeys(sorted(table["metric"], key=_metric_order)))
    palette = _colors_of(table["model"], colors)
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": rows["metric"].tolist(),
            "y": rows["value"].to_numpy(),
            "error_y": {"type": "data", "array": (1.96 * rows["stderr"].astype(float)).to_numpy()},
            "name": plain(name),
            "line": {"color": palette[plain(model)]},
            "hovertemplate": f"{plain(name)}<br>%{{x}} %{{y:.3f}}<extra></extra>",
        }
        for (name, model), rows in table.groupby(["name", "model"], sort=False)
    ]
    note, margin = _footnote(
        "pass@k: Chen et al.'s unbiased estimator over each problem's n samples; maj@n: the answer most samples give "
        "(outputs compared stripped); avg@n: the mean score, the stored pass@1. Bars: 95% intervals."
    )
    return go.Figure(
        data=traces,
        layout={
            "title": {"text": title},
            "xaxis": {"type": "category", "categoryorder": "array", "categoryarray": order},
            "yaxis": {"title": {"text": "suite mean"}, "range": [-0.05, 1.05]},
            "annotations": [note],
            "margin": margin,
        },
    )


def _metric_order(metric: str) -> tuple[int, int]:
    """pass@1, pass@2, ..., then maj@n, then avg@n."""
    kind, _, k = metric.partition("@")
    return ("pass", "maj", "avg").index(kind), int(k)
