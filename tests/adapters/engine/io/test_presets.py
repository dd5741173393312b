"""The presets and the family guide: a fresh copy per call, a clear error for an unknown name, and a guide row for
every family a checkpoint spec can load."""

from __future__ import annotations

import pytest

from adapters.base import AdapterError
from adapters.engine.config import FAMILIES
from adapters.engine.io.presets import FAMILY_GUIDE, PRESETS, family_table, preset


def test_a_preset_is_a_fresh_copy():
    a = preset("retrofit-llama-3.2-1b")
    a.extra["note"] = "changed"
    a.rope_scaling["factor"] = 1.0
    b = preset("retrofit-llama-3.2-1b")
    assert "note" not in b.extra and b.rope_scaling["factor"] == 32.0 and b == PRESETS["retrofit-llama-3.2-1b"]


def test_an_unknown_preset_names_the_known_ones():
    with pytest.raises(AdapterError, match="unknown preset 'qwen9' .*qwen3-tiny"):
        preset("qwen9")


def test_the_guide_covers_every_family_but_the_custom_shape_and_the_table_has_a_row_each():
    assert set(FAMILY_GUIDE) == set(FAMILIES) - {"custom"}
    table = family_table()
    assert len(table) == 2 + len(FAMILY_GUIDE) and all(row.count("|") == 6 for row in table)
