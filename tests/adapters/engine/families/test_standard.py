"""The plain stack (`Standard`) and what every family inherits: the base hooks (the `standard` KV layout among them),
and how a prompt is cut into prefill chunks."""

from __future__ import annotations


from adapters.engine.families.standard import Family, Standard, prefill_chunks
from adapters.engine.io.presets import preset
from adapters.engine.layers import Block


def test_the_base_hooks_are_the_plain_stack_s():
    cfg = preset("qwen3-tiny")
    family = Standard(cfg)
    assert family.kv_reference is None and family.embed_scale is None
    assert family.state() is None and family.exit_gate() is None and family.extra_params() == 0
    assert not family.norm_each_loop and not family.norm_after_loops and family.prefill_chunk is None
    assert not family.has_exit_gate and family.gate_variant is None and family.first_skippable_loop == 0
    assert family.forward_chunks(10, 4) == [(0, 10)]  # one chunk, whatever the size asked
    assert type(family.block(0)) is Block


def test_an_exit_gate_is_a_linear_map_of_the_state_and_counted():
    cfg = preset("ouro-tiny")
    gate = Family(cfg).exit_gate()
    assert Family(cfg).has_exit_gate and gate is not None and gate.weight.shape == (1, cfg.hidden_size)
    assert Family(cfg).extra_params() == cfg.hidden_size + 1


def test_prompt_chunks_count_back_from_the_last_token():
    assert prefill_chunks(10, 4) == [(0, 2), (2, 6), (6, 10)]
    assert prefill_chunks(8, 4) == [(0, 4), (4, 8)]
    assert prefill_chunks(3, 16) == [(0, 3)]
