"""`LoopConfig`: every bad field refused by name, and the family facts the config implies."""

from __future__ import annotations

import pytest

from adapters.base import AdapterError, Sampling
from adapters.engine.config import LoopConfig
from adapters.engine.io.presets import preset

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
        (dict(loops=0), "loops"),
        (dict(loops=-2), "loops"),
        (dict(kv_strategy="paged"), "kv_strategy"),
        (dict(kv_strategy="gated", shared_layers=0, prelude_layers=2), "gated"),
        (dict(gate_variant="max"), "gate_variant"),
        (dict(norm_layout="post"), "norm_layout"),
        (dict(kv_strategy="standard", loops=4), "standard"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(exit_threshold=1.5), "early_exit_threshold"),
        (dict(exit_threshold="0.5"), "early_exit_threshold"),
        (dict(exit_threshold=0.5, exit_gate=False), "exit gate"),
    ],
)
def test_invalid_configs_name_the_field(changes, field):
    with pytest.raises(AdapterError, match=field):
        LoopConfig(**{**preset("melt-tiny").to_dict(), **changes})
