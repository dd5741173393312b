"""The runs behind the points: what `loopeval results` lists beside them (the sets they belong to, the runs of a
set that have no score yet), keyed as the points are (`analysis.points.point_key`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from sqlalchemy import Engine

import measures
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


def with_per_kj(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run summary (`loopeval results --json`) with `pass_at_1_per_kj`: its suite mean pass@1 per kJ of the GPU
    energy it drew, as the table's pass@1/kJ; None where NVML had no counter or nothing is scored, never 0."""
    joules, mean = summary.get("energy_joules"), (summary.get("pass_at_1") or {}).get("mean")
    per_kj = None if joules is None or mean is None or joules <= 0 else mean / (joules / measures.KB)
    return {**summary, "pass_at_1_per_kj": per_kj}
