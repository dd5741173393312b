"""The runs behind the points: what `loopeval results` lists beside them (the sets they belong to, the runs of a
set that have no score yet), keyed as the points are (`analysis.points.point_key`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Engine

import measures
from db import queries


def run_records(engine: Engine, run_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Every stored run (of every kind; only `run_ids` when given), oldest first, as plain records (None where
    unknown): `run_id`, `sweep_id`, `kind`, `model`, `suite`, `status`, its point (`queries.POINT`: loops as the
    points read them, its configuration key), its set (`set_id`, `set_label`; None off evaluation), seed, `scored`
    (it has scores), its memory peaks (a key per stored measure) and `kv_bytes_per_token` (what one more token of
    context adds to its KV cache, as its adapter described itself). What `loopeval results` filters and lists beside
    the points, read once."""
    runs = queries.runs(engine, kind=None, run_ids=run_ids)
    ids = runs["run_id"].tolist()
    configs = queries.run_configs(engine, ids)
    runs = runs.assign(
        config=runs["run_id"].map(configs).astype(object),
        scored=runs["run_id"].isin(queries.scored_runs(engine)),
        kv_bytes_per_token=[c.get("kv_bytes_per_token") if isinstance(c, dict) else None for c in runs["model_config"]],
    )
    runs = runs.merge(queries.memory_peaks(engine, ids), on="run_id", how="left").astype(object)
    return [{**row, "run_id": int(row["run_id"])} for row in runs.where(runs.notna(), None).to_dict("records")]


def ordered_sets(runs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """set id -> label for the evaluation sets of `run_records`, the default first: the set of the newest run with
    scores, as `db.queries.eval_sets` orders them."""
    evals = sorted(
        (run for run in runs if run["set_id"] is not None), key=lambda run: (run["scored"], run["run_id"]), reverse=True
    )
    return {run["set_id"]: run["set_label"] for run in evals}


def with_per_kj(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A run summary (`loopeval results --json`) with `pass_at_1_per_kj`: its suite mean pass@1 per kJ of the GPU
    energy it drew, as the table's pass@1/kJ; None where NVML had no counter or nothing is scored, never 0."""
    joules, mean = summary.get("energy_joules"), (summary.get("pass_at_1") or {}).get("mean")
    per_kj = None if joules is None or mean is None or joules <= 0 else mean / (joules / measures.KB)
    return {**summary, "pass_at_1_per_kj": per_kj}
