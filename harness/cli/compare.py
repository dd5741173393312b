"""`loopeval compare A B`: is A really better or worse than B? The paired difference of two points of one evaluation
set (or two runs) on the same items, with its bootstrap 95% interval, a paired permutation p-value and one sentence
(`analysis.paired`); refused in one line when A and B are not on the same items.
"""

from __future__ import annotations

import json

import typer

from harness.cli.common import DbOption, JsonFlag, console, print_sentence, print_table
from harness.errors import UserError


def compare(
    a: str = typer.Argument(
        ...,
        help="A point of the set as `loopeval results` names it ('zoo:ouro-tiny r=4 int8'), or any scored run's id.",
    ),
    b: str = typer.Argument(..., help="The point (or run) A is compared against: the reference."),
    db: DbOption = None,
    as_json: JsonFlag = False,
    set_id: str | None = typer.Option(
        None, "--set", help="The evaluation set the points belong to (its id). Default: the newest scored run's."
    ),
    metric: str = typer.Option(
        "pass@1", "--metric", help="What is compared per item: pass@K, maj@N or avg@N, from the stored samples."
    ),
) -> None:
    """The paired difference A - B per item, with a bootstrap 95% interval over items (an item keeps its samples), a
    paired permutation p-value, A / B (the retained accuracy), how many items a difference of that size needs where
    the interval straddles zero, the share of samples the token budget cut off, and one sentence."""
    from analysis.claims import SampleBook, compare_sides, resolve
    from analysis.items import parse_metric
    from analysis.points import accuracy_points
    from db import queries
    from db.store import Store

    try:
        parse_metric(metric)
    except ValueError as exc:
        raise UserError(f"--metric {exc}") from None
    store = Store.read(db)
    try:
        for line in store.hide_damaged():
            typer.echo(line, err=True)
        sets = queries.eval_sets(store.engine)
        if set_id is not None and set_id not in set(sets["set_id"]):
            raise UserError(f"--set {set_id}: no such evaluation set (sets: {', '.join(sets['set_id']) or 'none'})")
        chosen = set_id or queries.latest_set(store.engine)
        if chosen is None:
            raise UserError("no evaluation set holds scored runs; run `loopeval run` first")
        points = accuracy_points(store.engine, chosen)
        scored = sorted(queries.scored_runs(store.engine) & set(queries.runs(store.engine)["run_id"]))
        try:
            sides = [resolve(text, points, scored) for text in (a, b)]
            book = SampleBook(store.engine, [i for side in sides for i in side.run_ids])
            found = compare_sides(book, sides[0], sides[1], metric)
        except ValueError as exc:
            raise UserError(f"cannot compare {a!r} with {b!r}: {exc}") from None
    finally:
        store.close()
    if as_json:
        typer.echo(json.dumps({"set_id": chosen, **found.as_json()}, indent=2))
        return
    _print(found)


def _print(found: object) -> None:
    """The comparison as a table of its numbers, then the sentence."""
    from analysis.paired import Comparison

    assert isinstance(found, Comparison)

    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    ratio = "n/a" if found.ratio is None else f"{found.ratio:.3f} [{found.ratio_low:.3f}, {found.ratio_high:.3f}]"
    rows = [
        ["A", found.a, f"{found.value_a:.3f}", share(found.cut_a)],
        ["B", found.b, f"{found.value_b:.3f}", share(found.cut_b)],
    ]
    print_table(None, ["", "point", found.metric, "cut off"], rows, right=(found.metric, "cut off"), fold=("point",))
    lines = [
        f"A - B {found.difference:+.3f}, 95% interval [{found.low:+.3f}, {found.high:+.3f}] (paired bootstrap over "
        f"{found.items} items, each with its samples); permutation p {found.p_text}; A / B {ratio}.",
        "cut off: the share of samples the new-token budget ended (they score 0 for a reason no accuracy shows).",
    ]
    if found.items_needed is not None:
        lines.append(
            f"items that would resolve a difference of {abs(found.difference):.3f} at 95%: about {found.items_needed:,}"
        )
    for line in lines:
        console().print(line, markup=False, highlight=False)
    print_sentence(found.sentence())
