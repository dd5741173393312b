"""One config for every family the engine runs: `p` prelude layers, `s` shared layers looped `T` times, `c` coda layers.

Qwen3 is a plain stack (`s` layers, `T = 1`, `standard` KV); Ouro is `p = c = 0` with `s` shared
layers looped 4 times, sandwich norms and a `per_loop` KV cache; MELT is Ouro plus a per-layer
gate and a `gated` KV cache whose size does not depend on the loop count. Huginn (recurrent depth)
is `p, s, c` with a random initial state and input injection, one `per_loop` entry per step
(`LoopConfig.huginn` names everything the family implies). Retrofitted recurrence (a pretrained
Llama cut into prelude, recurrent core and coda) keeps Huginn's recurrent state and injection
(`LoopConfig.recurrent`) around plain pre-norm Llama blocks with grouped-query attention. See docs/architecture.md for the
vocabulary. Validation raises `AdapterError` naming the field and the allowed values, because the
config reaches users through presets, checkpoints' config.json and `--loops` overrides.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from adapters.base import MAX_CONTEXT, AdapterError
from adapters.engine.kv.policies import KV_DTYPES, check_kv_policy

KV_STRATEGIES = ("standard", "per_loop", "gated")
NORM_LAYOUTS = ("pre", "sandwich")
GATE_VARIANTS = ("elementwise", "scalar", "last", "mean", "ema")
FAMILIES = ("qwen3", "ouro", "melt", "huginn", "retrofit", "ifm", "custom")
IFM_INJECTIONS = ("diagonal", "linear", "orthogonal")  # the IFM Part II recurrence's input injections (`families.ifm`)
ROPE_SCALING_KEYS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)  # Llama 3's, the one kind read
MIX_KINDS = ("none", "scalar", "channel", "dense")  # shape of an injection matrix: 1, d or d x d parameters
CONDITIONING_FIELDS = (
    "injection",
    "history",
    "history_window",
    "loop_gate",
    "branch_gate",
)  # also load overrides of engine specs
LOOP_GATE_DIM = 8  # Loop Gating: one learned vector of this size per loop position, one entry per channel group
MAX_LOOPS = 1024  # loop counts beyond any real run (the paper uses r <= 8): a typo, and hours of compute
ENGINE_FORMAT = "loopeval-engine"  # config.json of engine checkpoints: {"format": ENGINE_FORMAT, "config": {...}}


@dataclass
class LoopConfig:
    """Shapes and behaviour of one looped decoder. Layers run as prelude, shared x loops, coda."""

    family: str = "custom"
    vocab_size: int = 99
    hidden_size: int = 128
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32  # may differ from hidden_size / num_heads (Qwen3 does this)
    ffn_size: int = 384  # SwiGLU intermediate size
    prelude_layers: int = 0  # p
    shared_layers: int = 2  # s
    coda_layers: int = 0  # c
    loops: int = 1  # T, the trained loop count (inference may override it with r)
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, float] | None = (
        None  # Llama 3's frequency scaling (ROPE_SCALING_KEYS), as Llama-3.2 and its retrofits use
    )
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    norm_layout: str = "pre"  # "pre" (Qwen3) or "sandwich" (Ouro: final norm after every loop; Huginn: see `huginn`)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    kv_strategy: str = "standard"
    gate_variant: str = "elementwise"  # MELT gate, used when kv_strategy == "gated"
    ema_decay: float = 0.5  # decay of the "ema" gate variant
    chunk_size: int = 64  # MELT prefill chunk (tokens processed in parallel); 1 == token by token
    exit_gate: bool = False  # Ouro's early-exit gate Linear(d, 1) on each loop's normed state
    # Loop conditioning (the recurrence study's options; all off by default, all zero-initialised so a
    # converted model starts unchanged; conditioning.LoopConditioning has the formulas):
    injection: str = "none"  # initial-state injection: loop input += A e, e the state entering loop 1 (MIX_KINDS)
    history: str = "none"  # history-state injection: loop l input += sum_j B_j (h_{l-j} - h_{l-j-1}) (MIX_KINDS)
    history_window: int = 1  # w, the lags the history injection reads
    loop_gate: bool = (
        False  # Loop Gating: loop t's net update scaled by 1 + tanh(g_t), g_t of LOOP_GATE_DIM per loop position
    )
    branch_gate: bool = False  # branch gating: each shared layer's attention and MLP outputs at loop t scaled the same way, each its own g
    state_std: float | None = (
        None  # std of the recurrent families' random initial state (`families.recurrence.Recurrence`); None: sqrt(2 / (5 d))
    )
    exit_threshold: float | None = (
        None  # Ouro's early_exit_threshold: the default exit policy (adapters.engine.adapter)
    )
    max_position: int = 40960  # longest context (prompt + generated) the model accepts
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    kv_policy: str | None = (
        None  # a KV policy run instead of the native one (`adapters.engine.kv.policies`; None: the kv_strategy's own)
    )
    kv_dtype: str = "auto"  # K/V storage: auto (the model's dtype), int8 or fp8 with a scale per token and head
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes (source checkpoint...)
    # The IFM Part II recurrence (`families.ifm`): the input injection, an RMSNorm with weight on the injected prelude
    # output (Parcae-Decay), a parameter-free RMSNorm after every recurrence (Huginn-Linear).
    ifm_injection: str = "diagonal"
    ifm_prelude_norm: bool = False
    ifm_exit_norm: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_layers(self) -> int:
        """Physical layers (parameters), not executed layer calls."""
        return self.prelude_layers + self.shared_layers + self.coda_layers

    @property
    def gated(self) -> bool:
        """MELT's KV: one gated row per layer and token, overwritten across loops, and a latent h per shared layer."""
        return self.kv_strategy == "gated"

    @property
    def huginn(self) -> bool:
        """Huginn-0125's recurrent depth: qk bias, embeddings times sqrt(d), every residual sum normed
        (`families.huginn.HuginnBlock`), a random initial state and the injection W [h; e] at every step (`families.recurrence.Recurrence`)."""
        return self.family == "huginn"

    @property
    def recurrent(self) -> bool:
        """Huginn-style recurrence (Huginn-0125 and the retrofitted models): a random initial state, and the core
        run on the injection W [h; e] of the state and the prelude's output at every step (`families.recurrence.Recurrence`)."""
        return self.family in ("huginn", "retrofit")

    @property
    def sandwich(self) -> bool:
        """Ouro's norm layout: each sublayer's output normed too, and the final norm applied after every loop."""
        return self.norm_layout == "sandwich"

    def check_loops(self, loops: int) -> int:
        """Validate an inference loop count r for this model and return it."""
        if not isinstance(loops, int) or isinstance(loops, bool) or not 1 <= loops <= MAX_LOOPS:
            raise AdapterError(f"loops must be an integer from 1 to {MAX_LOOPS}, got {loops!r}")
        if self.kv_strategy == "standard" and self.shared_layers > 0 and loops > 1:
            raise AdapterError(
                f"loops={loops} needs kv_strategy 'per_loop' or 'gated': a 'standard' cache holds one K/V entry per "
                "layer, so its shared layers cannot loop (use loops=1)"
            )
        return loops

    def validate(self) -> None:
        """Every field checked, the first bad one raised as an `AdapterError` that names it."""
        _check_types(self)
        _check_conditioning(self)
        _check_shape(self)
        _check_layout(self)
        _check_values(self)

    @property
    def conditioned(self) -> bool:
        """Whether any loop conditioning option is on (the model then carries `LoopConditioning`)."""
        return self.injection != "none" or self.history != "none" or self.loop_gate or self.branch_gate

    def replace(self, **changes: Any) -> LoopConfig:
        """A validated copy with some fields changed (unknown fields raise AdapterError)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise AdapterError(f"unknown config field(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> LoopConfig:
        if not isinstance(data, dict):
            raise AdapterError(f"an engine config must be a table of LoopConfig fields, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise AdapterError(
                f"unknown config field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(names))})"
            )
        return cls(**data)


# ------------------------------------------------------------------ the checks `validate` runs
_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "ffn_size",
    "chunk_size",
    "max_position",
    "history_window",
)
_LAYERS = ("prelude_layers", "shared_layers", "coda_layers")


def _check_types(cfg: LoopConfig) -> None:
    """Each field's type and range on its own: counts, flags, the loop count, the context, the named choices."""
    for name in _SIZES:
        _at_least(cfg, 1, name)
    for name in _LAYERS:
        _at_least(cfg, 0, name)
    for name in (
        "tie_embeddings",
        "qk_norm",
        "exit_gate",
        "loop_gate",
        "branch_gate",
        "ifm_prelude_norm",
        "ifm_exit_norm",
    ):
        if not isinstance(getattr(cfg, name), bool):
            raise AdapterError(f"config field {name} must be true or false, got {getattr(cfg, name)!r}")
    if not isinstance(cfg.loops, int) or isinstance(cfg.loops, bool) or not 1 <= cfg.loops <= MAX_LOOPS:
        raise AdapterError(
            f"config field loops must be an integer from 1 (no looping) to {MAX_LOOPS}, got {cfg.loops!r}"
        )
    if cfg.max_position > MAX_CONTEXT:
        raise AdapterError(
            f"config field max_position (the context) must be at most {MAX_CONTEXT} tokens, got {_shown(cfg.max_position)}"
        )
    for name in (*_SIZES, *_LAYERS):
        if getattr(cfg, name) > MAX_SIZE:
            raise AdapterError(f"config field {name} must be at most {MAX_SIZE}, got {_shown(getattr(cfg, name))}")
    for name in ("rope_theta", "norm_eps"):
        _positive_number(cfg, name)
    for name, allowed in (
        ("family", FAMILIES),
        ("kv_strategy", KV_STRATEGIES),
        ("norm_layout", NORM_LAYOUTS),
        ("gate_variant", GATE_VARIANTS),
        ("injection", MIX_KINDS),
        ("history", MIX_KINDS),
        ("ifm_injection", IFM_INJECTIONS),
    ):
        _one_of(cfg, name, allowed)


