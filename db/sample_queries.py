"""The sample browsers' reads: which tasks have samples, how many there are, and an even spread of them.

Apart from `db.queries` (the figures' reads) because the browsers read samples, not scores: a spread is drawn per
(run, task, verdict) in SQL, so the report and the app show correct and wrong answers side by side without reading
every sample. Nothing here writes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from sqlalchemy import Engine, case, func, select

from db.models import Run, Sample
from db.queries import LOOPS, read_frame


def sample_tasks(engine: Engine) -> list[str]:
    """Task names that have samples, sorted (an interrupted run has samples before it has metrics)."""
    with engine.connect() as conn:
        return [row[0] for row in conn.execute(select(Sample.task).distinct().order_by(Sample.task))]


def _sample_filters(statement: Any, task: str | None, model: str | None, correct: bool | None) -> Any:
    if task is not None:
        statement = statement.where(Sample.task == task)
    if model is not None:
        statement = statement.where(Run.model_spec == model)
    if correct is True:
        statement = statement.where(Sample.score >= 1.0)
    elif correct is False:
        statement = statement.where(Sample.score < 1.0)
    return statement


# A sample's stratum in `sample_spread`: its run (model and loops), its task and its verdict.
_VERDICT = case((Sample.score.is_(None), "unscored"), (Sample.score >= 1.0, "correct"), else_="wrong").label("verdict")
_STRATUM = (Sample.run_id, Sample.task, _VERDICT)


def sample_spread(
    engine: Engine, budget: int, task: str | None = None, model: str | None = None, correct: bool | None = None
) -> pd.DataFrame:
    """About `budget` samples spread evenly over every (run, task, verdict) that has any, in SQL.

    Each stratum gives the same number (budget // strata, at least one), its first doc ids first
    (shortest id, then text: numeric ids in numeric order), first samples of a doc before its
    repeats, so every model and loop count shows correct and wrong answers side by side. The
    filters (task, model, `correct`) apply first; rows come in (run, task, doc id, sample) order with a `verdict` column.
    """
    strata = _sample_filters(select(*_STRATUM).join(Run).distinct(), task, model, correct).subquery()
    with engine.connect() as conn:
        n_strata = conn.execute(select(func.count()).select_from(strata)).scalar_one()
    rank = (
        func.row_number()
        .over(partition_by=_STRATUM, order_by=(Sample.sample_index, func.length(Sample.doc_id), Sample.doc_id))
        .label("rank")
    )
    ranked = _sample_filters(
        select(Sample.id.label("sample_id"), _VERDICT, rank).join(Run), task, model, correct
    ).subquery()
    statement = (
        select(
            Sample.id.label("sample_id"),
            Sample.run_id,
            Run.model_spec.label("model"),
            LOOPS,
            Run.suite,
            Sample.task,
            Sample.doc_id,
            Sample.sample_index,
            Sample.prompt,
            Sample.output,
            Sample.gold,
            Sample.score,
            ranked.c.verdict,
            Sample.prompt_tokens,
            Sample.generated_tokens,
        )
        .join(Run)
        .join(ranked, ranked.c.sample_id == Sample.id)
        .where(ranked.c.rank <= max(1, budget // max(1, n_strata)))
        .order_by(Sample.run_id, Sample.task, func.length(Sample.doc_id), Sample.doc_id, Sample.sample_index)
    )
    return read_frame(engine, statement)


def count_samples(engine: Engine) -> int:
    """Total stored samples (the report says how many it shows out of how many)."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Sample)).scalar_one()


def run_samples(engine: Engine, run_ids: list[int]) -> pd.DataFrame:
    """Every sample of `run_ids` as the claims read them (`analysis.items`, `analysis.paired`): run_id, seed, task,
    doc_id, sample_index, output, score, generated_tokens and finish_reason, in (run, task, doc, sample) order. An
    item is a (task, doc): its samples, every seed's, stay together wherever items are resampled."""
    statement = (
        select(
            Sample.run_id,
            Run.seed,
            Sample.task,
            Sample.doc_id,
            Sample.sample_index,
            Sample.output,
            Sample.score,
            Sample.generated_tokens,
            Sample.finish_reason,
        )
        .join(Run)
        .where(Sample.run_id.in_([int(i) for i in run_ids]))
        .order_by(Sample.run_id, Sample.task, Sample.doc_id, Sample.sample_index)
    )
    return read_frame(engine, statement).astype({"score": "float64", "generated_tokens": "float64"})
