"""The looped decoder: Qwen3, Ouro (LoopLM), MELT, Huginn and retrofitted Llamas from one `LoopConfig`, gpt-fast style.

Layers run as prelude (p), shared (s) x loops (r), coda (c) in `Backbone.run`, and every attention
call takes its earlier rows from a cache (`adapters.engine.kv.cache`). What differs between families (their
blocks, KV layout, recurrent state, norms between loops, chunked prefill) comes from the family's hooks
(`adapters.engine.families`), which build the backbone; the backbone runs whatever parts they gave it and
reads no family flag. Two entry points share them:

- `LoopedLM.forward(tokens, ...)`: full-sequence pass (autograd works) used by `forward_logits` and
  by training; its rows live in a `ChunkCache`. Gated (MELT) models run it chunk by chunk, exactly
  like prefill, and may blend the K/V attention sees, `KV = a * KV_melt + (1 - a) * KV_looplm`
  (stage-1 conversion training, a `MixedCache`); it can return per-loop logits, per-(loop, shared
  layer) attention outputs (stage-2 alignment loss) and Ouro's exit probabilities. What training and the
  probes ask of the loops beyond that travels in one `Taps` value, apart from what inference passes.
- `LoopedLM.step(tokens, positions, cache, slot, mask, loops=r)`: one prefill chunk or decode step
  against a preallocated `adapters.engine.kv.cache.KVCache` or an engine step's `adapters.engine.serving.paged.PagedStep`,
  written in place. The recurrent families draw each token's initial state there from its own
  random stream (`streams`, `families.recurrence.Recurrence`), not from a generator shared by the batch.
"""

from __future__ import annotations

import collections
import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from adapters.engine.kv.cache import Cache, ChunkCache, MixedCache
from adapters.engine.conditioning import LoopConditioning
from adapters.engine.config import LoopConfig
from adapters.engine.exits import ExitPolicy, ExitRows, exit_rows
from adapters.engine.families import Family, family_of
from adapters.engine.families.melt import GatedBlock, fresh_gate
from adapters.engine.families.ouro import exit_probabilities
from adapters.engine.kv.layouts import layout_of
from adapters.engine.layers import RMSNorm, Rotary, Span


