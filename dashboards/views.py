"""The dashboard views: every figure the report and the app show, each wired once to the query that feeds it.

A view is one section of both pages: its title, the selectors it reads, the query (`db.queries`,
`analysis.points`, `dashboards.data`) that feeds it and the figures (`dashboards.figures`, `trace_figures`, pure)
drawn from that data,
with what both pages must show alike: series thinning, titles, the selectors' choices and the runs
table's columns. `report.py` draws every view for every choice ahead into one offline page, and
`app.py` draws a view when its selectors change. Neither wires a query to a figure itself, so a view
added to `VIEWS` appears in both and the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from sqlalchemy import Engine

from analysis import claims
from analysis.answer import answer
from analysis.names import exit_label, loops_label, measure_label
from analysis.points import DEFAULT_CONTEXT_TOKENS, accuracy_points
from dashboards import claim_figures, cost_figures, figures, trace_figures
from dashboards.data import depth_points, probe_title, profile_points, set_choice
from db import queries
from db.headline import SUITE
import measures

MAX_SERIES_POINTS = 500  # per run: longer series are reduced to bucket maxima (peaks survive)


@dataclass(frozen=True)
class Selection:
    """What the selectors picked; each view reads the fields it needs.

    `models` and `loops` None keep every point: the report draws them all, while the app's checklists
    narrow them (an empty checklist keeps nothing, as the boxes show).
    """

    set_id: str | None = None
    task: str = SUITE
    measure: str | None = None
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    models: tuple[str, ...] | None = None
    loops: tuple[int, ...] | None = None
    run_id: int | None = None
    colors: tuple[tuple[str, str], ...] = ()  # the page's (model, colour) pairs (`palette`): no selector sets them

    @property
    def memory(self) -> str:
        """The memory measure the accuracy figures read: as picked, else the first selectable one (`measure` stays
        as picked: it keys the report's drawings)."""
        return self.measure or next(iter(measures.MEMORY_MEASURES))

    @property
    def palette(self) -> dict[str, str] | None:
        """The page's model colours for a figure; None (each figure's own) where the page gave none."""
        return dict(self.colors) or None


def palette(engine: Engine) -> tuple[tuple[str, str], ...]:
    """One colour per model of the database (`figures.model_colors`, the default set's models first), for every
    figure of a page: a model keeps its colour from figure to figure, and from set to set."""
    opening = queries.latest_set(engine)
    first = queries.models(engine, opening) if opening is not None else []
    return tuple(figures.model_colors(queries.models(engine), first).items())


# Selector element id (the same in both pages) -> the Selection field it sets.
FIELDS: dict[str, str] = {
    "set": "set_id", "task": "task", "models": "models", "loops": "loops", "measure": "measure",
    "context": "context_tokens", "depth-set": "set_id", "run": "run_id", "probe": "run_id",
}  # fmt: skip
# Selectors only the served app has: it queries live, while the report draws every model and loop count
# at the default context ahead, so its figures are not keyed by these.
LIVE_FILTERS = ("models", "loops", "context")


def selection(picked: Mapping[str, Any], colors: tuple[tuple[str, str], ...] = ()) -> Selection:
    """The Selection of the values the selectors hold, by element id, drawn in the page's `colors`: an unset task is
    the suite mean and an unset or non-positive context the default; an unset checklist keeps nothing."""
    fields = {FIELDS[name]: value for name, value in picked.items()}
    if "task" in fields:
        fields["task"] = fields["task"] or SUITE
    if "context_tokens" in fields:
        context = fields["context_tokens"]
        fields["context_tokens"] = int(context) if context and context > 0 else DEFAULT_CONTEXT_TOKENS
    for name in ("models", "loops"):
        if name in fields:
            fields[name] = tuple(fields[name] or ())
    return Selection(**fields, colors=colors)


@dataclass(frozen=True)
class Plot:
    """One figure of a view: its element id in both pages, its key in the report's table of figures, how it is
    drawn from the view's data (a `dashboards.figures` function) and its height in pixels."""

    id: str
    key: str
    draw: Callable[[Any, Selection], go.Figure]
    height: int = 480


def _one_case(engine: Engine) -> list[Selection]:
    return [Selection()]


def _as_is(case: Selection) -> list[Selection]:
    return [case]


@dataclass(frozen=True)
class View:
    """One section of both pages: a query and the figures drawn from its data.

    `inputs` are the selectors it reads (element ids, in the order the app's callback lists them).
    The report queries once per `cases` selection and keeps a drawing per `variants` of it (the memory
    measures, which change the figure but not the data); `answer`, where given, is a sentence drawn
    from the same data into the pages' `answer` element.
    """

    title: str
    inputs: tuple[str, ...]
    query: Callable[[Engine, Selection], Any]
    plots: tuple[Plot, ...]
    note: str | None = None
    cases: Callable[[Engine], Iterable[Selection]] = _one_case
    variants: Callable[[Selection], Iterable[Selection]] = _as_is
    answer: Callable[[Any, Selection], str] | None = None

    @property
    def keyed(self) -> tuple[str, ...]:
        """The selectors the report has, which key its figures of this view."""
        return tuple(name for name in self.inputs if name not in LIVE_FILTERS)

    def key(self, prefix: str, picked: Selection) -> str:
        """The report's key of one drawing: 'acc|<set>|<task>|<measure>' (its page script joins the same values; an
        empty selector's value is '', as None is here: the drawing that says how to fill the view)."""
        values = (getattr(picked, FIELDS[name]) for name in self.keyed)
        return "|".join([prefix, *("" if value is None else str(value) for value in values)])


# ------------------------------------------------------------------------------------------- accuracy
def _accuracy_points(engine: Engine, picked: Selection) -> pd.DataFrame:
    points = accuracy_points(engine, picked.set_id, picked.task, picked.context_tokens)
    keep = pd.Series(True, index=points.index)
    if picked.models is not None:
        keep &= points["model"].isin(picked.models)
    if picked.loops is not None:
        keep &= points["loops"].isin(picked.loops)
    return points[keep]


def _measure_label(picked: Selection) -> str:
    return measure_label(picked.memory, picked.context_tokens)


def _answer(points: pd.DataFrame, picked: Selection) -> str:
    return answer(points, picked.memory, context_tokens=picked.context_tokens)


def _accuracy_vs_memory(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return figures.accuracy_vs_memory(points, picked.memory, picked.task, _measure_label(picked), picked.palette)


def _accuracy_vs_loops(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return figures.accuracy_vs_loops(points, picked.memory, picked.task, _measure_label(picked), picked.palette)


def _set_ids(engine: Engine) -> list[str]:
    return [str(set_id) for set_id in queries.eval_sets(engine)["set_id"]]


def _set_tasks(engine: Engine) -> list[Selection]:
    return [
        Selection(set_id=set_id, task=task) for set_id in _set_ids(engine) for task in queries.tasks(engine, set_id)
    ]


def _each_measure(case: Selection) -> list[Selection]:
    return [dataclasses.replace(case, measure=measure) for measure in measures.MEMORY_MEASURES]


def _accuracy_vs_loops_per_token(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return cost_figures.accuracy_vs_compute(points, "loops_per_token", picked.task, picked.palette)


def _accuracy_vs_decode_time(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return cost_figures.accuracy_vs_compute(points, "seconds_per_token", picked.task, picked.palette)


def _accuracy_vs_energy(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return cost_figures.accuracy_vs_energy(points, picked.task, picked.palette)


# ----------------------------------------------------------------------------------------------- depth
def _memory_levers(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return cost_figures.memory_levers(points, picked.task, picked.palette)


# ---------------------------------------------------------------------------------------------- claims
@dataclass(frozen=True)
class Claims:
    """A set's claims (`analysis.claims`): each lever against its reference, pass@1 by length for them, the set."""

    retained: pd.DataFrame
    by_length: pd.DataFrame
    metrics: pd.DataFrame
    set_label: str | None


def _claims(engine: Engine, picked: Selection) -> Claims:
    points = accuracy_points(engine, picked.set_id)
    if points.empty:
        return Claims(pd.DataFrame(columns=claims.RETAINED_COLUMNS), pd.DataFrame(), pd.DataFrame(), None)
    book = claims.SampleBook(engine, [i for ids in points["run_ids"] for i in ids])
    table = claims.retained(engine, picked.set_id, points, book)
    lengths = claims.length_table(points, book, claims.lever_keys(points))
    metrics = claims.sample_metrics(points, book)
    return Claims(table, lengths, metrics, str(points["set_label"].iloc[0]))


def _retained_accuracy(data: Claims, picked: Selection) -> go.Figure:
    return claim_figures.retained_accuracy(data.retained, data.set_label)


def _accuracy_by_length(data: Claims, picked: Selection) -> go.Figure:
    return claim_figures.accuracy_by_length(data.by_length, data.set_label, picked.palette)


def _sample_metrics(data: Claims, picked: Selection) -> go.Figure:
    return claim_figures.metrics_from_samples(data.metrics, data.set_label, picked.palette)


def _depth_points(engine: Engine, picked: Selection) -> pd.DataFrame:
    return depth_points(engine, picked.set_id) if picked.set_id else pd.DataFrame()


def _accuracy_vs_depth(points: pd.DataFrame, picked: Selection) -> go.Figure:
    return trace_figures.accuracy_vs_depth(points, picked.palette)


def _each_set(engine: Engine) -> list[Selection]:
    return [Selection(set_id=set_id) for set_id in _set_ids(engine)]


# ------------------------------------------------------------------------------------ memory over a run
def run_label(run: Any) -> str:
    """How selectors and titles name an eval run (a `queries.runs` row): 'run 3: preset:qwen3-tiny r=2 (synthetic)',
    'run 4: zoo:ouro-tiny r=4 exit gate 0.5 (synthetic)' on the exit axis, 'run 5: zoo:ouro-tiny r=4 shared-last int8
    (synthetic)' on the KV axis."""
    exit_at = "" if pd.isna(run.exit_threshold) else f" exit {exit_label(run.exit_threshold, run.exit_criterion)}"
    kv = "".join(f" {value}" for value in (run.kv_policy, run.kv_dtype) if not pd.isna(value))
    return f"run {run.run_id}: {run.model} {loops_label(run.loops)}{exit_at}{kv} ({run.suite})"


def thinned(series: pd.DataFrame, limit: int = MAX_SERIES_POINTS) -> pd.DataFrame:
    """At most `limit` rows: each bucket of consecutive ticks keeps its maximum per measure, so peaks stay visible."""
    if len(series) <= limit:
        return series
    bucket = pd.Series(range(len(series)), index=series.index) * limit // len(series)
    aggregations = {column: ("max" if column in measures.SERIES_MEASURES else "first") for column in series.columns}
    return series.groupby(bucket.to_numpy()).agg(aggregations)


def _run_memory(engine: Engine, picked: Selection) -> tuple[pd.DataFrame, str]:
    """The run's memory series, thinned, and the figure's title naming the run."""
    if picked.run_id is None:
        return pd.DataFrame(), "Memory over a run"
    rows = list(queries.runs(engine, run_ids=[picked.run_id]).itertuples())
    title = f"Memory over {run_label(rows[0])}" if rows else f"Memory over run {picked.run_id}"  # not an eval run
    return thinned(queries.memory_series(engine, picked.run_id)), title


def _memory_over_run(data: tuple[pd.DataFrame, str], picked: Selection) -> go.Figure:
    series, title = data
    return trace_figures.memory_over_run(series, measures.SERIES_MEASURES, title)


def _each_run(engine: Engine) -> list[Selection]:
    return [Selection(run_id=int(run_id)) for run_id in queries.runs(engine)["run_id"]]


# ------------------------------------------------------------------------------- memory against context
def _profile_points(engine: Engine, picked: Selection) -> pd.DataFrame:
    return profile_points(engine)


def _memory_vs_context(profile: pd.DataFrame, picked: Selection) -> go.Figure:
    return trace_figures.memory_vs_context(profile, measures.PROFILE_MEASURES, picked.palette)


# ---------------------------------------------------------------------------------------------- probes
def _probe_values(engine: Engine, picked: Selection) -> pd.DataFrame:
    values = queries.probe_values(engine)
    return values[values["run_id"] == picked.run_id]


def _loop_probes(values: pd.DataFrame, picked: Selection) -> go.Figure:
    return trace_figures.loop_probes(values, probe_title(values) if not values.empty else "Loop probes", picked.palette)


def _each_probe_run(engine: Engine) -> list[Selection]:
    """Each probe run; with none, the one case (no run) whose figure says how to make one."""
    return [Selection(run_id=int(run_id)) for run_id in queries.probe_values(engine)["run_id"].unique()] or [
        Selection()
    ]


ACCURACY = View(
    title="Accuracy per gigabyte",
    inputs=("set", "task", "models", "loops", "measure", "context"),
    query=_accuracy_points,
    cases=_set_tasks,
    variants=_each_measure,
    answer=_answer,
    plots=(
        Plot("accuracy-memory", "acc", _accuracy_vs_memory, 660),
        Plot("accuracy-loops", "loops", _accuracy_vs_loops, 520),
    ),
)
COMPUTE = View(
    title="Accuracy against compute",
    inputs=("set", "task", "models", "loops"),
    query=_accuracy_points,
    cases=_set_tasks,
    plots=(
        Plot("accuracy-loops-per-token", "compute-loops", _accuracy_vs_loops_per_token, 520),
        Plot("accuracy-decode-time", "compute-time", _accuracy_vs_decode_time, 520),
        Plot("accuracy-energy", "compute-energy", _accuracy_vs_energy, 520),
    ),
    note="What a generated token cost beside what it scored: mean loops run per token (below r where tokens exit "
    "early, --exit-threshold) and generate seconds per token, drawn where the set varies the exit threshold or the "
    "loops; and the GPU energy a run drew (NVML), whose pass@1 per kJ stands beside pass@1 per GB.",
)
LEVERS = View(
    title="Memory levers",
    inputs=("set", "task", "models", "loops"),
    query=_accuracy_points,
    cases=_set_tasks,
    plots=(Plot("memory-levers", "levers", _memory_levers, 560),),
    note="What memory each KV policy (--kv-policy) and KV dtype (--kv-dtype) saves, and what it costs in accuracy, "
    "beside each model's own cache: a line from the model's own point to each lever, a black mark per lever; the x "
    "axis is weights + KV cache peak, or KV alone from the figure's menu. Drawn where the set sweeps them.",
)
CLAIMS = View(
    title="Retained accuracy, generation length, pass@k",
    inputs=("set",),
    query=_claims,
    cases=_each_set,
    plots=(
        Plot("retained-accuracy", "retained", _retained_accuracy, 480),
        Plot("accuracy-length", "length", _accuracy_by_length, 480),
        Plot("sample-metrics", "pass-k", _sample_metrics, 480),
    ),
    note="Each lever point (a KV policy or dtype, an exit threshold) against its reference on the same items: its "
    "pass@1 as a share of the reference's with the paired bootstrap interval, against MLPerf's 99% line (the hover "
    "gives `loopeval compare`'s sentence); and pass@1 by the tokens a sample generated, where a lever whose damage "
    "grows with length falls away from its reference; and each point's pass@k for every k up to its samples per "
    "problem, maj@n and avg@n (`loopeval results --metric`).",
)
# The views in page order: both pages draw every one of them.
VIEWS: list[View] = [
    ACCURACY,
    COMPUTE,
    LEVERS,
    CLAIMS,
    View(
        title="Depth extrapolation",
        inputs=("depth-set",),
        query=_depth_points,
        cases=_each_set,
        plots=(Plot("depth", "depth", _accuracy_vs_depth),),
        note="Accuracy per task group against the loop count r; the set opens on the widest sweep of r.",
    ),
    View(
        title="Memory over a run",
        inputs=("run",),
        query=_run_memory,
        cases=_each_run,
        plots=(Plot("memory-run", "run", _memory_over_run),),
    ),
    View(
        title="Memory against context length",
        inputs=(),
        query=_profile_points,
        plots=(Plot("memory-context", "profile", _memory_vs_context),),
    ),
    View(
        title="Loop probes",
        inputs=("probe",),
        query=_probe_values,
        cases=_each_probe_run,
        plots=(Plot("probe-values", "probe", _loop_probes, 640),),
    ),
]


def sections() -> list[tuple[View, tuple[str, ...]]]:
    """Each view of `VIEWS` with the selectors its section shows: one that two views read (the run) is shown
    once, in the first one's section, since an element id names one element."""
    shown: set[str] = set()
    placed = []
    for view in VIEWS:
        own = tuple(name for name in view.inputs if name not in shown)
        shown.update(own)
        placed.append((view, own))
    return placed


# --------------------------------------------------------------------------------------------- selectors
@dataclass(frozen=True)
class Choices:
    """A selector both pages fill alike: its label and its (value, label) choices; `default` picks the one
    selected first (None: the first choice)."""

    label: str
    choices: Callable[[Engine], list[tuple[Any, str]]]
    default: Callable[[Engine], Any] | None = None

    def first(self, engine: Engine, choices: list[tuple[Any, str]]) -> Any:
        """The value selected when the page opens; None when there is nothing to choose."""
        if self.default is not None:
            return self.default(engine)
        return choices[0][0] if choices else None


def _set_choices(engine: Engine) -> list[tuple[Any, str]]:
    """Every evaluation set, the default first (the set of the newest scored run)."""
    return [(row.set_id, set_choice(row)) for row in queries.eval_sets(engine).itertuples()]


def _run_choices(engine: Engine) -> list[tuple[Any, str]]:
    return [(row.run_id, run_label(row)) for row in queries.runs(engine).itertuples()]


def _probe_choices(engine: Engine) -> list[tuple[Any, str]]:
    return [(run_id, probe_title(rows)) for run_id, rows in queries.probe_values(engine).groupby("run_id")]


# The selectors whose choices come from the database alike in both pages, by element id. The accuracy
# view's task and memory-measure selectors are not here: the report offers every set's tasks and
# measures at once, while the app refills them when the set changes.
SELECTORS: dict[str, Choices] = {
    "set": Choices("evaluation set", _set_choices),
    "depth-set": Choices("evaluation set", _set_choices, queries.depth_set),
    "run": Choices("run", _run_choices, queries.headline_run),
    "probe": Choices("probe run", _probe_choices),
}

# ------------------------------------------------------------------------------------------ runs table
# The runs table's columns: the run's facts, then the peaks `measures.RUN_TABLE_MEASURES` names, by label, then the energy.
RUN_COLUMNS = ("run", "sweep", "kind", "model", "loops", "exit threshold", "KV policy and dtype", "suite", "set", "seed", "status", "samples",
               "pass@1 (suite mean)", *(measures.BY_NAME[name].label for name in measures.RUN_TABLE_MEASURES),
               measures.COMPUTE_BY_NAME["energy_joules"].label)  # fmt: skip


def _other_metric(metric: str) -> str:
    """A runs-table accuracy cell names its metric only where it is not the column's pass@1 (a suite scored by
    another metric): " (acc)", else nothing, so the column does not repeat "(pass@1)" in every row."""
    return "" if metric == "pass@1" else f" ({metric})"


def runs_table(engine: Engine) -> list[list[Any]]:
    """Every run (every kind) as a row of `RUN_COLUMNS`: status, samples, suite-mean accuracy, memory peaks and GPU
    energy as text (`measures.byte_text`, `energy_text`: an unavailable peak or energy reads n/a, never 0)."""
    table = queries.runs(engine, kind=None)
    table = table.merge(queries.memory_peaks(engine), on="run_id", how="left")
    averages = queries.suite_means(queries.metrics(engine))
    table = table.merge(averages[["run_id", "metric", "value"]], on="run_id", how="left")

    def number(value: Any) -> int | str:
        return "" if pd.isna(value) else int(value)

    rows = []
    for row in table.to_dict("records"):
        accuracy = "" if pd.isna(row.get("value")) else f"{row['value']:.3f}" + _other_metric(row["metric"])
        exit_at = "" if pd.isna(row["exit_threshold"]) else exit_label(row["exit_threshold"], row["exit_criterion"])
        kv = " ".join(value for value in (row["kv_policy"], row["kv_dtype"]) if not pd.isna(value))  # blank: not swept
        rows.append(
            [
                row["run_id"],
                row["sweep_id"],
                row["kind"],
                row["model"],
                number(row["loops"]),
                exit_at,
                kv,
                row["suite"],
                "" if pd.isna(row["set_id"]) else row["set_id"],
                number(row["seed"]),
                row["status"],
                row["n_samples"],
                accuracy,
                *(measures.byte_text(row.get(c)) for c in measures.RUN_TABLE_MEASURES),
                measures.energy_text(row["energy_joules"]),
            ]
        )
    return rows
