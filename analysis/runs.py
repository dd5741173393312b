"""The runs behind the points: what `loopeval results` lists beside them (the sets they belong to, the runs of a
set that have no score yet), keyed as the points are (`analysis.points.point_key`)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import Engine

from db import queries


def eval_runs(engine: Engine, run_ids: Iterable[int]) -> pd.DataFrame:
    """The evaluation runs among `run_ids`, oldest first: each run's point (`queries.POINT`: loops as the points read
    them, its configuration key), set (`set_id`, `set_label`), seed, status, `scored` (it has scores), its memory
    peaks (a column per stored measure, NaN where unavailable) and `kv_bytes_per_token` (what one more token of
    context adds to its KV cache, as its adapter described itself; None where it did not say)."""
    runs = queries.runs(engine, run_ids=run_ids)
    ids = runs["run_id"].tolist()
    configs = queries.run_configs(engine, ids)
    scored = queries.scored_runs(engine)
    runs = runs.assign(
        config=runs["run_id"].map(configs).astype(object), scored=runs["run_id"].isin(scored),
        kv_bytes_per_token=[c.get("kv_bytes_per_token") if isinstance(c, dict) else None for c in runs["model_config"]])
    return runs.merge(queries.memory_peaks(engine, ids), on="run_id", how="left")


def ordered_sets(runs: pd.DataFrame) -> dict[str, str]:
    """set id -> label for the evaluation sets of `eval_runs` rows, the default first: the set of the newest run with
    scores, as `db.queries.eval_sets` orders them."""
    order = runs.sort_values(["scored", "run_id"], ascending=False)
    return dict(zip(order["set_id"], order["set_label"]))
