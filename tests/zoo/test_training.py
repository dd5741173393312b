"""Training and conversion on real tensors with tiny shapes: losses fall, resume is exact, MELT starts as its teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import adapters
from adapters.base import AdapterError
from training import objectives as T
from adapters.engine.model import LoopedLM, to_melt
from training.data import TaskData
from training.train import load_teacher, train
from adapters.zoo import get_recipe
from suites import synthetic
from tests.support.rounding import rounding_bound

pytestmark = pytest.mark.slow  # end to end: the fast tier (-m 'not slow') skips it

# 32-wide models and a few hundred items keep every run here to seconds on two cores.
TINY = {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "ffn_size": 64, "vocab_size": 99}
TASKS = ("chain2", "lookup")


@pytest.fixture(scope="module")
def items() -> dict[str, list[dict]]:
    return {task: synthetic.load_split(task, "train")[:240] for task in TASKS}


def tiny(name: str, steps: int, **changes) -> object:
    recipe = get_recipe(name)
    config = {**recipe.config, **TINY}
    if recipe.kind != "melt":  # the shipped 1e-3 suits thousands of steps; these runs have tens
        changes.setdefault("lr", 3e-3)
    return recipe.with_overrides(
        config=config,
        steps=steps,
        batch_size=12,
        tasks=TASKS,
        val_items=40,
        warmup_steps=5,
        log_every=1,
        save_every=1000,
        **changes,
    )


def losses(out: Path) -> list[float]:
    import json

    return [json.loads(line)["loss"] for line in (out / "losses.jsonl").read_text().splitlines()]


def falls(values: list[float]) -> bool:
    """The mean of the last quarter is clearly below the mean of the first quarter."""
    q = max(1, len(values) // 4)
    return sum(values[-q:]) / q < 0.8 * sum(values[:q]) / q


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, items: dict) -> Path:
    """A tiny ouro-tiny trained for a few steps: the LoopLM the MELT tests convert."""
    out = tmp_path_factory.mktemp("zoo") / "ouro"
    train(tiny("ouro-tiny", 30), out, progress=False, items=items, stop=synthetic.STOP)
    return out


@pytest.mark.parametrize("name", ["qwen3-tiny-small", "ouro-tiny"])
def test_loss_falls_for_plain_and_looped_models(name: str, tmp_path: Path, items: dict) -> None:
    info = train(tiny(name, 30), tmp_path / name, progress=False, items=items, stop=synthetic.STOP)
    assert falls(losses(tmp_path / name)), losses(tmp_path / name)
    assert info["steps"] == 30 and info["tokens"] > 0 and info["params"] > 0


def test_looped_loss_trains_every_loop_and_the_exit_gate(teacher_dir: Path) -> None:
    import json

    records = [json.loads(line) for line in (teacher_dir / "losses.jsonl").read_text().splitlines()]
    assert {"ce_loop1", "ce_loop4", "mean_exit_loop"} <= set(records[0])
    assert records[-1]["ce_loop4"] < records[0]["ce_loop4"]
    assert 1.0 <= records[-1]["mean_exit_loop"] <= 4.0


@pytest.mark.parametrize("chunkwise", [True, False])
def test_melt_conversion_brings_pure_melt_closer_to_the_teacher(
    chunkwise: bool, tmp_path: Path, items: dict, teacher_dir: Path
) -> None:
    """The two stages run (a ramps from the teacher, stage 2 adds alignment) and leave a pure MELT model (a = 1) that tracks its teacher."""
    recipe = tiny("melt-tiny", 20, ramp_steps=8, stage2_start=12, chunkwise=chunkwise, lr=3e-3)
    info = train(
        recipe, tmp_path / "melt", progress=False, items=items, stop=synthetic.STOP, teacher_spec=f"ouro:{teacher_dir}"
    )
    values = losses(tmp_path / "melt")
    assert values[0] < 1e-4, "at a = 0 the converted model is its teacher"
    assert any("align" in line for line in (tmp_path / "melt" / "losses.jsonl").read_text().splitlines()[12:])
    teacher = load_teacher(f"ouro:{teacher_dir}", "cpu")
    fresh = to_melt(teacher, "elementwise", chunk_size=recipe.chunk_size)
    shipped = adapters.load(f"melt:{tmp_path / 'melt'}", dtype="float32").model
    assert shipped.config.kv_strategy == "gated" and shipped.config.chunk_size == recipe.chunk_size
    trained = to_melt(teacher, "elementwise", chunk_size=recipe.chunk_size)  # float32 weights, not the bf16 files
    trained.load_state_dict(torch.load(tmp_path / "melt" / "train_state.pt", weights_only=False)["model"])
    data = TaskData(
        TASKS, adapters.load(f"ouro:{teacher_dir}").tokenizer, 0, {k: v[:16] for k, v in items.items()}, synthetic.STOP
    )
    batch = data.collate(data.train, "cpu")
    chunk = recipe.chunk_size if chunkwise else batch.inputs.shape[1]
    with torch.no_grad():
        ref = teacher(batch.inputs, return_loop_logits=True).loop_logits
        gap = [
            T.distill_loss(
                m(batch.inputs, chunk_size=chunk, return_loop_logits=True).loop_logits, ref, batch.token_mask
            ).item()
            for m in (fresh, trained)
        ]
    assert gap[1] < 1e-3, gap  # per-loop KL to the teacher stays small at a = 1
    moved = max((a - b).abs().max().item() for a, b in zip(fresh.state_dict().values(), trained.state_dict().values()))
    assert moved > 1e-3, "conversion training changed the weights"
    assert info["teacher"] == f"ouro:{teacher_dir}"


@pytest.mark.numerics
def test_stage1_at_a0_reproduces_the_teacher(teacher_dir: Path, items: dict) -> None:
    """With kv_mix 0 the converted model, chunk-wise, computes exactly its LoopLM teacher's logits."""
    teacher = load_teacher(f"ouro:{teacher_dir}", "cpu")
    student = to_melt(teacher, "elementwise", chunk_size=4)
    data = TaskData(
        TASKS, adapters.load(f"ouro:{teacher_dir}").tokenizer, 0, {k: v[:8] for k, v in items.items()}, synthetic.STOP
    )
    batch = data.collate(data.train, "cpu")
    with torch.no_grad():
        ref = teacher(batch.inputs, return_loop_logits=True)
        out = student(batch.inputs, chunk_size=4, kv_mix=0.0, return_loop_logits=True)
    bound = rounding_bound(teacher, lambda: torch.stack(teacher(batch.inputs, return_loop_logits=True).loop_logits))
    for s, t in zip(out.loop_logits, ref.loop_logits):
        torch.testing.assert_close(
            s, t, atol=bound, rtol=0
        )  # two float32 paths: rounding alone (tests/support/rounding.py)
    assert T.distill_loss(out.loop_logits, ref.loop_logits, batch.token_mask).item() < 1e-6
    # and at a = 1 it is a different model (the gated K/V), which the ramp moves towards
    with torch.no_grad():
        melt = student(batch.inputs, chunk_size=4, kv_mix=1.0, return_loop_logits=True)
    assert (melt.logits - ref.logits).abs().max() > 1e-4


