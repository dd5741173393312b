"""Read-side queries for the dashboards: plain pandas DataFrames, one row per thing plotted.

Accuracy is read one evaluation set at a time (`db.sets`: suite, tasks, limit, sampling, data): a
point never mixes runs of two sets, and the default set is that of the newest run with scores.

Nothing here writes. A run without a loop count (a plain transformer) reads as loops = 1, which is
what it is (a plain transformer is T = 1), so it sits on the same axes as looped models. Readers open the database with `db.session.open_existing`, which never creates it (a mistyped SQLite
path must not leave an empty file behind). Byte counts stay NULL (NaN in a DataFrame) where the
source was unavailable, so the figures can say "unavailable" instead of plotting zero.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable

import pandas as pd
from sqlalchemy import Engine, case, func, inspect, select

from db.headline import HEADLINE, SUITE, Estimate, headline, headline_metric, headline_stderr, pool
from db.models import MemoryPeak, MemorySample, ProbeValue, ProfilePoint, Run, Sample, TaskMetric
from db.session import display_url
from db.sets import config_key, configuration, id_ranges, run_set, set_label
from db import ResultsError
from db.stored import hidden
from measures import PROFILE_MEASURES, SERIES_MEASURES

# Profile runs keep NULL: they span several loop counts, recorded per point.
LOOPS = case((Run.kind == "eval", func.coalesce(Run.loops, 1)), else_=Run.loops).label("loops")


def require_results(engine: Engine) -> int:
    """Return the number of runs; raise ResultsError when there is nothing to show."""
    where = display_url(engine.url)
    if not inspect(engine).has_table(Run.__tablename__):  # database errors are ResultsErrors already (db.session)
        raise ResultsError(f"the database {where} holds no loopeval results; run `loopeval run` first")
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(Run)).scalar_one()
    if count == 0 and hidden(engine):
        raise ResultsError(
            f"the database {where} holds no run loopeval can read: each holds a damaged value (named above)"
        )
    if count == 0:
        raise ResultsError(f"the database {where} holds no runs yet; run `loopeval run` first")
    return count


def read_frame(engine: Engine, statement: Any) -> pd.DataFrame:
    """Run a select and return its rows as a DataFrame whose columns exist even when no row came back."""
    with engine.connect() as conn:
        result = conn.execute(statement)
        return pd.DataFrame.from_records(result.all(), columns=list(result.keys()))


def runs(engine: Engine, kind: str | None = "eval", run_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """One row per run (of `kind`, or all kinds when None; only `run_ids` when given) with its sample count and
    evaluation set."""
    counts = select(Sample.run_id, func.count().label("n_samples")).group_by(Sample.run_id)
    statement = select(
        Run.id.label("run_id"),
        Run.sweep_id,
        Run.kind,
        Run.model_spec.label("model"),
        Run.adapter,
        LOOPS,
        Run.exit_threshold,
        Run.exit_criterion,
        Run.kv_policy,
        Run.kv_dtype,
        Run.suite,
        Run.status,
        Run.started_at,
        Run.wall_seconds,
        Run.energy_joules,
        Run.model_config,
    )
    if kind is not None:
        statement = statement.where(Run.kind == kind)
    if run_ids is not None:
        run_ids = list(run_ids)
        counts, statement = counts.where(Sample.run_id.in_(run_ids)), statement.where(Run.id.in_(run_ids))
    n_samples = counts.subquery()
    statement = (
        statement.add_columns(func.coalesce(n_samples.c.n_samples, 0).label("n_samples"))
        .outerjoin(n_samples, n_samples.c.run_id == Run.id)
        .order_by(Run.id)
    )
    return read_frame(engine, statement).merge(run_sets(engine, run_ids), on="run_id", how="left")


def models(engine: Engine, set_id: str | None = None) -> list[str]:
    """Every model spec with a run of any kind (of the evaluation set `set_id` where given), sorted."""
    if set_id is not None:
        return sorted(set(runs(engine, run_ids=_set_run_ids(engine, set_id))["model"]))
    with engine.connect() as conn:
        return sorted(conn.execute(select(Run.model_spec).distinct()).scalars())


def headline_run(engine: Engine) -> int | None:
    """The run a page's memory-over-a-run figure opens on: the first run of the default evaluation set (`latest_set`:
    after the default job the headline sweep, not the recurrence lab's sweep stored before it); else the first run."""
    set_id = latest_set(engine)
    ids = _set_run_ids(engine, set_id) if set_id is not None else []
    if ids:
        return min(ids)
    first = runs(engine)["run_id"]
    return int(first.min()) if len(first) else None


