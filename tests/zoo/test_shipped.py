"""The shipped zoo: every checkpoint loads as zoo:NAME and generates, `loopeval zoo list` matches the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

import adapters
from adapters.zoo import ZOO_DIR, zoo_names
from harness.cli import main
from adapters.zoo import load_recipes
from harness.planning.defaults import LAB

SHIPPED = zoo_names()
EXPECTED = {"qwen3-tiny-small", "qwen3-tiny-deep", "ouro-tiny", "melt-tiny"}


def test_the_four_main_models_the_lab_zoo_and_their_recipes_are_shipped() -> None:
    assert EXPECTED | {m.removeprefix("zoo:") for m in LAB.models} <= set(SHIPPED)
    assert set(SHIPPED) <= set(load_recipes()), "every shipped model must be reproducible from a recipe"


def test_shipped_files_are_small_enough_to_commit() -> None:
    total = sum(p.stat().st_size for p in ZOO_DIR.rglob("*") if p.is_file())
    assert total < 13_500_000, (
        f"zoo package data is {total} bytes"
    )  # 13.2 MB: 15 models of 0.65-2.4 MB in bf16 (lab-huginn 1.45 MB)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_checkpoint_loads_and_generates(name: str) -> None:
    adapter = adapters.load(f"zoo:{name}")
    assert adapter.spec == f"zoo:{name}"
    out = adapter.generate(["a=3;b=7;b=?", "12+34="], adapters.Sampling(temperature=0, max_new_tokens=6, stop=("\n",)))
    assert len(out) == 2 and all(g.generated_tokens >= 1 and isinstance(g.text, str) for g in out)
    assert adapter.memory()["weights_bytes"] > 0


def test_melt_keeps_one_kv_row_per_layer_a_quarter_of_ouro() -> None:
    """KV bytes per token of melt-tiny are exactly 1/T of ouro-tiny's at r = T."""
    ouro = adapters.load("zoo:ouro-tiny").describe()
    melt = adapters.load("zoo:melt-tiny").describe()
    loops = ouro["config"]["loops"]
    assert melt["kv_bytes_per_token"] * loops == ouro["kv_bytes_per_token"]


def test_zoo_list_matches_the_shipped_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == SHIPPED
    for row in rows:
        path = Path(ZOO_DIR / row["name"])
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            params = sum(_numel(f.get_slice(k).get_shape()) for k in f.keys())
        assert row["params"] == params
        info = json.loads((path / "train_info.json").read_text())
        assert row["steps"] == info["steps"] and row["cpu_minutes"] == info["cpu_minutes"]
        config = json.loads((path / "config.json").read_text())["config"]
        assert row["kv_strategy"] == config["kv_strategy"]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_zoo_list_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "list"]) == 0
    text = capsys.readouterr().out
    for name in SHIPPED:
        assert name in text


def test_unknown_zoo_model_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(adapters.AdapterError, match="unknown zoo model 'nope'.*ouro-tiny"):
        adapters.load("zoo:nope")
    assert main(["zoo", "train", "nope", "--out", "/tmp/x"]) == 2
    assert "unknown zoo model" in capsys.readouterr().err


def test_a_recipe_starts_from_its_base_and_names_only_what_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "recipes.toml"
    path.write_text(
        "[defaults]\nsteps = 7\n"
        '[models.a]\nkind = "looplm"\npreset = "ouro-tiny"\ndescription = "a"\nlr = 0.5\nconfig = { loops = 3, qk_norm = true }\n'
        '[models.b]\nbase = "a"\nconfig = { loops = 5 }\n'
        '[models.c]\nbase = "b"\ndescription = "c"\nsteps = 9\n'
    )
    recipes = load_recipes(path)
    assert recipes["b"].config == {"loops": 5, "qk_norm": True} and recipes["b"].lr == 0.5 and recipes["b"].steps == 7
    assert recipes["b"].description == "" and recipes["c"].description == "c"  # a description is never inherited
    assert recipes["c"].config == {"loops": 5, "qk_norm": True} and recipes["c"].steps == 9
    path.write_text('[models.a]\nkind = "lm"\npreset = "qwen3-tiny"\nbase = "b"\n[models.b]\nbase = "a"\n')
    with pytest.raises(
        adapters.AdapterError, match="model b: base 'a' is not another model of the file, or its bases lead"
    ):
        load_recipes(path)  # a cycle
    path.write_text('[models.a]\nkind = "lm"\npreset = "qwen3-tiny"\nbase = "nope"\n')
    with pytest.raises(adapters.AdapterError, match="model a: base 'nope' is not another model"):
        load_recipes(path)


def test_a_shipped_models_family_is_its_recipes_and_the_coreloop_is_custom_as_its_preset() -> None:
    recipes = load_recipes()
    for name in SHIPPED:
        config = json.loads((ZOO_DIR / name / "config.json").read_text())["config"]
        assert config["family"] == recipes[name].model_config().family, name
    coreloop = adapters.load("zoo:lab-coreloop").describe()
    assert coreloop["family"] == adapters.load("preset:coreloop-tiny").describe()["family"] == "custom"
    assert adapters.inspect("zoo:lab-coreloop")["family"] == "custom"