def test_chunk_size_one_training_forward_matches_decoding(teacher_dir: Path) -> None:
    """The training forward at chunk size 1 and the engine's token-by-token decoding give the same greedy text."""
    teacher = load_teacher(f"ouro:{teacher_dir}", "cpu")
    student: LoopedLM = to_melt(teacher, "elementwise", chunk_size=1, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # make the gate matter, so that a wrong latent would show
        for layer in student.shared:
            layer.melt_gate.w_z.bias.fill_(0.5)
    out = Path(teacher_dir).parent / "melt-chunk1"
    from adapters.engine.io.checkpoint import save_checkpoint

    save_checkpoint(student, out, tokenizer=adapters.load(f"ouro:{teacher_dir}").tokenizer)
    adapter = adapters.load(f"melt:{out}", dtype="float32", chunk_size=1)
    prompt = "a=3;b=a+4;b=?"
    gen = adapter.generate([prompt], adapters.Sampling(temperature=0, max_new_tokens=6))[0]
    ids = adapter.tokenizer.encode(prompt)
    with torch.no_grad():
        for _ in range(gen.generated_tokens):
            logits = student(torch.tensor([ids]), chunk_size=1, kv_mix=1.0).logits[0, -1]
            ids.append(int(logits.argmax()))
            decoded = torch.tensor(ids[-1:])
            if int(decoded) == adapter.tokenizer.eos_token_id:
                break
    assert ids[len(adapter.tokenizer.encode(prompt)) :][: len(gen.token_ids)] == gen.token_ids


def test_train_round_trips_and_resumes_exactly(tmp_path: Path, items: dict) -> None:
    """An interrupted run resumed from train_state.pt ends with the same weights as an uninterrupted one."""
    recipe = tiny("qwen3-tiny-small", 6)
    train(recipe, tmp_path / "straight", progress=False, items=items, stop=synthetic.STOP)
    assert train(recipe, tmp_path / "resumed", progress=False, items=items, stop=synthetic.STOP, until=3) is None
    assert not (tmp_path / "resumed" / "model.safetensors").exists()
    train(recipe, tmp_path / "resumed", progress=False, items=items, stop=synthetic.STOP)
    a = torch.load(tmp_path / "straight" / "train_state.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "resumed" / "train_state.pt", weights_only=False)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert losses(tmp_path / "straight") == pytest.approx(losses(tmp_path / "resumed"))
    # the shipped checkpoint is the trained weights in bf16, loadable by the engine
    loaded = adapters.load(f"qwen3:{tmp_path / 'straight'}", dtype="float32").model.state_dict()
    for key, value in a.items():
        torch.testing.assert_close(loaded[key], value.to(torch.bfloat16).float())


def test_decode_aligned_chunks_reproduce_melt_decoding(tmp_path: Path) -> None:
    """MELT trains and validates with `Batch.decode_chunks`: the prompt chunked back from its end, then
    one token at a time. Teacher-forced on the engine's own greedy output, that forward predicts
    exactly the tokens the engine decoded (chunk size 4, random weights so that tokens vary)."""
    from adapters.engine.io.checkpoint import random_model, save_checkpoint
    from adapters.engine.io.presets import preset
    from adapters.engine.io.tokenizer import char_tokenizer

    student = random_model(preset("melt-tiny").replace(chunk_size=4), seed=2, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for layer in student.shared:  # a gate that matters, so that a wrong latent would show
            layer.melt_gate.w_z.bias.fill_(0.5)
    tokenizer = char_tokenizer()
    save_checkpoint(student, tmp_path, tokenizer=tokenizer)
    adapter = adapters.load(f"melt:{tmp_path}", dtype="float32")
    prompt = tokenizer.encode("k=4;f=k+6;o=?")  # 14 tokens with <bos>: chunks 2 + 4 + 4 + 4
    gen = adapter.generate([prompt], adapters.Sampling(temperature=0, max_new_tokens=8))[0]
    data = TaskData(("chain2",), tokenizer, 0, {"chain2": [{"prompt": "a=1;a=?", "answer": "1"}]}, synthetic.STOP)
    batch = data.collate([(prompt + gen.token_ids, len(prompt))], "cpu")
    chunks = batch.decode_chunks(4)
    assert chunks == [2, 4, 4, 4] + [1] * (len(gen.token_ids) - 1)
    with torch.no_grad():
        aligned = student(batch.inputs, chunk_size=chunks).logits[0, len(prompt) - 1 :]
        as_prompt = student(batch.inputs, chunk_size=4).logits[0, len(prompt) - 1 :]
    assert len(set(gen.token_ids)) > 1
    assert aligned.argmax(-1).tolist() == gen.token_ids
    assert (aligned - as_prompt).abs().max() > 1e-3  # the whole sequence chunked as one prompt is another model


def test_a_torn_last_line_of_the_loss_log_is_ignored_on_resume_and_said(
    tmp_path: Path, items: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process killed while appending to losses.jsonl leaves half a line: resume drops it, says so, and the curve
    ends as an uninterrupted run's."""
    recipe = tiny("qwen3-tiny-small", 6)
    train(recipe, tmp_path / "straight", progress=False, items=items, stop=synthetic.STOP)
    assert train(recipe, tmp_path / "resumed", progress=False, items=items, stop=synthetic.STOP, until=3) is None
    with (tmp_path / "resumed" / "losses.jsonl").open("a") as log:
        log.write('{"step": 3, "lo')
    capsys.readouterr()
    info = train(recipe, tmp_path / "resumed", progress=False, items=items, stop=synthetic.STOP)
    assert "losses.jsonl: its last line was cut off (an interrupted write) and is ignored" in capsys.readouterr().err
    assert losses(tmp_path / "straight") == pytest.approx(losses(tmp_path / "resumed"))
    assert info is not None and info["final_loss"] == pytest.approx(losses(tmp_path / "straight")[-1])


def test_a_loss_that_is_not_finite_stops_training_and_writes_no_checkpoint(
    tmp_path: Path, items: dict, teacher_dir: Path
) -> None:
    """`distill_temperature = 0` trained to NaN, wrote a NaN checkpoint and exited 0; 0 is now out of the recipe's range,
    and a temperature that still overflows (a denormal: the teacher's logits over it are inf, inf - inf is NaN) stops
    the run at its step with one line. The folder holds no model (a resume point of finite weights at most)."""
    recipe = tiny("melt-tiny", 40, distill_temperature=1e-45)
    with pytest.raises(AdapterError, match=r"recipe melt-tiny: the loss is nan at step 0; training stopped") as caught:
        train(
            recipe,
            tmp_path / "out",
            progress=False,
            items=items,
            stop=synthetic.STOP,
            teacher_spec=f"ouro:{teacher_dir}",
        )
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out" / "model.safetensors").exists() and not (tmp_path / "out" / "train_info.json").exists()
