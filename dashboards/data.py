"""What the dashboards read besides the points (`analysis/`): the set selectors' names, the profile points with their
loop counts, the depth figure's per-group means, the probe runs' titles, and what the sample browsers list."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine

from analysis.names import config_labels, series_name
from db import queries, sample_queries
from db.headline import SUITE, group_means, headline
from db.sets import id_ranges


def set_choice(row: Any) -> str:
    """How the report's and the app's set selectors name an `queries.eval_sets` row: its label, its runs and,
    where several seeds were run, that each point pools them (so "16 runs" beside 4 points says why)."""
    runs = f"{row.runs} run{'s' * (row.runs != 1)}"
    return f"{row.set_label} ({runs}" + (f"; seeds {row.seeds} pooled in each point)" if row.seed_count > 1 else ")")


def profile_points(engine: Engine) -> pd.DataFrame:
    """`queries.profile_points` with each point's loop count known: a profile run at the model's own loops stores
    none per point, so it is read from the run's stored config (the r it ran at; 1 for a plain transformer)."""
    points = queries.profile_points(engine)
    configs = queries.runs(engine, kind="profile").set_index("run_id")["model_config"]
    ran_at = pd.to_numeric(
        points["run_id"].map(
            lambda run_id: configs[run_id].get("loops") if isinstance(configs.get(run_id), dict) else None
        )
    )
    return points.assign(loops=points["loops"].astype("float64").fillna(ran_at))


SAMPLE_BUDGET = 600  # samples the browsers hold, spread over runs, tasks and verdicts (sample_queries.sample_spread)
SAMPLE_TEXT_CHARS = 1500  # of each prompt, output and gold: a 32k-token answer must not weigh down the page
# The sample browsers' columns, in order: the `browse_samples` column -> its heading, in the report and the app.
SAMPLE_COLUMNS = {
    "run_id": "run",
    "model": "model",
    "loops": "loops",
    "task": "task",
    "doc_id": "doc",
    "sample_index": "sample",
    "prompt": "prompt",
    "output": "output",
    "gold": "gold",
    "score": "score",
    "prompt_tokens": "prompt tokens",
    "generated_tokens": "generated tokens",
    "verdict": "verdict",
}


def clip(text: object, limit: int = SAMPLE_TEXT_CHARS) -> str | None:
    """The text, cut at `limit` characters with a note of how many more there were."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return None
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def browse_samples(
    engine: Engine, task: str | None = None, model: str | None = None, correct: bool | None = None
) -> pd.DataFrame:
    """What the report's and the app's sample browsers list: `sample_queries.sample_spread`, texts clipped."""
    rows = sample_queries.sample_spread(engine, SAMPLE_BUDGET, task=task, model=model, correct=correct)
    return rows.assign(**{column: rows[column].map(clip) for column in ("prompt", "output", "gold")})


def spread_note(rows: pd.DataFrame) -> str:
    """How the browser's samples were picked, true at any count: `sample_spread` takes the same number of every
    (run, task, verdict) that matches, at least one, so with more kinds than SAMPLE_BUDGET it holds more than that."""
    kinds = rows.groupby(["run_id", "task", "verdict"]).size()
    if kinds.empty:
        return "no samples match"
    return (
        f"{len(rows)} samples: up to {int(kinds.max())} of each of the {len(kinds)} runs x tasks x verdicts that "
        f"match (about {SAMPLE_BUDGET} in all, at least one of each)"
    )


def depth_points(engine: Engine, set_id: str) -> pd.DataFrame:
    """Depth extrapolation: one row per (model, loops r, task group) of one evaluation set (a model at each exit
    threshold and in each configuration a line of its own, `figures.series_name`) with the group's
    mean pass@1 and the model's trained loop count T ("all" is the suite mean; groups from
    `db.headline.TASK_GROUPS` and `GROUP_PATTERNS`).

    A (model, r) pools its seeds, as the accuracy figures do (`queries.pooled_metrics`): `seeds` and `runs`
    say which. T comes from what the adapter described (`trained_loops`); NaN where it did not say, and the
    figure then marks no T.
    """
    table = queries.pooled_metrics(engine, set_id)
    info = queries.runs(engine).set_index("run_id")
    configs = table.drop_duplicates(["model", "config"])
    named = dict(zip(zip(configs["model"], configs["config"]), config_labels(configs)))
    rows = []
    for (model, loops, threshold, criterion, config), point in table[table["task"] != SUITE].groupby(
        queries.POINT, sort=True, dropna=False
    ):
        by_task: dict[str, dict[str, float | None]] = {}
        for row in point.itertuples():
            by_task.setdefault(row.task, {})[row.metric] = None if pd.isna(row.value) else row.value
        suite = point["suite"].iloc[0]
        result = headline(by_task, suite)
        newest = int(point["run_id"].max())
        described = info.at[newest, "model_config"]
        trained = described.get("trained_loops") if isinstance(described, dict) else None
        runs = id_ranges(sorted({i for ids in point["run_ids"] for i in ids}))
        for group, value in {SUITE: result.mean, **group_means(result.benchmarks, suite)}.items():
            rows.append(
                {
                    "runs": runs,
                    "seeds": int(point["seeds"].max()),
                    "model": series_name(model, threshold, criterion, named[model, config]),
                    "loops": int(loops),
                    "group": group,
                    "accuracy": value,
                    "trained_loops": np.nan if trained is None else float(trained),
                    "set_label": info.at[newest, "set_label"],
                }
            )
    columns = ["runs", "seeds", "model", "loops", "group", "accuracy", "trained_loops", "set_label"]
    return pd.DataFrame(rows, columns=columns).sort_values(["model", "group", "loops"]).reset_index(drop=True)


def probe_title(values: pd.DataFrame) -> str:
    """How figures and selectors name a probe run: its id, model, what was probed and the loops r."""
    first = values.iloc[0]
    return f"probe run {first['run_id']}: {first['model']} on {first['suite']}, r = 1..{int(values['loop'].max())}"
