"""Claims with their uncertainty (`analysis.items`, `analysis.paired`, `analysis.claims`, `loopeval compare`, `results
--metric` and `--by-length`): the bootstrap and the permutation test against hand-computed cases and scipy's, pass@k
against its definition, maj@n, the suite weights, and the commands on a real SQLite store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import items, paired
from analysis.claims import SampleBook, lever_pairs, retained, with_samples
from analysis.points import accuracy_points
from db.store import Store
from harness.cli import main
from tests.support.cli import printed
from tests.support.paired_runs import LEVER, REFERENCE, claims_db, store_run
from tests.support.rich_tables import body_rows


def _values(by_task: dict[str, list[float]]) -> pd.Series:
    """Per-item values indexed as `analysis.items.item_values` gives them."""
    index = pd.MultiIndex.from_tuples(
        [(task, str(doc)) for task, values in by_task.items() for doc in range(len(values))], names=items.ITEM
    )
    return pd.Series([v for values in by_task.values() for v in values], index=index, dtype="float64")


def _design(a: dict[str, list[float]], b: dict[str, list[float]]) -> paired.Design:
    return paired.Design.of(_values(a), _values(b))


# ------------------------------------------------------------------------------------------ hand-computed
def test_the_exact_permutation_p_value_counts_sign_patterns_by_hand() -> None:
    """Three items A gets right and B wrong, one both get right: of the 16 sign patterns, the 4 with the three
    differences of one sign reach |0.75| (the tied item's sign is free): p = 4/16. Two tasks of equal weight, one
    item in the first (difference 1) and two in the second (1, 0): the suite difference is 0.5 + 0.25 = 0.75, and
    the patterns reaching it are those where the two moving items agree: p = 4/8."""
    one = _design({"addition": [1, 1, 1, 1]}, {"addition": [0, 0, 0, 1]})
    assert paired.permutation_p(one) == (0.25, True)
    two = _design({"addition": [1], "lookup": [1, 1]}, {"addition": [0], "lookup": [0, 1]})
    assert two.mean(two.difference) == pytest.approx(0.75)
    assert paired.permutation_p(two) == (0.5, True)
    assert paired.permutation_p(_design({"addition": [1, 0]}, {"addition": [1, 0]})) == (1.0, True)


def test_the_bootstrap_interval_of_a_two_item_case_by_hand() -> None:
    """Differences (1, 0): a resample of two items has mean 0 (1/4), 0.5 (1/2) or 1 (1/4), so the 2.5% and 97.5%
    quantiles are 0 and 1; a constant difference resamples to itself."""
    low, high = paired.percentile_interval(np.subtract(*paired.bootstrap(_design({"t": [1, 0]}, {"t": [0, 0]}))))
    assert (low, high) == (0.0, 1.0)
    a, b = paired.bootstrap(_design({"t": [1, 1, 0.5]}, {"t": [0.5, 0.5, 0]}))
    assert np.allclose(a - b, 0.5)


def test_items_needed_scale_with_the_paired_variance() -> None:
    """20 items, the difference +1 on 3, -1 on 1: mean 0.1, paired sd s; 1.96 s / sqrt(n) / 0.1 squared times 20."""
    differences = [1, 1, 1, -1] + [0] * 16
    design = _design({"t": [max(d, 0) for d in differences]}, {"t": [max(-d, 0) for d in differences]})
    sd = float(np.std(differences, ddof=1))
    assert paired.items_needed(design) == math.ceil(20 * (1.96 * sd / math.sqrt(20) / 0.1) ** 2)
    assert paired.items_needed(_design({"t": [1, 0]}, {"t": [0, 1]})) is None, "a difference of 0 is never resolved"


# -------------------------------------------------------------------------------------------- scipy's
def test_the_permutation_and_the_bootstrap_agree_with_scipys() -> None:
    """On one task (where the suite mean is the plain mean): the exact paired permutation p-value equals
    scipy.stats.permutation_test's to the last digit, the drawn one lies within its Monte Carlo error, and the
    percentile bootstrap interval matches scipy.stats.bootstrap's (paired, percentile) within resampling noise."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)

    def scipy_p(a: np.ndarray, b: np.ndarray) -> float:
        result = stats.permutation_test(
            (a, b), lambda x, y: np.mean(x - y), permutation_type="samples", n_resamples=20_000, random_state=1
        )
        return float(result.pvalue)

    a, b = rng.integers(0, 3, 12) / 2, rng.integers(0, 3, 12) / 2  # 12 items: 4096 patterns, enumerated by both
    p, exact = paired.permutation_p(_design({"t": list(a)}, {"t": list(b)}))
    assert exact and p == pytest.approx(scipy_p(a, b), abs=1e-12)
    a, b = (rng.random(60) < 0.7).astype(float), (rng.random(60) < 0.6).astype(float)
    design = _design({"t": list(a)}, {"t": list(b)})
    p, exact = paired.permutation_p(design)
    assert not exact and p == pytest.approx(scipy_p(a, b), abs=0.02)
    ours = paired.percentile_interval(np.subtract(*paired.bootstrap(design)))
    theirs = stats.bootstrap(
        (a, b), lambda x, y: np.mean(x - y), paired=True, method="percentile", n_resamples=20_000, random_state=1
    ).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.02)


