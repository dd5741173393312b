"""The README's `loopeval results` example is what a fresh database shows after the default run.

The run ids and sets in its table are worked out here from the default run's plan, as `loopeval run`
stores it: the recurrence lab's sweep first, then the headline sweep, then the exit sweep and the memory levers in
the headline's set, ids counted from 1. A README whose ids or set labels drift from what the command prints fails
here.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from db.sets import EvalSet, set_label
from harness.planning.plan import prepare_sweep
from harness.planning.sweep import build_request

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> list[str]:
    text = README.read_text()
    block = text[text.index("    $ loopeval results        # after the default run") :]
    return [line[4:] for line in block.split("\n\n", 1)[0].splitlines()[1:]]


def test_the_readme_results_example_has_a_fresh_databases_run_ids_and_sets() -> None:
    request = build_request({})  # `loopeval run` with no options
    runs, sets, next_id = {}, [], 1
    for spec in request.specs:
        plan = prepare_sweep(spec)
        sets.append(
            (
                EvalSet.of(
                    spec.suite,
                    [t.name for t in plan.task_configs],
                    spec.limit,
                    dataclasses.asdict(spec.sampling),
                    plan.fingerprint,
                ),
                len(plan.runs),
            )
        )
        for run in plan.runs:
            runs[(run.model, run.loops or 1, run.exit_threshold, run.kv_policy, run.kv_dtype)] = next_id
            next_id += 1
    (lab, lab_runs), (headline, _), (exits, exit_runs), *levers = sets
    assert exits == headline and exit_runs == 6, "the exit sweep's runs join the headline's set"
    assert [(kept, count) for kept, count in levers] == [(headline, 4), (headline, 3), (headline, 1)], (
        "so do the memory levers' and the model trained to share"
    )

    lines = _example()
    assert lines[0] == set_label(headline.id, headline)
    ranking = "\n".join(lines).split("└")[0]  # the first table; the second repeats its rows with what a token cost
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in ranking.splitlines() if line.startswith("│")]
    assert len(rows) == len(runs) - lab_runs and "seeds" not in ranking, "a row per headline run: one seed a row"
    for row in rows:
        model, loops, exit_at, config, shown = row[1], int(row[2]), row[3], row[4].split(), row[-1]  # runs: the last
        policy = next((word for word in config if "-" in word), None)  # config: the KV policy and dtype, where set
        dtype = next((word for word in config if word in ("auto", "int8", "fp8")), None)
        assert shown == str(runs[(model, loops, None if exit_at == "-" else float(exit_at), policy, dtype)]), row
    named = f"  {set_label(lab.id, lab)} ({lab_runs} runs)"
    assert named in lines, "the other set is named under the tables"
    sentence = " ".join(lines[lines.index(named) + 1 :])
    assert not sentence or sentence.startswith("Best by pass@1 per GB of "), "the answer comes last"
    assert re.search(r"\b0\.140 ± ", "\n".join(lines)), (
        "melt-tiny at r = 1 reads as `results` rounds it: three places, the zero kept"
    )
