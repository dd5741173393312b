"""A run's samples: committed as they are generated, scored once the suite is, read back for resume and browsing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Insert, insert, select, update

from db.models import Sample
from db.store.base import Transactions

SAMPLE_FIELDS = (
    "task",
    "doc_id",
    "sample_index",
    "prompt",
    "output",
    "gold",
    "score",
    "prompt_tokens",
    "generated_tokens",
    "loops_used",
    "loops_histogram",
    "finish_reason",
    "latency_seconds",
    "decode_seconds",
)


class Samples(Transactions):
    """Writes and reads of `samples` rows, each (run, task, doc_id, sample_index) stored once."""

    def add_samples(self, run_id: int, rows: Iterable[Mapping[str, Any]]) -> int:
        """Commit samples now; rows already stored for (run, task, doc_id, sample_index) are skipped.

        Skipping rather than failing is what makes `--resume` safe when a batch is re-generated.
        Returns how many rows were new.
        """
        fields: list[dict[str, Any]] = [{name: row.get(name) for name in SAMPLE_FIELDS} for row in rows]
        if not fields:
            return 0
        with self._write() as session:
            stored = select(Sample.task, Sample.doc_id, Sample.sample_index).where(
                Sample.run_id == run_id,
                Sample.task.in_({row["task"] for row in fields}),
                Sample.doc_id.in_({str(row["doc_id"]) for row in fields}),
            )
            existing = {(task, doc, index) for task, doc, index in session.execute(stored)}
            new: list[dict[str, Any]] = []
            for row in fields:
                key = (row["task"], str(row["doc_id"]), int(row["sample_index"]))
                if key not in existing:
                    existing.add(key)
                    new.append({**row, "run_id": run_id, "doc_id": key[1]})
            if new:  # one executemany INSERT: the ORM's per-object flush costs more than a tiny model's batch
                # one lock order: no deadlock
                new.sort(key=lambda row: (row["task"], row["doc_id"], int(row["sample_index"])))
                session.execute(self._insert_samples(), new)
            return len(new)

    def _insert_samples(self) -> Insert:
        """The samples INSERT. On Postgres it skips rows another transaction stored meanwhile: two workers
        can hold one run when a Ray node is lost but its process lives on, and the second must not fail.
        (SQLite's `BEGIN IMMEDIATE` already makes the check above and this insert one atomic step.)"""
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as postgres_insert

            return postgres_insert(Sample).on_conflict_do_nothing(
                index_elements=["run_id", "task", "doc_id", "sample_index"]
            )
        return insert(Sample)

    def set_sample_scores(self, run_id: int, scores: Mapping[tuple[str, str, int], float | None]) -> None:
        """Fill in scores once the suite is scored: (task, doc_id, sample_index) -> score."""
        with self._write() as session:
            keys = session.execute(
                select(Sample.id, Sample.task, Sample.doc_id, Sample.sample_index).where(Sample.run_id == run_id)
            )
            updates = [
                {"id": id_, "score": scores[(task, doc, idx)]}
                for id_, task, doc, idx in keys
                if (task, doc, idx) in scores
            ]
            if updates:  # ORM bulk UPDATE by primary key, one executemany
                session.execute(update(Sample), updates)

    def samples(self, run_id: int, task: str | None = None) -> list[Sample]:
        with self._read() as session:
            query = select(Sample).where(Sample.run_id == run_id)
            if task is not None:
                query = query.where(Sample.task == task)
            return list(session.scalars(query.order_by(Sample.task, Sample.doc_id, Sample.sample_index)))