def _check_layout(cfg: LoopConfig) -> None:
    """The KV strategy and the exit gate against the layers that carry them."""
    if cfg.gated and cfg.shared_layers == 0:
        raise AdapterError("config kv_strategy 'gated' needs shared_layers >= 1 (the gate lives in the shared layers)")
    if cfg.kv_strategy == "standard" and cfg.shared_layers > 0 and cfg.loops > 1:
        raise AdapterError(
            f"config kv_strategy 'standard' cannot loop shared layers (loops={cfg.loops}); use 'per_loop' or 'gated', or loops=1"
        )
    if cfg.exit_gate and cfg.shared_layers == 0:
        raise AdapterError("config exit_gate needs shared_layers >= 1 (it reads each loop's state)")


# The largest size field (a vocabulary, a width, a layer count): beyond any released model's (vocabularies reach 256k),
# so the sizes computed from them (parameters, bytes) stay finite floats; JSON's integers have no bound.
MAX_SIZE = 1 << 24


def _shown(value: Any) -> str:
    """A config value in an error line: a huge integer by its digit count, not its 400 digits."""
    return f"an integer of {len(str(value))} digits" if type(value) is int and value > MAX_SIZE**2 else repr(value)


def _at_least(cfg: LoopConfig, low: int, name: str) -> None:
    """Field `name` is an integer of at least `low` (0 or 1); `_check_types` bounds it by `MAX_SIZE` too."""
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise AdapterError(
            f"config field {name} must be {'a positive integer' if low else 'an integer >= 0'}, got {value!r}"
        )


