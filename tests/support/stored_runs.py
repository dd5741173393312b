"""Runs stored as a sweep stores them, on a real SQLite file, for the tests of points (db.queries.POINT): a run's
spec with its model's overrides, a sample per (task, doc), per-task pass@1 and memory peaks."""

from __future__ import annotations

from typing import Any

from db.sets import config_key
from db.store import Store

SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 1, "seed": 0, "stop": []}
TASKS = ["chain3", "c30k4"]
MODEL = "zoo:ouro-tiny"
DOCS = 4  # items per task: a pooled value is the mean over every seed's items


def store_run(
    store: Store,
    scores: list[float],
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    model: str = MODEL,
    loops: int = 4,
    kv: int = 1_000_000,
    **extra: Any,
) -> int:
    """A finished run of `model` at `loops` as a sweep stores it: its spec with the model's overrides, one sample per
    (task, doc) scored `scores[doc]`, per-task pass@1 the mean of its docs, and its peaks (`extra`: more columns,
    such as an exit threshold)."""
    spec = {"models": [model], "seed": seed, "model_overrides": {model: overrides} if overrides else {}}
    run_id = store.create_run(
        sweep_id=f"sweep-{seed}-{config_key(overrides or {})}",
        model_spec=model,
        adapter="zoo",
        loops=loops,
        suite="synthetic",
        tasks=TASKS,
        limit=DOCS,
        sampling=SAMPLING | {"seed": seed},
        seed=seed,
        data_fingerprint="f" * 64,
        status="finished",
        spec=spec,
        **extra,
    )
    store.add_samples(
        run_id,
        [
            dict(task=task, doc_id=str(doc), sample_index=0, prompt="p", output="o", gold="g", score=score)
            for task in TASKS
            for doc, score in enumerate(scores)
        ],
    )
    mean = sum(scores) / len(scores)
    store.set_metrics(run_id, {task: {"pass@k:k=1&n=1": (mean, 0.1)} for task in TASKS})
    store.set_memory_peaks(run_id, {"weights_bytes": 2_000_000, "kv_bytes_allocated": kv})
    return run_id
