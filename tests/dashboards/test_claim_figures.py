"""The claims' figures (`dashboards.claim_figures`) and the 99% line of the memory-levers figure, drawn from a real
SQLite store of a lever, an exit point and their reference (`tests.support.paired_runs`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis import claims
from analysis.points import accuracy_points
from dashboards import claim_figures, cost_figures
from db.store import Store
from tests.support.paired_runs import REFERENCE, claims_db


@pytest.fixture()
def drawn(tmp_path: Path) -> tuple[pd.DataFrame, claims.SampleBook, pd.DataFrame]:
    store = Store.read(claims_db(str(tmp_path / "claims.sqlite")))
    points = accuracy_points(store.engine, None)
    book = claims.SampleBook(store.engine, [i for ids in points["run_ids"] for i in ids])
    table = claims.retained(store.engine, None, points, book)
    store.close()
    return points, book, table


def test_retained_accuracy_draws_each_lever_against_the_99_percent_line(drawn: tuple) -> None:
    """A marker per lever at lever / reference with its paired interval, green at or above 99% (the exit point ties
    its reference), red below (the shared-last lever); the dashed line at 0.99; the hover gives the sentence."""
    _, _, table = drawn
    fig = claim_figures.retained_accuracy(table, "set x")
    (trace,) = fig.data
    by_name = dict(zip(trace.y, zip(trace.x, trace.marker.color)))
    assert by_name["zoo:ouro-tiny r=4 exit gate 0.9 (exit)"] == (1.0, claim_figures.HOLDS)
    ratio, color = by_name["zoo:ouro-tiny r=4 shared-last (kv)"]
    assert ratio < 0.99 and color == claim_figures.FAILS
    assert [shape.x0 for shape in fig.layout.shapes] == [claims.MLPERF_RETAINED]
    sentences = [row[0].replace("<br>", " ") for row in trace.customdata]  # the hover wraps its lines
    assert any("the difference" in text or "cannot tell" in text for text in sentences)
    empty = claim_figures.retained_accuracy(table.iloc[0:0])
    assert "no lever point" in empty.layout.annotations[0].text


def test_accuracy_by_length_draws_the_levers_and_their_reference(drawn: tuple) -> None:
    points, book, _ = drawn
    fig = claim_figures.accuracy_by_length(claims.length_table(points, book, claims.lever_keys(points)))
    names = {trace.name: trace for trace in fig.data}
    assert set(names) == {"zoo:ouro-tiny r=4", "zoo:ouro-tiny r=4 shared-last", "zoo:ouro-tiny r=4 exit gate 0.9"}
    assert (
        names["zoo:ouro-tiny r=4"].line.dash == "solid" and names["zoo:ouro-tiny r=4 shared-last"].line.dash != "solid"
    )
    (reference_pass,) = names["zoo:ouro-tiny r=4"].y  # every output is 2 characters: one bin
    assert reference_pass == pytest.approx(sum(map(sum, REFERENCE)) / (2 * len(REFERENCE)))


def test_the_metrics_figure_orders_pass_at_k_then_maj_then_avg(drawn: tuple) -> None:
    points, book, _ = drawn
    fig = claim_figures.metrics_from_samples(claims.sample_metrics(points, book))
    assert list(fig.layout.xaxis.categoryarray) == ["pass@1", "pass@2", "maj@2", "avg@2"]
    assert len(fig.data) == len(points)


def test_the_levers_figure_draws_99_percent_of_the_models_own_accuracy(drawn: tuple) -> None:
    points, _, _ = drawn
    fig = cost_figures.memory_levers(points)
    own = float(points.loc[points["config"] == "", "accuracy"].iloc[0])
    lines = [trace for trace in fig.data if trace.mode == "lines" and trace.name.startswith("99% of")]
    assert [tuple(trace.y) for trace in lines] == [(0.99 * own, 0.99 * own)]
    assert not any(trace.mode == "text" and len(trace.text) for trace in fig.data), "the one lever falls below it"
