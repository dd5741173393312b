"""The measure vocabulary: every memory measure's name, unit, kind and label, the byte units, the analytic
formula, and the compute measures (`COMPUTE_MEASURES`: loops and layer passes per token, speed, energy).

One home for what the engine, the memory sampler, `loopeval profile` / `estimate`, the store and the
dashboards call a measure, so a name means the same thing everywhere: `kv_bytes_reserved` in a tick
is the live reading, and the `kv_bytes_reserved` row of a run's peaks is its maximum over the run
(the peaks table is "the maximum over the run"; `memory_peaks.kind` says "fixed" for a size such as
the weights, which is not a peak).

Pure standard library, importing no project package: `adapters/` and `db/` may import no other project
package and both need it, and the GPU machine (torch only) imports it through the sampler.
Bytes are counted in decimal units (1 GB = 1e9 bytes), as the MELT paper counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

GB = 1e9  # decimal gigabyte, as the MELT paper counts
MB = 1e6
KB = 1e3
# Decimal byte units, largest first: every view scales bytes with these.
BYTE_UNITS: tuple[tuple[str, float], ...] = (("GB", GB), ("MB", MB), ("KB", KB), ("B", 1.0))

Kind = Literal["series", "fixed"]
# The kinds of value a key inside a stored JSON object holds (`leaf_problem`).
Leaf = Literal["integer", "number", "text", "object", "list"]
_ARTICLES: dict[Leaf, str] = {
    "integer": "a whole number",
    "number": "a finite number",
    "text": "text",
    "object": "a JSON object",
    "list": "a JSON list",
}


@dataclass(frozen=True)
class Measure:
    """A memory measure: `series` ones are read every sampler tick and their run's maximum is stored as
    the peak of the same name; `fixed` ones are a size read from the source (newest value kept).
    `exact`: the source that keeps its own peak of it, which replaces the sampled maximum (a spike
    shorter than a tick is not missed); None where only sampling knows it."""

    name: str
    kind: Kind
    label: str
    exact: str | None = None
    unit: str = "bytes"

    @property
    def stored_as(self) -> str:
        """What a run's stored value of it is (`memory_peaks.kind`): its maximum ("peak"), or the size ("fixed")."""
        return "peak" if self.kind == "series" else "fixed"


# Every measure, in the order the memory-over-a-run figure draws the series.
MEASURES: tuple[Measure, ...] = (
    Measure("weights_bytes", "fixed", "weights"),
    Measure("kv_bytes_used", "series", "KV cache used peak"),
    Measure("kv_bytes_allocated", "series", "KV cache peak", exact="kv_bytes_peak"),
    Measure("kv_bytes_reserved", "series", "KV pool reserved peak", exact="kv_bytes_reserved_peak"),
    Measure("torch_allocated", "series", "torch allocated peak", exact="torch.cuda.max_memory_allocated"),
    Measure("torch_reserved", "series", "torch reserved peak", exact="torch.cuda.max_memory_reserved"),
    Measure("nvml_process", "series", "NVML process peak"),
    Measure("nvml_device", "series", "NVML device peak"),
    Measure("rss", "series", "process RSS peak (CPU)"),
)
BY_NAME: dict[str, Measure] = {m.name: m for m in MEASURES}

# The memory measures a user can select (`--measure`, the accuracy-against-memory plot): name (a column of the plotted
# points) -> label. The stored peaks keep their `Measure` labels; the two derived ones (`dashboards.data` adds the
# columns) are labelled here. The order is the default's (`dashboards.figures.default_measure`): what the model holds,
# as the MELT paper's memory comparison counts it and as a user quoting "accuracy per GB" means it: the process's NVML
# total on a GPU, else weights + KV cache peak. KV alone is one `--measure` away.
WEIGHTS_PLUS_KV = "weights_bytes + kv_bytes_allocated"
ANALYTIC = "analytic"
MEMORY_MEASURES: dict[str, str] = {
    "nvml_process": BY_NAME["nvml_process"].label,
    WEIGHTS_PLUS_KV: "weights + KV cache peak",
    "kv_bytes_allocated": BY_NAME["kv_bytes_allocated"].label,
    "torch_allocated": BY_NAME["torch_allocated"].label,
    "kv_bytes_reserved": BY_NAME["kv_bytes_reserved"].label,
    ANALYTIC: "analytic weights + KV",
    "rss": BY_NAME["rss"].label,
}

