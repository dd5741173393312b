"""Training engine models on the CPU (or a GPU): the loop, checkpoints and loss curves (the data: `training.data`).

One function, `train(recipe, out_dir, items, stop=...)`, trains every zoo model. What differs between
models lives in the recipe (`adapters.zoo.Recipe`, read from adapters/zoo_data/recipes.toml) and in
the objective it selects (the losses are in `training.objectives`):

- `lm`: a plain transformer (Qwen3 layout), masked cross-entropy on the answer;
- `looplm`: an Ouro-style LoopLM, Ouro's entropy-regularised exit-gate objective over loops;
- `huginn`: Huginn's recurrent depth, a loop count drawn per step (log-normal Poisson around the mean
  recurrence) with backprop through its last loops only, cross-entropy on the final logits;
- `melt`: LoopLM -> MELT conversion from a frozen teacher, the paper's two stages
  (chunk-wise forward with KV interpolation `a` ramped 0 -> 1 and per-loop distillation; then
  the post-attention alignment loss with weight beta added).

The loop is plain AdamW with linear warmup, cosine decay and gradient clipping. Every batch is drawn
from a generator seeded by (seed, step), so a run resumed from its `train_state.pt` continues with
exactly the batches it would have seen. Loss curves go to `losses.jsonl`, the final weights to an
engine checkpoint directory (safetensors + config.json + tokenizer.json) with `train_info.json`
(steps, tokens, CPU minutes, validation accuracy) beside them.

The caller hands in the items (prompt/answer rows per task: `loopeval zoo` reads the synthetic
suite's train split) and the stop string answers end with; a slice of each task is held out as
validation for choices. Training never reads a suite itself.

This package imports the engine and the adapters' registry (a melt recipe's teacher is loaded by spec, through
`adapters.load`), and nothing under `adapters/` imports it: the import table of docs/architecture.md says so and
tests/test_layering.py checks it, so no import cycle hides inside a function.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

import torch

import adapters
from adapters.base import AdapterError
from adapters.engine.config import LoopConfig
from adapters.engine.io.checkpoint import save_checkpoint
from adapters.engine.io.tokenizer import char_tokenizer
from adapters.engine.model import LoopedLM, to_melt
from adapters.files import write_atomically
from training import objectives as T
from training.data import Batch, TaskData, answer_accuracy

if TYPE_CHECKING:
    from adapters.zoo import Recipe


# ---------------------------------------------------------------------------------- objectives
Objective = Callable[[LoopedLM, Batch, int], tuple[torch.Tensor, dict[str, float]]]


def make_objective(recipe: Recipe, teacher: LoopedLM | None) -> Objective:
    """The loss of one training step for the recipe's kind (see the module docstring)."""
    if recipe.kind == "lm":

        def lm(model: LoopedLM, b: Batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
            loss = T.lm_loss(model(b.inputs).logits, b.targets, b.answer_mask)
            return loss, {}

        return lm

    if recipe.kind == "looplm":

        def looplm(model: LoopedLM, b: Batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
            out = model(b.inputs, return_loop_logits=True)
            if out.exit_probs is None:  # no exit gate: plain loss on the last loop
                return T.lm_loss(out.logits, b.targets, b.answer_mask), {}
            return T.exit_gate_loss(out.loop_logits, out.exit_probs, b.targets, b.answer_mask, recipe.entropy_weight)

        return looplm

    if recipe.kind == "huginn":

        def huginn(model: LoopedLM, b: Batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
            no_grad, with_grad = T.sampled_recurrence(recipe.mean_recurrence, recipe.backprop_depth, recipe.seed, step)
            model.seed_state(
                recipe.seed * 1_000_003 + step
            )  # the step's initial-state draw, a function of (seed, step) too
            out = model(b.inputs, loops=no_grad + with_grad, grad_loops=with_grad)
            return T.lm_loss(out.logits, b.targets, b.answer_mask), {
                "loops": no_grad + with_grad,
                "grad_loops": with_grad,
            }

        return huginn

    assert teacher is not None

    def melt(model: LoopedLM, b: Batch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        stage2 = step >= recipe.stage2_start
        a = T.kv_mix(step, recipe.ramp_steps)
        chunk = b.decode_chunks(recipe.chunk_size) if recipe.chunkwise else b.inputs.shape[1]
        with torch.no_grad():
            ref = teacher(b.inputs, return_loop_logits=True, return_attn_outputs=stage2)
        out = model(b.inputs, chunk_size=chunk, kv_mix=a, return_loop_logits=True, return_attn_outputs=stage2)
        distill = T.distill_loss(out.loop_logits, ref.loop_logits, b.token_mask, recipe.distill_temperature)
        info = {"kv_mix": a, "distill": distill.item()}
        loss = distill
        if stage2:
            align = T.alignment_loss(
                [o for row in out.attn_outputs for o in row], [o for row in ref.attn_outputs for o in row], b.token_mask
            )
            info["align"] = align.item()
            loss = loss + recipe.beta * align
        return loss, info

    return melt


# ------------------------------------------------------------------------------------ memory
FLOAT32 = 4  # bytes: training computes and keeps its state in float32


def model_configs(recipe: Recipe, teacher_spec: str | None) -> tuple[LoopConfig, LoopConfig | None]:
    """The config the recipe trains and its teacher's (None without one), read from configs, before either is built."""
    if recipe.kind != "melt":
        return recipe.model_config(), None
    import adapters

    spec = teacher_spec or recipe.teacher
    facts = adapters.inspect(spec if ":" in spec else f"zoo:{spec}") or {}
    if not isinstance(facts.get("config"), dict):
        raise AdapterError(f"teacher {spec!r} is not an engine model, whose LoopLM a MELT conversion starts from")
    teacher = LoopConfig.from_dict(facts["config"])
    student = teacher.replace(
        family="melt", kv_strategy="gated", gate_variant=recipe.gate_variant, chunk_size=recipe.chunk_size
    )
    return student, teacher


def training_bytes(recipe: Recipe, student: LoopConfig, teacher: LoopConfig | None, length: int) -> int:
    """A floor of the memory training holds, in bytes, so that a recipe that cannot fit is refused before anything is
    allocated: the student's weights, gradients and AdamW's two moments (four float32 copies), the frozen teacher's
    weights, and what autograd keeps of one batch of `recipe.batch_size` rows of `length` positions. Per position and
    layer pass it keeps at least the block's inputs and norms (6 d), q, k, v and the attention output ((2 h + 2 kv) hd),
    the attention weights over the row (h x length) and the MLP's three activations (3 ffn); per position, the logits
    and their log-softmax of each loop that is scored (and the teacher's)."""
    from adapters.engine.memory import count_params

    cfg = student
    loops = (
        recipe.backprop_depth if recipe.kind == "huginn" else cfg.loops
    )  # huginn backpropagates through its last loops only
    passes = cfg.prelude_layers + cfg.shared_layers * loops + cfg.coda_layers
    attention = (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + cfg.num_heads * length
    per_pass = 6 * cfg.hidden_size + attention + 3 * cfg.ffn_size
    scored = cfg.loops if recipe.kind in ("looplm", "melt") else 1
    logits = 2 * cfg.vocab_size * scored + (cfg.vocab_size * teacher.loops if teacher is not None else 0)
    floats = 4 * count_params(cfg) + (count_params(teacher) if teacher is not None else 0)
    floats += recipe.batch_size * length * (passes * per_pass + logits)
    return FLOAT32 * floats


# -------------------------------------------------------------------------------------- models
def build_model(recipe: Recipe, device: str, teacher: LoopedLM | None) -> LoopedLM:
    """A seeded fresh model, or for `melt` the teacher's weights with fresh gates (the start of MELT stage 1)."""
    gen = torch.Generator().manual_seed(recipe.seed)
    if recipe.kind == "melt":
        assert teacher is not None
        # every variant prefills with the same chunk size at evaluation, whatever it was trained with
        student = to_melt(teacher, recipe.gate_variant, chunk_size=recipe.chunk_size, generator=gen)
        return student.to(device)
    model = LoopedLM(recipe.model_config())
    model.init_weights(gen)
    if model.model.early_exit_gate is not None:
        with torch.no_grad():  # a negative bias puts the first exits' mass on the last loop
            model.model.early_exit_gate.bias.fill_(recipe.exit_bias_init)
    return model.to(device)


def load_teacher(spec: str, device: str) -> LoopedLM:
    """The frozen LoopLM teacher: a zoo name (`ouro-tiny`) or any spec the engine loads (`ouro:PATH`)."""
    from adapters.engine.adapter import EngineAdapter

    adapter = adapters.load(spec if ":" in spec else f"zoo:{spec}", device=device, dtype="float32")
    if not isinstance(adapter, EngineAdapter):
        raise AdapterError(f"teacher {spec!r} is not an engine model (a zoo name, ouro:PATH or another engine spec)")
    model = adapter.model
    if model.config.kv_strategy != "per_loop" or model.config.shared_layers == 0:
        raise AdapterError(f"teacher {spec!r} is not a LoopLM (needs shared layers and kv_strategy per_loop)")
    model.requires_grad_(False)
    return model.eval()


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------------------------------- loop
class Trainer:
    """One training run: the model, AdamW over its trainable parameters, the data and the budget spent.

    `out_dir` receives `train_state.pt` (the resume point: weights, optimizer, step, budget) and
    `losses.jsonl` (the loss curve).
    """

    def __init__(
        self, recipe: Recipe, out_dir: Path, model: LoopedLM, objective: Objective, data: TaskData, device: str
    ) -> None:
        self.recipe, self.model, self.objective, self.data, self.device = recipe, model, objective, data, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=recipe.lr,
            betas=(0.9, 0.95),
        )
        self.state_path, self.log_path = out_dir / "train_state.pt", out_dir / "losses.jsonl"
        self.step, self.cpu_seconds, self.wall_seconds, self.tokens = 0, 0.0, 0.0, 0

    def _recipe_record(self) -> dict[str, Any]:
        record = asdict(self.recipe) | {"tasks": list(self.recipe.tasks)}
        if (
            self.recipe.kind != "huginn"
        ):  # fields only huginn reads: a resume point written before they existed still fits
            del record["mean_recurrence"], record["backprop_depth"]
        return record

    def resume(self) -> None:
        """Continue from train_state.pt when there is one; else start afresh (an old loss curve is dropped)."""
        if not self.state_path.is_file():
            self.log_path.unlink(missing_ok=True)
            return
        state = torch.load(self.state_path, map_location=self.device, weights_only=False)
        if state["recipe"] != self._recipe_record():
            raise AdapterError(f"{self.state_path} was written by a different recipe; use a fresh --out or --no-resume")
        self.model.load_state_dict(state["model"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as exc:  # one entry per parameter: states written before q/k/v and gate/up were fused differ
            raise AdapterError(
                f"{self.state_path}: its optimizer state does not fit this engine's parameters ({exc}); use --no-resume"
            ) from exc
        self.step, self.cpu_seconds, self.wall_seconds, self.tokens = (
            state["step"],
            state["cpu_seconds"],
            state["wall_seconds"],
            state["tokens"],
        )
        _truncate_log(self.log_path, self.step)

    def save(self) -> None:
        """The resume state, written whole or not at all: a kill mid-save leaves the previous state to resume from."""
        state = {
            "recipe": self._recipe_record(),
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
            "tokens": self.tokens,
        }
        write_atomically(self.state_path, lambda fh: torch.save(state, fh))

    def train_step(self) -> dict[str, Any] | None:
        """One optimizer step on the step's batch; its loss record on logging steps, else None."""
        recipe, step = self.recipe, self.step
        t_cpu, t_wall = time.process_time(), time.perf_counter()
        lr = T.lr_at(step, recipe.steps, recipe.lr, recipe.warmup_steps, recipe.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        b = self.data.batch(
            recipe.seed,
            step,
            recipe.batch_size,
            self.device,
            one_prompt_length=recipe.kind == "melt" and recipe.chunkwise,
        )
        loss, info = self.objective(self.model, b, step)
        if not torch.isfinite(loss):  # diverged: every later step, and the checkpoint, would hold NaN weights
            raise AdapterError(
                f"recipe {recipe.name}: the loss is {loss.item()} at step {step}; training stopped and no checkpoint "
                "was written (lower lr, or check distill_temperature and the other recipe values)"
            )
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)  # loss.backward(), which torch leaves unannotated
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, recipe.grad_clip)
        self.optimizer.step()
        self.step, self.tokens = step + 1, self.tokens + int(b.token_mask.sum())
        self.cpu_seconds += time.process_time() - t_cpu
        self.wall_seconds += time.perf_counter() - t_wall
        if step % recipe.log_every and step != recipe.steps - 1:
            return None
        return {"step": step, "loss": loss.item(), "lr": lr, "grad_norm": float(grad_norm), **info}

    def run(self, until: int, progress: bool) -> None:
        """Train up to step `until`, logging the loss curve and saving the resume point every `save_every` steps."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        recipe = self.recipe
        self.model.train()
        columns = [
            TextColumn(f"[bold]{recipe.name}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
        ]
        with Progress(*columns, disable=not progress) as bar:
            task_id = bar.add_task("train", total=recipe.steps, completed=self.step, info="")
            while self.step < until:
                record = self.train_step()
                if record is not None:
                    _log_line(self.log_path, record)
                    bar.update(task_id, info=f"loss {record['loss']:.4f}")
                    if not progress:
                        print(json.dumps(record), flush=True)
                bar.advance(task_id)
                if self.step % recipe.save_every == 0 and self.step < recipe.steps:
                    self.save()

    def info(self, teacher: str | None) -> dict[str, Any]:
        """train_info.json: the budget spent and held-out validation accuracy."""
        recipe, val = self.recipe, answer_accuracy(self.model, self.data, self.device)
        return {
            "name": recipe.name,
            "kind": recipe.kind,
            "params": count_params(self.model),
            "steps": recipe.steps,
            "batch_size": recipe.batch_size,
            "tokens": self.tokens,
            "cpu_minutes": round(self.cpu_seconds / 60, 2),
            "wall_minutes": round(self.wall_seconds / 60, 2),
            "seed": recipe.seed,
            "device": self.device,
            "teacher": teacher,
            "validation_accuracy": {k: round(v, 4) for k, v in val.items()},
            "final_loss": read_log(self.log_path)[-1]["loss"],
        }


def _log_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def read_log(path: Path) -> list[dict[str, Any]]:
    """The loss records of `losses.jsonl`. A torn last line (the process was killed while appending it) is
    dropped, and said so on stderr; a bad line before it means the file is not a loss curve (AdapterError)."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or type(record.get("step")) is not int:
                raise ValueError("not a loss record")
        except ValueError:
            if number < len(lines):
                raise AdapterError(
                    f"{path}, line {number}: not a loss record ({line[:60]!r}); use a fresh --out or --no-resume"
                ) from None
            print(
                f"loopeval: warning: {path}: its last line was cut off (an interrupted write) and is ignored",
                file=sys.stderr,
            )
            continue
        records.append(record)
    return records


def _truncate_log(path: Path, before_step: int) -> None:
    """Drop loss records from steps at or after `before_step` (they will be redone on resume), rewriting the
    file in one step."""
    if not path.is_file():
        return
    keep = [record for record in read_log(path) if record["step"] < before_step]
    write_atomically(path, "".join(json.dumps(record) + "\n" for record in keep).encode())


@torch.enable_grad()  # LightEval 0.13 turns autograd off process-wide when imported; training needs it
def train(
    recipe: Recipe,
    out_dir: Path,
    items: dict[str, list[dict[str, Any]]],
    *,
    stop: str,
    device: str = "cpu",
    resume: bool = True,
    progress: bool = True,
    teacher_spec: str | None = None,
    save_dtype: str = "bfloat16",
    until: int | None = None,
    fits: Callable[[str, int], None] | None = None,
) -> dict[str, Any] | None:
    """Train one zoo model into `out_dir` and return its train_info (also written as train_info.json).

    `out_dir` receives `train_state.pt` (resume point), `losses.jsonl` (loss curve) and, at the end,
    the engine checkpoint. `teacher_spec` overrides a melt recipe's teacher (e.g. `ouro:/ckpt`).
    `items` maps each of the recipe's tasks to its prompt/answer rows; `stop` ends every answer.
    `until` stops after that many steps with the resume point saved and returns None (a planned
    interruption). `fits(what, bytes)` raises when the memory training needs (`training_bytes`) is more than the
    device has; it is called before any model is built or any file written.
    """
    if device == "cuda" and not torch.cuda.is_available():
        raise AdapterError("--device cuda asked for, but torch sees no CUDA device")
    torch.manual_seed(recipe.seed)
    teacher_name = (teacher_spec or recipe.teacher) if recipe.kind == "melt" else None
    tokenizer = char_tokenizer()
    data = TaskData(recipe.tasks, tokenizer, recipe.val_items, items, stop)
    if fits is not None:
        fits(
            f"training {recipe.name}: weights, gradients, optimizer states and the activations of batch_size "
            f"{recipe.batch_size} x {data.longest} positions",
            training_bytes(recipe, *model_configs(recipe, teacher_name), data.longest),
        )
    teacher = load_teacher(teacher_name, device) if teacher_name is not None else None  # a MELT recipe's
    model = build_model(recipe, device, teacher)
    out_dir.mkdir(parents=True, exist_ok=True)  # only now: a teacher that fails to load leaves no empty folder
    trainer = Trainer(recipe, out_dir, model, make_objective(recipe, teacher), data, device)
    if resume:
        trainer.resume()
    else:
        trainer.log_path.unlink(missing_ok=True)
    trainer.run(min(recipe.steps, until or recipe.steps), progress)
    trainer.save()
    if until is not None and until < recipe.steps:
        return None
    info = trainer.info(teacher_name)
    model.config.extra = {**model.config.extra, "zoo": recipe.name}
    shipped = copy.deepcopy(model).to(getattr(torch, save_dtype))  # bf16 halves the package size
    # weights and train_info.json go in together: never new weights beside an earlier run's figures
    save_checkpoint(
        shipped, out_dir, tokenizer=tokenizer, extra_files={"train_info.json": json.dumps(info, indent=2) + "\n"}
    )
    return info