class Backbone(nn.Module):
    """The layers and the order they run in (`run`); its tensors sit under HF's `model.` prefix so checkpoints map one to one."""

    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        p, s, family = cfg.prelude_layers, cfg.shared_layers, family_of(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        blocks = [family.block(i) for i in range(cfg.num_layers)]
        self.layers = nn.ModuleList(blocks)
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.early_exit_gate = family.exit_gate()
        self.loop_conditioning = LoopConditioning(cfg) if cfg.conditioned else None
        self.recurrence = family.state()
        self.embed_scale = family.embed_scale
        self.prelude, self.shared, self.coda = blocks[:p], blocks[p : p + s], blocks[p + s :]
        self.norm_each_loop = family.norm_each_loop  # Ouro's final norm after every loop, its output feeding the next
        self.norm_after_loops = family.norm_after_loops  # Huginn's after the last one

    def embed(self, tokens: Tensor) -> Tensor:
        h: Tensor = self.embed_tokens(tokens)
        return h if self.embed_scale is None else h * self.embed_scale

    def run(
        self,
        h: Tensor,
        span: Span,
        cache: Cache,
        loops: int,
        per_loop: bool,
        state_keys: Tensor | None = None,
        taps: Taps | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Prelude, shared x loops, coda over one call's states h [B, n, d].

        Returns the normed final state and, with `per_loop`, each loop's normed state (what per-loop
        logits and the exit gate read). `state_keys` [B, n]: each token's key for the recurrent families'
        initial state (`Recurrence.initial_state`). `taps` (a full-sequence forward's only) record, skip or
        stop differentiating loops for training and the probes; inference passes none.
        """
        cond = self.loop_conditioning
        h, e, diffs = self.enter(h, span, cache, state_keys)
        if taps is not None:
            taps.begin(h)
        states: list[Tensor] = []
        for t in range(loops if self.shared else 0):
            if taps is None:
                y, normed = self.loop(h, e, diffs, span, cache, t, per_loop, None)
            else:
                y, normed = taps.loop(
                    t,
                    loops,
                    h,
                    self.norm.forward if per_loop else None,
                    functools.partial(self.loop, h, e, diffs, span, cache, t, per_loop),
                )
            if cond is not None and t > 0:  # the history excludes e: the first difference is h_2 - h_1
                diffs.appendleft(y - h)
            h = y
            if taps is not None:
                taps.record(h)
            if per_loop and normed is not None:  # asked for, so computed
                states.append(normed)
        return self.tail(h, span, cache), states

    def tail(self, h: Tensor, span: Span, cache: Cache) -> Tensor:
        """What follows the loops: Huginn's norm, the coda layers, the final norm."""
        if self.norm_after_loops:
            h = self.norm.forward(h)
        first = len(self.prelude) + len(self.shared)
        for k, layer in enumerate(self.coda):
            h, _ = layer.forward(h, span, cache, first + k, 0)
        return self._final(h)

    def enter(
        self, h: Tensor, span: Span, cache: Cache, state_keys: Tensor | None
    ) -> tuple[Tensor, Tensor, collections.deque[Tensor]]:
        """The prelude, then what the first loop reads: (its state h, the prelude's output e, the empty history of
        differences h_(l-1) - h_(l-2), newest first). The recurrent families start h from their random state."""
        for i, layer in enumerate(self.prelude):
            h, _ = layer.forward(h, span, cache, i, 0)
        cond = self.loop_conditioning
        diffs: collections.deque[Tensor] = collections.deque(maxlen=cond.window if cond is not None else 1)
        e = h
        if self.recurrence is not None:
            h = self.recurrence.initial_state(e, state_keys)
        return h, e, diffs

    def loop(
        self,
        h: Tensor,
        e: Tensor,
        diffs: Sequence[Tensor],
        span: Span,
        cache: Cache,
        t: int,
        per_loop: bool,
        attn_outputs: list[Tensor] | None,
    ) -> tuple[Tensor, Tensor | None]:
        """Loop t (0-based) of the shared layers from state h: (the state it hands on, its normed state when asked)."""
        cond, p = self.loop_conditioning, len(self.prelude)
        x = h if cond is None else cond.loop_input(h, e, diffs)
        if self.recurrence is not None:
            x = self.recurrence.inject(h, e)
        y = x
        for j, layer in enumerate(self.shared):
            y, a = layer.forward(
                y, span, cache, p + j, t, None if cond is None else cond.branch_scales(t, j, y.shape[-1])
            )
            if attn_outputs is not None:
                attn_outputs.append(a)
        return self._loop_end(y if cond is None else cond.gated(x, y, t), per_loop)

    def _loop_end(self, h: Tensor, normed: bool) -> tuple[Tensor, Tensor | None]:
        """(state fed to the next loop, the loop's normed state when asked): sandwich models norm after every loop."""
        if self.norm_each_loop:
            h = self.norm.forward(h)
            return h, h
        return h, self.norm.forward(h) if normed else None

    def _final(self, h: Tensor) -> Tensor:
        """Normed state after the coda; sandwich models are already normed unless coda layers ran after the last loop."""
        if self.norm_each_loop and self.shared and not self.coda:
            return h
        return self.norm.forward(h)


@dataclass
class ForwardOutput:
    """What the full-sequence forward returns. Lists are indexed by loop t (0-based)."""

    logits: Tensor  # [B, N, V] from the final state
    loop_logits: list[Tensor] | None = None  # r x [B, N, V]: each loop's normed state through lm_head
    attn_outputs: list[list[Tensor]] | None = None  # [t][j] -> [B, N, d]: shared layer j's o_proj output at loop t
    exit_probs: Tensor | None = None  # [r, B, N]: Ouro exit distribution over loops


@dataclass
class LoopTrace:
    """What `Backbone.run` records for the probes: `states[0]` enters loop 1 (e), `states[l]` is loop l's
    output, each [B, n, d] as the next loop reads it; loops in `skip` (0-based) hand their input on.
    Chunked (gated) forwards record one list per chunk; `joined` puts them back along the sequence."""

    skip: frozenset[int] = frozenset()
    on_loop: Callable[[], None] | None = None  # called after each loop that ran, not skipped (a progress bar)
    chunks: list[list[Tensor]] = field(default_factory=list)

    def begin(self, e: Tensor) -> None:
        """A new call (chunk) starts with e, the state entering loop 1."""
        self.chunks.append([e.detach()])

    def record(self, h: Tensor) -> None:
        loop = len(self.chunks[-1]) - 1  # 0-based: the chunk starts with the state entering loop 1
        self.chunks[-1].append(h.detach())
        if self.on_loop is not None and loop not in self.skip:
            self.on_loop()

    def joined(self) -> list[Tensor]:
        return [torch.cat(parts, dim=1) for parts in zip(*self.chunks)]


@dataclass
class Taps:
    """What a full-sequence forward asks of the loops besides the states inference needs (`Backbone.run`).

    `attn_outputs`: the shared layers' attention outputs are appended here, loop-major (the stage-2 alignment
    loss). `trace` (the probes) records the state entering loop 1 and each loop's output, and may skip loops: a
    skipped loop hands its input on unchanged. With `grad_loops` = k only the last k loops are differentiated
    (truncated backprop, as Huginn trains): the loops before them run without autograd, a constant to the rest.
    """

    attn_outputs: list[Tensor] | None = None
    trace: LoopTrace | None = None
    grad_loops: int | None = None

    def begin(self, e: Tensor) -> None:
        if self.trace is not None:
            self.trace.begin(e)

    def record(self, h: Tensor) -> None:
        if self.trace is not None:
            self.trace.record(h)

    def loop(
        self,
        t: int,
        loops: int,
        h: Tensor,
        norm: Callable[[Tensor], Tensor] | None,
        run: Callable[[list[Tensor] | None], tuple[Tensor, Tensor | None]],
    ) -> tuple[Tensor, Tensor | None]:
        """Loop t of `loops` from state h: skipped (h handed on, its normed state by `norm` when asked), or
        `run(attn_outputs)`, without autograd before the last `grad_loops`."""
        if self.trace is not None and t in self.trace.skip:
            return h, None if norm is None else norm(h)
        no_grad = self.grad_loops is not None and t < loops - self.grad_loops
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            return run(self.attn_outputs)


@dataclass
class StepOutput:
    """What a cached step returns, for the last position of each row only (what sampling needs)."""

    states: list[Tensor]  # normed final states [B, d]; one per loop when keep_loops, else one
    loops_run: Tensor | None = None  # [B]: the loops each row ran, under a policy that skips loops


class LoopedLM(nn.Module):
    def __init__(self, cfg: LoopConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.prelude, self.shared, self.coda = (
            self.model.prelude,
            self.model.shared,
            self.model.coda,
        )  # the layer groups, by name

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded random init: normal(0, std) matrices and embeddings, unit norms, zero biases."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if (bias := getattr(module, "bias", None)) is not None:
                    bias.zero_()
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
        for layer in [*self.prelude, *self.shared, *self.coda]:  # the layers, in order
            layer.init_extra(generator, std)  # what the family adds to its blocks (MELT's gates, Huginn's q/k biases)
        if self.model.loop_conditioning is not None:
            for param in self.model.loop_conditioning.parameters():
                param.zero_()  # the identity: conditioning starts as the plain looped model

    def seed_state(self, seed: int, scale: float = 1.0) -> None:
        """Seed the recurrent families' initial-state draws (`Recurrence`) and scale their std (0: the zero state); other families have none."""
        if self.model.recurrence is not None:
            self.model.recurrence.reseed(seed, scale)

    @property
    def draws_state(self) -> bool:
        """Whether calls draw a random initial state (huginn, retrofit at a scale > 0): `step` needs `streams`, the adapter no graph."""
        rec = self.model.recurrence
        return rec is not None and rec.scale > 0

    def logits(self, normed: Tensor) -> Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(normed, weight)

    def exit_gate_logits(self, states: list[Tensor]) -> Tensor | None:
        """[r, ...] Ouro exit-gate logits of each loop's normed state (None without an exit gate)."""
        gate = self.model.early_exit_gate
        return None if gate is None else torch.stack([gate(z).squeeze(-1) for z in states])

    # ------------------------------------------------------------------- full-sequence forward
    def forward(
        self,
        tokens: Tensor,
        *,
        loops: int | None = None,
        chunk_size: int | Sequence[int] | None = None,
        kv_mix: float | None = None,
        return_loop_logits: bool = False,
        return_attn_outputs: bool = False,
        trace: LoopTrace | None = None,
        grad_loops: int | None = None,
    ) -> ForwardOutput:
        """Full-sequence forward (autograd works). tokens [B, N], no padding.

        Gated models run chunk-wise: `chunk_size` (default the config's) is cut as generation's prefill
        cuts a prompt (`prefill_chunks`: counted back from the last token, so the last position's
        logits are the first generated token's), or is a list of chunk lengths summing to N (e.g. a
        prompt's chunks followed by 1s for decoded tokens). They blend attention's K/V as
        `kv_mix * KV_melt + (1 - kv_mix) * KV_looplm` (default 1: pure MELT; 0 reproduces the LoopLM
        with the same weights exactly). Other strategies ignore both arguments. `trace` records (and
        may skip) loops for the probes (`LoopTrace`). `grad_loops` = k differentiates only the last k loops
        (Huginn's truncated backprop). Both reach the loops as one `Taps` value.
        """
        r = self.config.check_loops(loops if loops is not None else self.config.loops)
        b, n = tokens.shape
        family = family_of(self.config)  # of the config now: loading may replace it (chunk size, token ids)
        cache = forward_cache(family, r, kv_mix)
        per_loop = bool(self.shared) and (return_loop_logits or self.model.early_exit_gate is not None)
        finals, states, attn = [], [], []
        for s0, s1 in family.forward_chunks(n, chunk_size):
            h = self.model.embed(tokens[:, s0:s1])
            positions = torch.arange(s0, s1, device=tokens.device).expand(b, -1)
            span = Span(self.rotary(positions, h.dtype), s0, None if s0 == 0 else causal_mask(s0, s1, tokens.device))
            outputs: list[Tensor] | None = [] if return_attn_outputs else None
            final, loop_states = self.model.run(h, span, cache, r, per_loop, taps=Taps(outputs, trace, grad_loops))
            attn.append(outputs or [])
            finals.append(final)
            states.append(loop_states)
        return self._forward_output(finals, states, attn if return_attn_outputs else None, return_loop_logits)

    def _forward_output(
        self, finals: list[Tensor], states: list[list[Tensor]], attn: list[list[Tensor]] | None, loop_logits: bool
    ) -> ForwardOutput:
        """The chunks' results joined along the sequence."""

        def join(parts: Sequence[Tensor]) -> Tensor:
            return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=1)

        out = ForwardOutput(logits=self.logits(join(finals)))
        per_loop = [join(chunks) for chunks in zip(*states)]  # r x [B, N, d]
        if per_loop:
            out.loop_logits = [self.logits(z) for z in per_loop] if loop_logits else None
            gate_logits = self.exit_gate_logits(per_loop)
            out.exit_probs = None if gate_logits is None else exit_probabilities(gate_logits)
        if attn is not None:
            s, outputs = len(self.shared), [join(chunks) for chunks in zip(*attn)]
            out.attn_outputs = [outputs[i : i + s] for i in range(0, len(outputs), s)]
        return out

    # ------------------------------------------------------------------------------ cached step
    def step(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        slot: int,
        mask: Tensor | None,
        *,
        loops: int,
        keep_loops: bool = False,
        exits: ExitPolicy | None = None,
        active_set: bool = True,
        ran: Tensor | None = None,
        streams: Tensor | None = None,
    ) -> StepOutput:
        """Run tokens [B, n] at cache slots slot..slot+n-1 (positions [B, n]), writing K/V in place.

        `mask` [B,1,n,L] bool (L: the keys attended, slot + n for a `KVCache`), or None for plain causal attention over
        slot + n keys. For gated caches n must not exceed the cache's latent chunk. Returns the last position's normed
        state(s). A decode step (n = 1) under an `exits` policy that skips loops stops each row at its exit: on an active
        set (`active_set`, the cache a step that can `narrow`) or as the masked full step (`adapters.engine.exits`); `ran`
        [B, L]: the loops each key ran. `streams` [B, n]: the stream each token draws its initial state from (`Recurrence`).
        """
        recurrence = self.model.recurrence if self.draws_state else None
        state_keys = None if recurrence is None else recurrence.token_keys(streams, positions)
        h = self.model.embed(tokens)
        keys = slot + tokens.shape[1] if mask is None else mask.shape[-1]
        span = Span(
            self.rotary(positions, h.dtype, length=keys), slot, mask
        )  # a position never reaches the keys' count
        if exits is not None and exits.skips and tokens.shape[1] == 1 and self.shared:
            rows = exit_rows(exits, loops, self.model.early_exit_gate, span, cache, h, active_set, ran)
            final = run_exits(self.model, h, span, cache, loops, rows, self.logits, state_keys)
            return StepOutput(states=[final[:, -1]], loops_run=rows.loops_run)
        final, states = self.model.run(h, span, cache, loops, keep_loops and bool(self.shared), state_keys=state_keys)
        return StepOutput(states=[z[:, -1] for z in states] if states else [final[:, -1]])


# ------------------------------------------------------------------------------ conversion
def with_conditioning(model: LoopedLM, **fields: Any) -> LoopedLM:
    """`model` with loop conditioning options changed (`LoopConfig` fields injection, history,
    history_window, loop_gate): new conditioning tensors start at zero, so the logits are unchanged."""
    cfg = model.config.replace(**fields)
    weight = model.model.embed_tokens.weight
    conditioned = LoopedLM(cfg).to(device=weight.device, dtype=weight.dtype)  # conditioning tensors are built as zeros
    own = conditioned.state_dict()
    conditioned.load_state_dict(
        {k: v for k, v in model.state_dict().items() if k in own and own[k].shape == v.shape}, strict=False
    )
    return conditioned.train(model.training)


def to_melt(
    looplm: LoopedLM,
    gate_variant: str = "elementwise",
    chunk_size: int | None = None,
    generator: torch.Generator | None = None,
) -> LoopedLM:
    """A gated MELT model with `looplm`'s weights and fresh gates (the starting point of conversion training)."""
    cfg = looplm.config.replace(
        family="melt",
        kv_strategy="gated",
        kv_policy=None,
        gate_variant=gate_variant,
        chunk_size=chunk_size or looplm.config.chunk_size,
    )
    weight = looplm.model.embed_tokens.weight
    melt = LoopedLM(cfg).to(device=weight.device, dtype=weight.dtype)
    melt.load_state_dict(looplm.state_dict(), strict=False)
    gen = generator or torch.Generator(device=weight.device).manual_seed(0)
    with torch.no_grad():
        for gate in (layer.melt_gate for layer in melt.shared if isinstance(layer, GatedBlock)):  # all of them
            fresh_gate(gate, gen)
    return melt


# ------------------------------------------------------------------------ the exit-aware decode step
def run_exits(
    backbone: Backbone,
    h: Tensor,
    span: Span,
    cache: Cache,
    loops: int,
    rows: ExitRows,
    head: Callable[[Tensor], Tensor],
    state_keys: Tensor | None = None,
) -> Tensor:
    """A decode step of `backbone` whose rows stop looping where their exit policy says (`adapters.engine.exits`): prelude,
    the loops while any row goes on (`rows` says which rows each loop runs on and on what span and cache),
    then the tail once on every row's state at its exit. `head` maps normed states to logits (kl, entropy);
    `state_keys` as for `run`."""
    cond = backbone.loop_conditioning
    h, e, diffs = backbone.enter(h, span, cache, state_keys)

    def logits(y: Tensor, sp: Span, c: Cache) -> Tensor:
        return head(backbone.tail(y, sp, c))

    for t in range(loops):
        y, normed = backbone.loop(h, e, diffs, rows.loop_span(t), rows.cache, t, True, None)
        assert normed is not None  # per_loop asks for it
        # the history excludes e: the first difference is h_2 - h_1
        diff = [y - h] if cond is not None and t > 0 else []
        h, carried = rows.after_loop(t, h, y, normed, [e, *diff, *diffs], logits)
        if rows.done:
            break
        window = diffs.maxlen or 1  # the deque is made with its length
        e, diffs = carried[0], collections.deque(carried[1 : 1 + window], maxlen=window)  # the newest differences
    return backbone.tail(rows.final, span, cache)


def forward_cache(family: Family, loops: int, kv_mix: float | None) -> ChunkCache | MixedCache:
    """A forward's rows: the model's own, or, for a family that blends with a reference layout (MELT's LoopLM),
    read as the reference (kv_mix 0) or as both blended."""
    a = 1.0 if kv_mix is None else float(kv_mix)
    reference = family.kv_reference
    if reference is None or a == 1:
        return ChunkCache(family.cfg, layout_of(family.cfg), loops)
    blended = ChunkCache(family.cfg, reference, loops)
    return blended if a == 0 else MixedCache(a, ChunkCache(family.cfg, layout_of(family.cfg), loops), blended)


def causal_mask(s0: int, s1: int, device: torch.device) -> Tensor:
    """Bool [1,1,n,s1]: query at slot s0+i sees keys 0..s0+i."""
    q = torch.arange(s0, s1, device=device)[:, None]
    return (torch.arange(s1, device=device)[None, :] <= q)[None, None]
