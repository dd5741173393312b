"""How points, loop counts, exits, configurations and memory measures read in words: the same in a table row, a
sentence, a hover and a legend.

Plain text: a figure escapes what it draws (`dashboards.figures.plain`), the report escapes the page's text, Dash and
the terminal show text as text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from db.sets import KV_AXIS, config_fields
from measures import ANALYTIC, BYTE_UNITS, GB, MEMORY_MEASURES, WEIGHTS_PLUS_KV

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
# What the empty profile figure and `loopeval results --profiles` suggest: a shipped model at lengths its 512-token
# context holds (with the decode steps).
PROFILE_EXAMPLE = "loopeval profile zoo:melt-tiny --lengths 64,256,448"
NOT_MEASURED = "not measured (no NVML)"  # energy where no counter was read: never 0


def byte_unit(values: Sequence[float] | pd.Series | np.ndarray) -> tuple[str, float]:
    """The largest decimal unit (GB, MB, KB, B) that keeps the biggest finite value at or above 1."""
    finite = [abs(float(v)) for v in values if v is not None and np.isfinite(v)]
    largest = max(finite, default=0.0)
    for unit, scale in BYTE_UNITS:
        if largest >= scale:
            return unit, scale
    return "GB", GB  # nothing to scale: label the axis in the unit people expect


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


def exit_label(threshold: float | None, criterion: str | None) -> str:
    """A run's point on the per-token exit axis as tables, hovers and legends name it: 'gate 0.5', 'kl 0.1';
    '-' off the axis (the model's own exit policy)."""
    if threshold is None or threshold != threshold:
        return "-"
    return f"{threshold:g}" if criterion is None or criterion != criterion else f"{criterion} {threshold:g}"


def loops_label(loops: Any) -> str:
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

    return [
        " ".join(label(name, config[name]) for name in sorted(config, key=order) if tells_apart(model, name))
        for model, config in zip(points["model"], fields)
    ]


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
    (`config_labels`, the `config_label` column): 'r=4', 'r=4 exit gate 0.5', 'r=4 dtype=bfloat16'."""
    threshold = getattr(row, "exit_threshold", None)
    swept = threshold is not None and threshold == threshold
    exit_at = f" exit {exit_label(threshold, row.exit_criterion)}" if swept else ""
    config = getattr(row, "config_label", "")
    return f"{loops_label(row.loops)}{exit_at}{f' {config}' if config else ''}"


def point_name(row: Any) -> str:
    """How a sentence names a point: 'zoo:ouro-tiny r=4 exit gate 0.9'."""
    return f"{row.model} {point_label(row)}"