def _positive_number(cfg: LoopConfig, name: str) -> None:
    """Field `name` is a number above 0 that is a finite float (an integer too large for one overflows)."""
    value = getattr(cfg, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise AdapterError(f"config field {name} must be a finite number > 0, got {_shown(value)}")
    if type(value) is int and value > MAX_SIZE**4:  # far above any theta or epsilon, and below a float's range
        raise AdapterError(f"config field {name} must be a finite number > 0, got {_shown(value)}")


def _check_shape(cfg: LoopConfig) -> None:
    """Heads that group (GQA), an even head dim (RoPE), at least one layer."""
    if cfg.num_heads % cfg.num_kv_heads:
        raise AdapterError(
            f"config field num_heads={cfg.num_heads} must be divisible by num_kv_heads={cfg.num_kv_heads} (grouped-query attention)"
        )
    if cfg.head_dim % 2:
        raise AdapterError(f"config field head_dim must be even (RoPE rotates pairs), got {cfg.head_dim}")
    if cfg.num_layers == 0:
        raise AdapterError("config needs at least one layer: prelude_layers + shared_layers + coda_layers is 0")


def _one_of(cfg: LoopConfig, name: str, allowed: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in allowed:
        raise AdapterError(f"config field {name}={getattr(cfg, name)!r} is not one of {', '.join(allowed)}")


def _check_values(cfg: LoopConfig) -> None:
    """The exit threshold, the EMA decay, the token ids, what the recurrent families need, the RoPE scaling, and the
    free-form notes (a table: loaders read their stop ids from it)."""
    if not isinstance(cfg.extra, dict):
        raise AdapterError(f"config field extra must be a table of notes, got {cfg.extra!r}")
    threshold = cfg.exit_threshold
    if threshold is not None and not (
        cfg.exit_gate and type(threshold) in (int, float) and 0 < threshold <= 1
    ):  # NaN fails too
        raise AdapterError(
            f"config field exit_threshold (Ouro's early_exit_threshold) must be in (0, 1] on a model with an exit gate, got {cfg.exit_threshold!r}"
        )
    if type(cfg.ema_decay) not in (int, float) or not 0 <= cfg.ema_decay < 1:
        raise AdapterError(f"config field ema_decay must be in [0, 1), got {cfg.ema_decay!r}")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(cfg, name)
        if value is not None and (type(value) is not int or not 0 <= value < cfg.vocab_size):
            raise AdapterError(f"config field {name}={value} must be in [0, vocab_size={cfg.vocab_size})")
    if cfg.huginn and (cfg.norm_layout != "sandwich" or cfg.num_kv_heads != cfg.num_heads):
        raise AdapterError(
            "config family 'huginn' needs norm_layout 'sandwich' (its SandwichBlock) and num_kv_heads == num_heads"
        )
    if cfg.family == "retrofit" and (cfg.norm_layout != "pre" or cfg.qk_norm):
        raise AdapterError(
            "config family 'retrofit' needs norm_layout 'pre' and no qk_norm (the Llama blocks it was cut from)"
        )
    if cfg.recurrent and (cfg.kv_strategy != "per_loop" or cfg.shared_layers == 0 or cfg.exit_gate or cfg.conditioned):
        raise AdapterError(
            f"config family {cfg.family!r} needs kv_strategy 'per_loop', shared_layers >= 1, and no exit gate or loop conditioning"
        )
    if cfg.family == "ifm" and (
        cfg.norm_layout != "pre" or cfg.qk_norm or cfg.kv_strategy != "per_loop" or cfg.shared_layers == 0
    ):
        raise AdapterError(
            "config family 'ifm' needs norm_layout 'pre', no qk_norm, kv_strategy 'per_loop' and shared_layers >= 1 "
            "(the Llama blocks of its prelude, recurrent block and coda)"
        )
    if cfg.state_std is not None and (
        not cfg.recurrent or type(cfg.state_std) not in (int, float) or not 0 < cfg.state_std < math.inf
    ):
        raise AdapterError(
            f"config field state_std must be a finite number > 0 on a huginn or retrofit model, got {cfg.state_std!r}"
        )
    _check_rope_scaling(cfg.rope_scaling)
    _check_kv(cfg)


def _check_kv(cfg: LoopConfig) -> None:
    """The KV dtype, and a KV policy the model's own strategy admits (a looped model's sharing, MELT's gate, ...)."""
    _one_of(cfg, "kv_dtype", KV_DTYPES)
    if cfg.kv_dtype != "auto" and cfg.head_dim % 4:
        raise AdapterError(
            f"kv_dtype {cfg.kv_dtype} needs head_dim divisible by 4 (a row keeps its float32 scale), got {cfg.head_dim}"
        )
    if cfg.kv_policy is not None:
        check_kv_policy(cfg.kv_policy, cfg.kv_strategy, cfg.family, cfg.recurrent)


def _check_rope_scaling(scaling: Any) -> None:
    """None, or Llama 3's scaling: exactly ROPE_SCALING_KEYS, each a finite number > 0, the high factor above the low one."""
    if scaling is None:
        return
    if (
        not isinstance(scaling, dict)
        or set(scaling) != set(ROPE_SCALING_KEYS)
        or not all(type(v) in (int, float) and 0 < v < math.inf for v in scaling.values())
    ):
        raise AdapterError(
            f"config field rope_scaling must be None or Llama 3's {{{', '.join(ROPE_SCALING_KEYS)}}}, each > 0, got {scaling!r}"
        )
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise AdapterError(f"config field rope_scaling: high_freq_factor must exceed low_freq_factor, got {scaling!r}")


def _check_conditioning(cfg: LoopConfig) -> None:
    if cfg.conditioned and cfg.shared_layers == 0:
        raise AdapterError(
            "config fields injection, history, loop_gate and branch_gate need shared_layers >= 1 (they condition the loops)"
        )
    for name in ("loop_gate", "branch_gate"):
        if getattr(cfg, name) and cfg.hidden_size % LOOP_GATE_DIM:
            raise AdapterError(
                f"config {name} needs hidden_size divisible by {LOOP_GATE_DIM} (one gate entry per channel group), got {cfg.hidden_size}"
            )