# ------------------------------------------------------------------------------------------- metrics
def test_pass_at_k_is_chen_et_als_estimator() -> None:
    """1 - C(n-c, k) / C(n, k) for every k <= n, 1 where fewer than k samples failed; pass@1 is c / n."""
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)
                assert items.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), (n, c, k)
            assert items.pass_at_k(n, c, 1) == pytest.approx(c / n)


def _samples(rows: list[tuple[str, str, int, str, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["task", "doc_id", "sample_index", "output", "score"]).assign(seed=0)


def test_maj_at_n_votes_on_the_stripped_output_and_averages_ties() -> None:
    """Two of three samples answer 12 (one with spaces): the majority scores 1. A 1-1 tie scores the mean of the
    two answers. maj@N reads an item's first N samples; asking for more than n is an error."""
    samples = _samples(
        [
            ("t", "0", 0, " 12", 1.0), ("t", "0", 1, "13", 0.0), ("t", "0", 2, "12\n", 1.0),
            ("t", "1", 0, "a", 1.0), ("t", "1", 1, "b", 0.0), ("t", "1", 2, "b", 0.0),
        ]
    )  # fmt: skip
    assert items.item_values(samples, "maj@3").tolist() == [1.0, 0.0]
    assert items.item_values(samples, "maj@2").tolist() == [0.5, 0.5]
    assert items.item_values(samples, "avg@3").tolist() == pytest.approx([2 / 3, 1 / 3])
    with pytest.raises(ValueError, match="n = 3"):
        items.item_values(samples, "pass@4")


def test_the_suite_weights_are_the_headlines() -> None:
    """A family's subtasks share their benchmark's weight; each benchmark counts once."""
    assert items.task_weights(["mmlu_redux:a", "mmlu_redux:b", "gsm"]) == {
        "mmlu_redux:a": 0.25,
        "mmlu_redux:b": 0.25,
        "gsm": 0.5,
    }


def test_the_first_difference_of_two_outputs() -> None:
    assert items.first_difference("12345", "12345") is None
    assert items.first_difference("12345", "12045") == 2
    assert items.first_difference("123", "12345") == 3
    assert items.length_bin(1) == "1" and items.length_bin(5) == "4-7" and items.length_bin(0) == "0"


# ----------------------------------------------------------------------------------- on a real store
@pytest.fixture()
def db(tmp_path: Path) -> str:
    return claims_db(str(tmp_path / "claims.sqlite"))


def test_pass_at_1_from_the_samples_equals_the_stored_and_pass_at_2_follows(db: str) -> None:
    store = Store.read(db)
    points = accuracy_points(store.engine, None)
    book = SampleBook(store.engine, [i for ids in points["run_ids"] for i in ids])
    again = with_samples(points, book, "pass@1")  # the stored numbers, untouched
    computed = with_samples(points, book, "avg@2")
    assert np.allclose(computed["accuracy"], points["accuracy"]) and np.allclose(computed["stderr"], points["stderr"])
    assert again["accuracy"].equals(points["accuracy"])
    per_doc_2 = [1 - math.comb(2 - sum(pair), 2) / math.comb(2, 2) for pair in REFERENCE]  # pass@2 of each doc
    assert with_samples(points, book, "pass@2")["accuracy"].max() == pytest.approx(np.mean(per_doc_2))
    store.close()


def test_results_metric_and_by_length(db: str) -> None:
    """pass@2 ranks the rows (the reference and the exit point first), the lever's samples cut off are counted beside
    it; by length, each lever row is set against its reference."""
    out = printed(["results", "--db", db, "--metric", "pass@2", "--rank", "accuracy"])
    assert "pass@2 ±95%" in out and "cut off" in out
    pass_at_2 = np.mean([1 - (sum(p) == 0) for p in REFERENCE])
    first = body_rows(out)[0][0]
    assert f"{pass_at_2:.3f} ±" in first[5] and first[6] == "33%", first  # 4 of its 12 samples failed, cut off
    out = printed(["results", "--db", db, "--by-length"])
    lever = next(row for row in body_rows(out)[1] if row[0] == "zoo:ouro-tiny r=4 shared-last")
    # 3 of its 12 samples per task score otherwise than the reference's, their outputs parting at the second character
    assert lever[2:5] == ["24", "0.250", "1"], lever
    assert main(["results", "--db", db, "--metric", "pass@3"]) == 2


def test_compare_pairs_the_items_and_refuses_other_items(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The lever loses 3 of 12 sample pairs' worth on each task: A - B as the points' pass@1 differ, the sentence, the
    share cut off; the exit point ties the reference; a run of other items is refused in one line."""
    found = json.loads(printed(["compare", "ouro-tiny r=4 shared-last", "zoo:ouro-tiny r=4", "--db", db, "--json"]))
    expected = np.mean([sum(p) / 2 for p in LEVER]) - np.mean([sum(p) / 2 for p in REFERENCE])
    assert found["difference"] == pytest.approx(expected) and found["low"] <= expected <= found["high"]
    assert found["items"] == 12 and found["exact"] and found["cut_a"] == pytest.approx(7 / 12)
    assert found["sentence"].startswith("zoo:ouro-tiny r=4 shared-last is 0.250 below zoo:ouro-tiny r=4")
    tie = json.loads(printed(["compare", "zoo:ouro-tiny r=4 exit gate 0.9", "1", "--db", db, "--json"]))
    assert tie["difference"] == 0 and tie["p_value"] == 1 and tie["verdict"] == "unresolved"
    store = Store.open(db)
    other = store_run(store, REFERENCE[:3], [["4", "4"]] * 3, kv_policy="shared-mean", kv_dtype="auto")
    store.close()
    capsys.readouterr()
    assert main(["compare", str(other), "1", "--db", db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not on the same items: A has 6, B has 12" in err[0], err
    assert main(["compare", "zoo:nope", "1", "--db", db]) == 2


def test_every_lever_is_paired_with_its_reference(db: str) -> None:
    store = Store.read(db)
    points = accuracy_points(store.engine, None)
    pairs = {(lever.run_ids[0], ref.run_ids[0], axis) for lever, ref, axis in lever_pairs(points)}
    assert pairs == {(2, 1, "kv"), (3, 1, "exit")}
    table = retained(store.engine, None).set_index("lever")
    assert table.loc["zoo:ouro-tiny r=4 exit gate 0.9", "holds"]
    lever = table.loc["zoo:ouro-tiny r=4 shared-last"]
    assert not lever["holds"] and lever["retained"] == pytest.approx(
        np.mean([sum(p) for p in LEVER]) / np.mean([sum(p) for p in REFERENCE])
    )
    store.close()
