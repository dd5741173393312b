"""Ranking and the frontier (`analysis.ranking`): the frontier by its definition, ties included; pass@1 per GB and
per kJ from the stored peaks and the stored NVML energy of real runs on a real SQLite file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import measures
from analysis import names
from analysis.points import accuracy_points
from analysis.ranking import RANKINGS, pareto_mask, ranked
from db.store import Store
from tests.support.frontier import brute_force_frontier
from tests.support.stored_runs import MODEL, store_run

MELT = "zoo:melt-tiny"


def test_pareto_mask_against_brute_force_with_ties() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        memory = rng.integers(1, 5, size=8).astype(float)  # few distinct values: many ties
        accuracy = rng.integers(0, 4, size=8) / 4
        mask = pareto_mask(memory, accuracy)
        pairs = list(zip(memory, accuracy))
        expected = brute_force_frontier(pairs)
        assert {p for p, keep in zip(pairs, mask) if keep} == expected
        assert all(keep == (p in expected) for p, keep in zip(pairs, mask))  # duplicates of a frontier point stay


def test_byte_units_scale_to_the_largest_value() -> None:
    assert names.byte_unit([0, 999]) == ("B", 1.0)
    assert names.byte_unit([1_500, 20]) == ("KB", 1e3)
    assert names.byte_unit([2.5e6, np.nan]) == ("MB", 1e6)
    assert names.byte_unit([3.2e10]) == ("GB", 1e9)


@pytest.fixture()
def store(tmp_path: Path):
    """ouro-tiny r=4 at two seeds (0.75 each, 3 MB, 1000 J and 2000 J of NVML energy) and melt-tiny r=4 (0.25,
    2.1 MB, 250 J), the energy stored as the recorder stores it (`Store.update_run`)."""
    store = Store.open(str(tmp_path / "energy.sqlite"))
    for seed, joules in ((0, 1000.0), (1, 2000.0)):
        store.update_run(store_run(store, [1.0, 1.0, 1.0, 0.0], seed=seed), generate_seconds=2.0, energy_joules=joules)
    melt = store_run(store, [1.0, 0.0, 0.0, 0.0], model=MELT, kv=100_000)
    store.update_run(melt, generate_seconds=1.0, energy_joules=250.0)
    yield store
    store.close()


def test_pass_at_1_per_kj_is_over_one_runs_energy_and_ranks_the_points(store: Store) -> None:
    table = ranked(accuracy_points(store.engine, None), measures.WEIGHTS_PLUS_KV, "per-kj")
    assert list(table["model"]) == [MELT, MODEL], "0.25 / 0.25 kJ beats 0.75 / 1.5 kJ"
    assert list(table["energy_joules"]) == [250.0, 1500.0], "a point's energy is one run's: the mean of its seeds'"
    assert list(table["per_kj"]) == pytest.approx([1.0, 0.5])
    assert list(table["per_gb"]) == pytest.approx([0.25 / 2.1e-3, 0.75 / 3e-3]), "per GB as before, beside it"
    assert RANKINGS["per-kj"][0] == "per_kj"


def test_without_an_energy_counter_pass_at_1_per_kj_is_unknown_never_zero(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path / "cpu.sqlite"))
    store_run(store, [1.0, 1.0, 1.0, 0.0])  # a CPU run: the recorder stores energy_joules None
    (row,) = ranked(accuracy_points(store.engine, None), measures.WEIGHTS_PLUS_KV, "per-kj").itertuples()
    store.close()
    assert np.isnan(row.energy_joules) and np.isnan(row.per_kj) and row.per_gb == pytest.approx(250)
