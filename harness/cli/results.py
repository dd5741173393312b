"""`loopeval results`: the stored runs with their metrics and memory peaks (GB = 1e9 bytes)."""

from __future__ import annotations

import json

import typer

from harness.cli.common import DbOption, JsonFlag, print_runs


def results(db: DbOption = None, as_json: JsonFlag = False) -> None:
    """Stored runs with sweep, model, loops, suite, status, samples, metrics and memory peaks (GB = 1e9 bytes)."""
    from db.measures import PEAK_MEASURES
    from db.store import Store

    store = Store.read(db)
    runs = store.run_summaries()
    store.close()
    for summary in runs:
        summary["memory"] = {name: summary["memory"].get(name) for name in PEAK_MEASURES}
    if as_json:
        typer.echo(json.dumps(runs, indent=2))
    elif runs:
        print_runs(runs)
    else:
        typer.echo("no runs stored yet: try `loopeval run`")