# The per-tick readings (columns of `memory_samples`), in the order the memory-over-a-run figure draws them.
SERIES_MEASURES: tuple[str, ...] = tuple(m.name for m in MEASURES if m.kind == "series")
# The values stored per run (`memory_peaks`): every series' maximum and the fixed sizes.
PEAK_MEASURES: tuple[str, ...] = tuple(m.name for m in MEASURES)
# The peaks `loopeval profile` records per context length (columns of `profile_points`), measured ones only.
PROFILE_MEASURES: tuple[str, ...] = (
    "kv_bytes_allocated",
    "kv_bytes_used",
    "torch_allocated",
    "torch_reserved",
    "nvml_process",
    "nvml_device",
    "rss",
)
# The values the report's table of runs shows per run, in its column order.
RUN_TABLE_MEASURES: tuple[str, ...] = (
    "nvml_process",
    "torch_allocated",
    "weights_bytes",
    "kv_bytes_allocated",
    "kv_bytes_reserved",
    "rss",
)

# The adapter protocol's `memory()` keys (user plugins implement them, so they keep their names): the
# required ones, and those only some adapters give (None or absent from the others). `kv_bytes_peak`
# and `kv_bytes_reserved_peak` are the adapter's exact peaks of `kv_bytes_allocated` and `kv_bytes_reserved`.
MEMORY_KEYS: tuple[str, ...] = ("weights_bytes", "kv_bytes_allocated", "kv_bytes_used", "kv_bytes_peak")
OPTIONAL_MEMORY_KEYS: tuple[str, ...] = ("kv_bytes_reserved", "kv_bytes_reserved_peak")
# The series an adapter's `memory()` reads live (the sampler's KV readings).
ADAPTER_SERIES: tuple[str, ...] = tuple(k for k in MEMORY_KEYS + OPTIONAL_MEMORY_KEYS if k in SERIES_MEASURES)
# The adapter's exact peaks by its key -> the measure each is the peak of.
ADAPTER_PEAKS: dict[str, str] = {m.exact: m.name for m in MEASURES if m.exact in MEMORY_KEYS + OPTIONAL_MEMORY_KEYS}

# Names stored and typed before migration 0007 (`--measure kv_bytes_peak`) -> today's, accepted at the input boundary only.
ALIASES: dict[str, str] = {
    "kv_bytes_peak": "kv_bytes_allocated",
    "torch_allocated_peak": "torch_allocated",
    "torch_reserved_peak": "torch_reserved",
    "nvml_process_peak": "nvml_process",
    "nvml_device_peak": "nvml_device",
    "rss_peak": "rss",
    "weights_bytes + kv_bytes_peak": WEIGHTS_PLUS_KV,
}


def canonical(name: str) -> str:
    """A measure name as typed (today's, or one of `ALIASES`) -> today's name; unknown names pass unchanged."""
    return ALIASES.get(name, name)


def merged_peak(name: str, old: int | None, new: int | None) -> int | None:
    """The one rule combining two values of a run's measure (two stretches of a run, or the peak so far and a
    new reading): a fixed size takes the newest known value, a peak the larger; None (unavailable) loses."""
    if new is None or old is None:
        return old if new is None else new
    return new if BY_NAME[name].kind == "fixed" else max(old, new)


def analytic_kv_bytes(terms: Mapping[str, int], tokens: int, sequences: int = 1) -> int:
    """KV (and latent) bytes the analytic model predicts for `sequences` sequences of `tokens` tokens:

        sequences * (kv_bytes_per_token * tokens + latent_bytes_per_token * min(latent_tokens, tokens))

    `terms` are the coefficients of `adapters.engine.memory.analytic_terms`, which engine adapters store in
    `describe()` under "analytic"; the latent is the state kept per token in flight (MELT's h, the
    loop-conditioning history), for at most `latent_tokens` tokens.
    """
    latent = terms["latent_bytes_per_token"] * min(terms["latent_tokens"], tokens)
    return sequences * (terms["kv_bytes_per_token"] * tokens + latent)


# The coefficients of the analytic formula (`analytic_kv_bytes`), as engine adapters store them under "analytic".
ANALYTIC_TERMS: tuple[str, ...] = ("weights_bytes", "kv_bytes_per_token", "latent_bytes_per_token", "latent_tokens")


def analytic_bytes(terms: Mapping[str, int], tokens: int, sequences: int = 1) -> int:
    """Weights plus `analytic_kv_bytes`: what a model needs to hold `sequences` sequences of `tokens` tokens."""
    return terms["weights_bytes"] + analytic_kv_bytes(terms, tokens, sequences)


