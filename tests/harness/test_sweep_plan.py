"""A sweep plans its runs from configs (no weights loaded) and loads each model once, changing loops in place."""

from __future__ import annotations

from pathlib import Path

import pytest

import adapters
from db.store import Store
from harness.errors import UserError
from harness.execution.runner import run_sweep
from harness.planning.plan import prepare_sweep
from harness.planning.spec import RunSpec


def test_engine_and_zoo_specs_are_planned_from_their_configs_without_loading():
    spec = RunSpec.build(
        models=["zoo:qwen3-tiny-small", "zoo:ouro-tiny", "preset:melt-tiny"], loops=[1, 4], tasks=["lookup"]
    )
    plan = prepare_sweep(spec)
    assert plan.loaded == {}
    # (model, loops): no exit threshold, KV policy or dtype swept, so none
    assert [(r.model, r.loops, r.exit_threshold, r.kv_policy, r.kv_dtype) for r in plan.runs] == [
        ("zoo:qwen3-tiny-small", None, None, None, None),
        ("zoo:ouro-tiny", 1, None, None, None),
        ("zoo:ouro-tiny", 4, None, None, None),
        ("preset:melt-tiny", 1, None, None, None),
        ("preset:melt-tiny", 4, None, None, None),
    ]
    assert {(r.suite, r.tasks, r.seed, r.data_fingerprint, r.id) for r in plan.runs} == {
        ("synthetic", ("lookup",), 0, plan.fingerprint, None)
    }, "one set and seed, none stored yet"


def test_a_bad_spec_fails_the_plan_before_anything_is_loaded():
    with pytest.raises(adapters.AdapterError, match="unknown zoo model 'nope'"):
        prepare_sweep(RunSpec.build(models=["zoo:nope"], tasks=["lookup"]))
    with pytest.raises(UserError, match="unknown task"):
        prepare_sweep(RunSpec.build(models=["zoo:ouro-tiny"], tasks=["nope"]))


def test_each_model_is_loaded_once_per_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    loads: list[str] = []
    real_load = adapters.load

    def counted(spec: str, **overrides):
        loads.append(spec)
        return real_load(spec, **overrides)

    monkeypatch.setattr(adapters, "load", counted)
    spec = RunSpec.build(
        models=["preset:ouro-tiny", "preset:qwen3-tiny"],
        loops=[1, 2, 3],
        tasks=["lookup"],
        limit=2,
        samples=1,
        max_new_tokens=2,
        db_url=str(tmp_path / "r.sqlite"),
    )
    store = Store.open(spec.db_url)
    outcomes = run_sweep(spec, prepare_sweep(spec), store, log=lambda line: None)
    assert loads == ["preset:ouro-tiny", "preset:qwen3-tiny"]
    assert [(o.run.model, o.run.loops, o.status) for o in outcomes] == [
        ("preset:ouro-tiny", 1, "finished"),
        ("preset:ouro-tiny", 2, "finished"),
        ("preset:ouro-tiny", 3, "finished"),
        ("preset:qwen3-tiny", None, "finished"),
    ]
    described = [store.get_run(o.run_id).model_config for o in outcomes[:3]]
    assert [d["loops"] for d in described] == [1, 2, 3]
    per_token = [d["kv_bytes_per_token"] for d in described]  # Ouro's KV grows with the loops run
    assert per_token == [per_token[0], 2 * per_token[0], 3 * per_token[0]]
    store.close()
