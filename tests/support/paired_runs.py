"""A lever and its reference stored as a sweep stores them, on a real SQLite file, for the tests of the claims
(`analysis.claims`, `loopeval compare`, the claims' figures): two samples per doc, outputs that part where the
scores do."""

from __future__ import annotations

import math

import numpy as np

from db.store import Store

TASKS = ["addition", "lookup"]
SAMPLING = {"temperature": 1.0, "top_p": 0.7, "top_k": None, "max_new_tokens": 8, "n": 2, "seed": 0, "stop": []}


def store_run(
    store: Store, scores: list[list[float]], outputs: list[list[str]], kv: int = 1_000_000, **columns: object
) -> int:
    """A finished run of zoo:ouro-tiny r=4 with two samples per doc (`scores[doc]`), on every task alike, the
    per-task pass@1 LightEval stores (each doc's mean over its samples, averaged, with its standard error) and `kv`
    bytes of KV cache peak."""
    run_id = store.create_run(
        sweep_id="s" + str(columns.get("kv_policy")) + str(columns.get("exit_threshold")),
        model_spec="zoo:ouro-tiny",
        adapter="zoo",
        loops=4,
        suite="synthetic",
        tasks=TASKS,
        limit=len(scores),
        sampling=SAMPLING,
        seed=0,
        data_fingerprint="f" * 64,
        status="finished",
        spec={"models": ["zoo:ouro-tiny"], "seed": 0},
        **columns,
    )
    store.add_samples(
        run_id,
        [
            dict(
                task=task, doc_id=str(doc), sample_index=i, prompt="p", output=outputs[doc][i], gold="g",
                score=score, generated_tokens=len(outputs[doc][i]), finish_reason="length" if score == 0 else "stop",
            )
            for task in TASKS
            for doc, pair in enumerate(scores)
            for i, score in enumerate(pair)
        ],
    )  # fmt: skip
    per_doc = [sum(pair) / 2 for pair in scores]
    stderr = float(np.std(per_doc, ddof=1) / math.sqrt(len(per_doc)))
    store.set_metrics(run_id, {task: {"pass@k:k=1&n=2": (sum(per_doc) / len(per_doc), stderr)} for task in TASKS})
    store.set_memory_peaks(run_id, {"weights_bytes": 2_000_000, "kv_bytes_allocated": kv})
    return run_id


REFERENCE = [[1, 1], [1, 0], [0, 0], [1, 1], [0, 1], [1, 1]]
LEVER = [[1, 1], [0, 0], [0, 0], [1, 0], [0, 1], [0, 1]]


def claims_db(path: str) -> str:
    """The reference (the model's own KV), a shared-last lever that loses items in less KV, and an exit point
    identical to the reference; the lever's outputs leave the reference's at their second character where its score differs."""
    store = Store.open(path)
    same = [["42" if s else "40" for s in pair] for pair in REFERENCE]
    store_run(store, REFERENCE, same)
    lever_outputs = [
        ["42" if s else ("40" if r == 0 else "41") for s, r in zip(p, q)] for p, q in zip(LEVER, REFERENCE)
    ]
    store_run(store, LEVER, lever_outputs, kv=400_000, kv_policy="shared-last", kv_dtype="auto")
    store_run(store, REFERENCE, same, exit_threshold=0.9, exit_criterion="gate")
    store.close()
    return path