@dataclass(frozen=True)
class ComputeMeasure:
    """A per-run compute measure: read from the samples and timings a run stores (never sampled by a tick), so it
    has no peak or kind; `unit` is what a figure's axis and a table's caption say."""

    name: str
    label: str
    unit: str


# What a generated token cost, beside what it held in memory; in the order `loopeval results` shows them.
COMPUTE_MEASURES: tuple[ComputeMeasure, ...] = (
    ComputeMeasure("loops_per_token", "mean loops per generated token", "loops"),
    ComputeMeasure("layer_passes_per_token", "layer passes per generated token", "layers"),
    ComputeMeasure("tokens_per_second", "generated tokens per second (inside generate, prefill included)", "tokens/s"),
    ComputeMeasure("seconds_per_token", "generate seconds per generated token", "s"),
    ComputeMeasure("energy_joules", "GPU energy of the run (NVML)", "J"),
)
COMPUTE_BY_NAME: dict[str, ComputeMeasure] = {m.name: m for m in COMPUTE_MEASURES}
# The layer counts an engine model's `describe()["config"]` holds: run once (prelude, coda) or once per loop (shared).
LAYER_FIELDS: tuple[str, ...] = ("prelude_layers", "coda_layers", "shared_layers")


# What the views compute with from an adapter's `describe()` (a run's `runs.model_config`): each key path and the kind
# of value it must hold where present (None reads as absent). Checked where an adapter hands it over
# (`adapters.base.checked_description`) and where a run is read back (`db.stored`), so text or NaN there is named in
# one line instead of computed with.
DESCRIBED: dict[str, Leaf] = {
    "loops": "integer",
    "trained_loops": "integer",
    "params": "integer",
    "kv_bytes_per_token": "number",
    "kv_policy": "text",
    "kv_dtype": "text",
    "analytic": "object",
    **{f"analytic.{term}": "number" for term in ANALYTIC_TERMS},
    "config": "object",
    **{f"config.{field}": "integer" for field in LAYER_FIELDS},
}


def _fits(kind: Leaf, value: object) -> bool:
    """Whether `value` (parsed JSON) is a `kind`: a number is finite and never a boolean, an integer whole."""
    if kind == "integer":
        return type(value) is int
    if kind == "number":
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
    return isinstance(value, {"text": str, "object": dict, "list": list}[kind])


def leaf_problem(value: Mapping[str, object], kinds: Mapping[str, Leaf]) -> str | None:
    """What is wrong with the JSON object `value` at the key paths of `kinds` (dotted: "analytic.kv_bytes_per_token"),
    as "holds 'lots' at kv_bytes_per_token, not a number"; None when each present one is of its kind. A path under
    a value of the wrong kind is not reached: its parent is named."""
    for path, kind in kinds.items():
        leaf: object = value
        for key in path.split("."):
            leaf = leaf.get(key) if isinstance(leaf, dict) else None
        if leaf is not None and not _fits(kind, leaf):
            shown = repr(leaf) if len(repr(leaf)) <= 40 else repr(leaf)[:37] + "..."
            return f"holds {shown} at {path}, not {_ARTICLES[kind]}"
    return None


def layer_passes(config: Mapping[str, int], loops_per_token: float) -> float:
    """Decoder-layer passes per generated token: the prelude and coda once, the shared block once per loop run.
    `config` holds `LAYER_FIELDS` (an engine model's stored config); a per-token early exit lowers the mean loops."""
    return config["prelude_layers"] + config["coda_layers"] + config["shared_layers"] * loops_per_token


def energy_text(joules: float | None) -> str:
    """Joules as '412 J' or '3.41 kJ' (3 significant digits); None (and NaN) is no energy counter here: "n/a", never "0"."""
    if joules is None or joules != joules:
        return "n/a"
    return f"{joules / KB:.3g} kJ" if abs(joules) >= KB else f"{joules:.3g} J"


def byte_text(value: float | None) -> str:
    """Bytes in the largest decimal unit that keeps them at or above 1, 3 significant digits: '1.28 MB'.

    None (and NaN) is an unavailable source and reads "n/a", never "0".
    """
    if value is None or value != value:
        return "n/a"
    unit, scale = next(((u, s) for u, s in BYTE_UNITS if abs(value) >= s), BYTE_UNITS[-1])
    return f"{int(value)} B" if unit == "B" else f"{value / scale:.3g} {unit}"