def run_sets(engine: Engine, run_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """The evaluation set of every eval run (only `run_ids` when given), with its seed: run_id, seed, set_id, set_label
    (db.sets). The id is the one stored with the run (`runs.set_id`), never hashed again; each set's label is made
    once, from its first run's columns."""
    statement = (
        select(Run.id, Run.seed, Run.set_id, Run.suite, Run.tasks, Run.limit, Run.sampling, Run.data_fingerprint)
        .where(Run.kind == "eval")
        .order_by(Run.id)
    )
    if run_ids is not None:
        statement = statement.where(Run.id.in_(list(run_ids)))
    labels: dict[str, str] = {}
    rows = []
    with engine.connect() as conn:
        for row in conn.execute(statement):
            if row.set_id is not None and row.set_id not in labels:
                labels[row.set_id] = set_label(row.set_id, run_set(row._mapping))
            rows.append((row.id, row.seed, row.set_id, None if row.set_id is None else labels[row.set_id]))
    return pd.DataFrame(rows, columns=["run_id", "seed", "set_id", "set_label"]).astype({"run_id": "int64"})


def eval_sets(engine: Engine) -> pd.DataFrame:
    """One row per evaluation set, the default first: set_id, set_label, runs, seeds (which, as '0-3'), seed_count, last_run_id.

    The default is the set of the newest run with scores (a sweep's queued or failed runs have
    none, and a set without scores has nothing to plot), then sets by their newest run.
    """
    table = run_sets(engine)
    table = table.assign(scored_run_id=table["run_id"].where(table["run_id"].isin(scored_runs(engine))))
    grouped = table.groupby(["set_id", "set_label"], sort=False).agg(
        runs=("run_id", "count"),
        seeds=("seed", lambda seeds: id_ranges({int(s) for s in seeds.dropna()})),
        seed_count=("seed", "nunique"),
        last_run_id=("run_id", "max"),
        last_scored=("scored_run_id", "max"),
    )
    grouped = grouped.reset_index().sort_values(["last_scored", "last_run_id"], ascending=False, na_position="last")
    return grouped.drop(columns="last_scored").reset_index(drop=True)


def scored_runs(engine: Engine) -> set[int]:
    """The runs with scores (a queued, failed or still running run has none)."""
    with engine.connect() as conn:
        return {row[0] for row in conn.execute(select(TaskMetric.run_id).distinct())}


def latest_set(engine: Engine) -> str | None:
    """The default set (`eval_sets`): what every view shows until another set is chosen."""
    sets = eval_sets(engine)
    return None if sets.empty else str(sets["set_id"].iloc[0])


def depth_set(engine: Engine) -> str | None:
    """The set the depth-extrapolation figure opens on: the one sweeping the most loop counts (ties: `eval_sets` order).

    The headline set runs each looped model at a few r; a depth sweep (`--loops 1-12`, the default run's
    recurrence-lab sweep) runs every r past the trained T, which is what that figure is for.
    """
    sets = eval_sets(engine)
    if sets.empty:
        return None
    loops = read_frame(
        engine, select(Run.id.label("run_id"), LOOPS).where(Run.kind == "eval")
    )  # not `runs`: no sample count
    counts = loops.merge(run_sets(engine), on="run_id").groupby("set_id")["loops"].nunique()
    return str(max(sets["set_id"], key=lambda set_id: counts.get(set_id, 0)))  # max keeps the first of equals


def _set_run_ids(engine: Engine, set_id: str) -> list[int]:
    """The eval runs of the set `set_id`, oldest first."""
    with engine.connect() as conn:
        return list(conn.scalars(select(Run.id).where(Run.kind == "eval", Run.set_id == set_id).order_by(Run.id)))


def tasks(engine: Engine, set_id: str | None = None) -> list[str]:
    """Task names with metrics (the suite average `all` first), optionally within one evaluation set."""
    statement = select(TaskMetric.task).join(Run).distinct()
    if set_id is not None:
        statement = statement.where(Run.id.in_(_set_run_ids(engine, set_id)))
    with engine.connect() as conn:
        names = sorted(row[0] for row in conn.execute(statement))
    return sorted(names, key=lambda name: name != "all")


def metrics(engine: Engine, set_id: str | None = None, task: str | None = None) -> pd.DataFrame:
    """Every stored metric of every evaluated run (of one set, of one task, when given): run, model, loops, exit point,
    seed, task, metric, value, stderr and the run's `config` (`run_configs`)."""
    statement = (
        select(
            Run.id.label("run_id"),
            Run.sweep_id,
            Run.model_spec.label("model"),
            LOOPS,
            Run.exit_threshold,
            Run.exit_criterion,
            Run.suite,
            Run.seed,
            TaskMetric.task,
            TaskMetric.metric,
            TaskMetric.value,
            TaskMetric.stderr,
        )
        .join(Run)
        .where(Run.kind == "eval")
        .order_by(Run.id, TaskMetric.id)  # each run's tasks in the order they were stored: the suite's own
    )
    if set_id is not None:
        statement = statement.where(Run.id.in_(_set_run_ids(engine, set_id)))
    if task is not None:
        statement = statement.where(TaskMetric.task == task)
    frame = read_frame(engine, statement)
    return frame.assign(
        config=frame["run_id"].map(run_configs(engine, frame["run_id"].unique().tolist())).astype(object)
    )


def run_configs(engine: Engine, run_ids: Iterable[int]) -> dict[int, str]:
    """run id -> its configuration (`db.sets.configuration`, as `config_key` writes it; '' for none): what keeps
    runs of one model, loops and exit point apart as points of their own."""
    statement = select(Run.id, Run.model_spec, Run.spec, Run.kv_policy, Run.kv_dtype, Run.model_config).where(
        Run.id.in_([int(i) for i in run_ids])
    )
    with engine.connect() as conn:
        return {row.id: config_key(configuration(row._mapping)) for row in conn.execute(statement)}


def memory_peaks(engine: Engine, run_ids: Iterable[int] | None = None) -> pd.DataFrame:
    """Peaks as a wide table: one row per run, one column per `measures` measure (NaN = unavailable)."""
    statement = select(MemoryPeak.run_id, MemoryPeak.measure, MemoryPeak.value)
    if run_ids is not None:
        statement = statement.where(MemoryPeak.run_id.in_(list(run_ids)))
    long = read_frame(engine, statement)
    if long.empty:
        return pd.DataFrame({"run_id": pd.Series(dtype="int64")})
    wide = long.pivot(index="run_id", columns="measure", values="value").astype("float64")
    wide.columns.name = None
    return wide.reset_index()


def suite_means(table: pd.DataFrame, by: tuple[str, ...] = ("run_id",)) -> pd.DataFrame:
    """Rows of `metrics()` (or `pooled_metrics()`, `by` POINT) for task "all": per run (or point), the mean
    pass@1 over benchmarks and its stderr (`db.headline`); the other columns are the first task row's.

    Computed from the per-task rows rather than read from the stored "all", so runs stored before
    the suite mean had one metric show the same number as new ones.
    """
    rows = []
    for _, group in table[table["task"] != SUITE].groupby(list(by), sort=True, dropna=False):
        values: dict[str, dict[str, float | None]] = {}
        stderrs: dict[str, dict[str, float | None]] = {}
        for task, metric, value, stderr in zip(group["task"], group["metric"], group["value"], group["stderr"]):
            values.setdefault(task, {})[metric] = None if pd.isna(value) else value
            stderrs.setdefault(task, {})[metric] = None if pd.isna(stderr) else stderr
        rows.append(
            {
                **group.iloc[0].to_dict(),
                "task": SUITE,
                "metric": HEADLINE,
                "value": headline(values).mean,
                "stderr": headline_stderr(stderrs),
            }
        )
    return pd.DataFrame(rows, columns=list(table.columns))


# One plotted point, one row of `loopeval results`: a configuration (its model, loops, exit point and the rest of
# what changes the model, `config`: `run_configs`), whose seeds are pooled. The exit threshold and criterion are NaN /
# None off the exit axis (`--exit-threshold`), so every grouping by POINT keeps missing keys (`dropna=False`).
POINT = ["model", "loops", "exit_threshold", "exit_criterion", "config"]
_POOLED = [*POINT, "suite", "task", "metric", "value", "stderr", "seeds", "run_ids", "run_id"]


def item_counts(engine: Engine, run_ids: Iterable[int]) -> dict[tuple[int, str], int]:
    """(run, task) -> how many docs the run has samples of: the item count behind its per-task mean."""
    statement = (
        select(Sample.run_id, Sample.task, func.count(func.distinct(Sample.doc_id)))
        .where(Sample.run_id.in_(list(run_ids)))
        .group_by(Sample.run_id, Sample.task)
    )
    with engine.connect() as conn:
        return {(run_id, task): count for run_id, task, count in conn.execute(statement)}


def pooled_metrics(
    engine: Engine, set_id: str | None, run_ids: Iterable[int] | None = None, task: str | None = None
) -> pd.DataFrame:
    """Every metric of one evaluation set (None: the latest; of one task when given) per POINT, its seeds pooled.

    The runs of a point (one configuration: model, loops, exit point, overrides) with different seeds score the
    same docs again; their items are pooled into one sample (`db.headline.pool`): the value is the mean over every
    seed's items, the stderr that of all of them. `seeds` says how many were pooled, `run_ids` which runs (oldest
    first), `run_id` the newest. Of runs repeating one seed, that is one run's identity (`db.sets.run_key`: a
    `--rerun`), the latest counts; runs of two configurations are two points, so neither hides the other.
    `run_ids` keeps only those runs (`loopeval results` filters).
    """
    table = metrics(engine, set_id or latest_set(engine) or "", task)
    if run_ids is not None:
        table = table[table["run_id"].isin(list(run_ids))]
    table = table[table["value"].notna()].sort_values("run_id", kind="stable")
    table = table.drop_duplicates([*POINT, "seed", "task", "metric"], keep="last")
    repeated = table.duplicated([*POINT, "task", "metric"]).any()
    counts = item_counts(engine, table["run_id"].unique().tolist()) if repeated else {}
    rows = []
    for (*point, task, metric), group in table.groupby(
        [*POINT, "task", "metric"], sort=False, dropna=False
    ):  # tasks as stored
        # the columns zipped: itertuples copies every column of the group, once per group
        value, stderr = pool(
            [
                Estimate(v, None if pd.isna(s) else s, counts.get((run_id, task)))
                for v, s, run_id in zip(group["value"], group["stderr"], group["run_id"])
            ]
        )
        ids = sorted(int(i) for i in group["run_id"])
        rows.append([*point, group["suite"].iloc[0], task, metric, value, stderr, len(group), ids, ids[-1]])
    return pd.DataFrame(rows, columns=_POOLED).sort_values(list(POINT), kind="stable", ignore_index=True)


def accuracy_memory(
    engine: Engine,
    set_id: str | None = None,
    task: str = "all",
    metric: str | None = None,
    run_ids: Iterable[int] | None = None,
) -> pd.DataFrame:
    """One row per POINT (configuration) of one evaluation set: accuracy on `task` with stderr, sample count, every memory peak.

    `set_id` defaults to the latest set (`latest_set`); runs of other sets never enter, nor, when
    given, runs outside `run_ids` (`loopeval results` filters). Runs of one point with different
    seeds are pooled (`pooled_metrics`: `seeds`, `run_ids`); a rerun of a seed replaces the older run.
    Memory is the largest peak of the pooled runs (what the model needed, whichever seed), the samples
    their sum, the config, status and set those of the newest. `metric` defaults to the task's
    headline (`db.headline`: its pass@1; for "all" the suite mean over benchmarks); the chosen
    name is in the `metric` column.
    """
    set_id = set_id or latest_set(engine)
    if task == SUITE:  # the suite mean reads every task
        table = suite_means(pooled_metrics(engine, set_id, run_ids), by=tuple(POINT))
    else:
        table = pooled_metrics(engine, set_id, run_ids, task)
    table = table[table["value"].notna()]
    if metric is None and not table.empty:
        names = sorted(table["metric"].unique())
        metric = headline_metric(names) or names[0]
    table = table[table["metric"] == metric].rename(columns={"value": "accuracy"})
    pooled = (
        table[[*POINT, "run_ids"]].explode("run_ids").rename(columns={"run_ids": "run_id"}).astype({"run_id": "int64"})
    )
    info = runs(engine, run_ids=pooled["run_id"].tolist())[
        ["run_id", "n_samples", "model_config", "status", "set_id", "set_label"]
    ]
    table = table.merge(info.drop(columns="n_samples"), on="run_id", how="left")
    pooled = pooled.merge(info[["run_id", "n_samples"]], on="run_id", how="left")
    pooled = pooled.merge(memory_peaks(engine, pooled["run_id"].tolist()), on="run_id", how="left")
    pooled = pooled.merge(run_compute(engine, pooled["run_id"].tolist()), on="run_id", how="left")
    per_point = (
        pooled.drop(columns="run_id")
        .groupby(POINT, as_index=False, dropna=False)
        .agg(
            {
                c: _sum_known if c in _SUMMED else "mean" if c in _PER_RUN else "max"
                for c in pooled.columns
                if c not in (*POINT, "run_id")
            }
        )
    )
    table = table.merge(per_point, on=POINT, how="left")
    return table.sort_values(POINT).reset_index(drop=True)


# What a point's pooled runs add up (counts, seconds); what one run of them drew on average (GPU energy: NaN where no
# run had a counter); memory takes their largest peak.
_SUMMED = ("n_samples", "generated_tokens", "loop_tokens", "looped_tokens", "generate_seconds")
_PER_RUN = ("energy_joules",)


def _sum_known(values: pd.Series) -> float:
    """The sum of the known values; NaN when none is known (unavailable stays unavailable, never 0)."""
    return float(values.sum(min_count=1))


def run_compute(engine: Engine, run_ids: Iterable[int]) -> pd.DataFrame:
    """What each run's tokens cost, as stored: generated tokens, loop-token products (sum of a sample's mean loops x
    its tokens, over `looped_tokens`, the tokens of samples that report loops), seconds inside generate, GPU energy
    (NaN where unavailable). `analysis.points.with_derived_measures` turns them into the `measures.COMPUTE_MEASURES`."""
    looped = Sample.loops_used.is_not(None)
    tokens = (
        select(
            Sample.run_id,
            func.sum(Sample.generated_tokens).label("generated_tokens"),
            func.sum(case((looped, Sample.loops_used * Sample.generated_tokens), else_=0)).label("loop_tokens"),
            func.sum(case((looped, Sample.generated_tokens), else_=0)).label("looped_tokens"),
        )
        .group_by(Sample.run_id)
        .subquery()
    )
    statement = (
        select(
            Run.id.label("run_id"),
            tokens.c.generated_tokens,
            tokens.c.loop_tokens,
            tokens.c.looped_tokens,
            Run.generate_seconds,
            Run.energy_joules,
        )
        .outerjoin(tokens, tokens.c.run_id == Run.id)
        .where(Run.id.in_(list(run_ids)))
    )
    frame = read_frame(engine, statement)
    return frame.astype({column: "float64" for column in frame.columns if column != "run_id"})


def memory_series(engine: Engine, run_id: int) -> pd.DataFrame:
    """The sampler's ticks of one run: t (seconds), phase, generated_tokens and each measure."""
    columns = [getattr(MemorySample, name) for name in ("t", "phase", "generated_tokens", *SERIES_MEASURES)]
    statement = select(*columns).where(MemorySample.run_id == run_id).order_by(MemorySample.t)
    return read_frame(engine, statement).astype({name: "float64" for name in SERIES_MEASURES})


def profile_points(engine: Engine) -> pd.DataFrame:
    """Every `loopeval profile` point with its run's model: memory against context length."""
    point_columns = [
        ProfilePoint.context_tokens,
        ProfilePoint.batch,
        ProfilePoint.loops,
        ProfilePoint.weights_bytes,
        ProfilePoint.kv_bytes_analytic,
        *(getattr(ProfilePoint, name) for name in PROFILE_MEASURES),
        ProfilePoint.prefill_seconds,
        ProfilePoint.decode_tokens_per_second,
    ]
    statement = (
        select(ProfilePoint.run_id, Run.model_spec.label("model"), *point_columns)
        .join(Run)
        .order_by(Run.model_spec, ProfilePoint.loops, ProfilePoint.batch, ProfilePoint.context_tokens)
    )
    frame = read_frame(engine, statement)
    byte_columns = ["weights_bytes", "kv_bytes_analytic", *PROFILE_MEASURES]
    return frame.astype({name: "float64" for name in byte_columns})


def probe_values(engine: Engine) -> pd.DataFrame:
    """Every `loopeval probe` value with its run: run_id, model, suite (what was probed), trained_loops
    (T, NaN where the adapter did not say), loop, metric, lag, value (NaN = undefined)."""
    statement = (
        select(
            ProbeValue.run_id,
            Run.model_spec.label("model"),
            Run.suite,
            Run.model_config,
            ProbeValue.loop,
            ProbeValue.metric,
            ProbeValue.lag,
            ProbeValue.value,
        )
        .join(Run)
        .order_by(ProbeValue.run_id, ProbeValue.metric, ProbeValue.lag, ProbeValue.loop)
    )
    frame = read_frame(engine, statement)
    trained = [c.get("trained_loops") if isinstance(c, dict) else None for c in frame["model_config"]]
    frame = frame.drop(columns="model_config").assign(
        trained_loops=pd.Series(trained, dtype="float64", index=frame.index)
    )
    return frame.astype({"value": "float64"})
