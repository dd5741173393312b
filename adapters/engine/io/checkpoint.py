"""Checkpoints: the engine's own format, HF Qwen3 and HF Ouro directories, MELT gate tensors and Huginn's official layout.

Engine format (a directory): `model.safetensors` (the `LoopedLM` state dict, HF tensor names: the
fused q/k/v and gate/up parameters are split into HF's tensors by the model's state-dict hooks),
`config.json` = {"format": "loopeval-engine", "config": LoopConfig fields}, and `tokenizer.json`
when the model has a tokenizer.

HF directories are read without transformers' model classes or remote code: `config.json` is
mapped onto `LoopConfig` and the safetensors (single file or sharded with an index) load into the
engine, whose tensor names are HF's. MELT gates in an Ouro-format directory are extra tensors:
`model.layers.{i}.melt_gate.w_z.weight` (W_z, d x d), `.w_z.bias` (b_z), `.u_z.weight` (U_z) for
the elementwise gate, `.melt_gate.logit` for the scalar one; config.json may carry
`melt_gate_variant` and `melt_chunk_size`. Ouro's `early_exit_threshold` becomes
`LoopConfig.exit_threshold`, the adapter's default exit policy. Huginn-0125's official layout
(config.json `model_type` "huginn_raven", `transformer.*` tensors), and the retrofitted models saved in it
(`qk_bias` false), are mapped in `adapters.engine.io.raven`. The IFM Part II release's artifacts (`ifm:DIR`: `artifact_manifest.json`
with every file's SHA-256, BF16 shards, the official `xllm` names) are verified and mapped in `adapters.engine.io.xllm`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from adapters.base import AdapterError
from adapters.config_values import MISSING, first_id, flag, id_list, integer, number
from adapters.files import MIB, check_closed, check_complete, commit_folder, index_shards, parse_json, read_text
from adapters.engine.config import ENGINE_FORMAT, LoopConfig
from adapters.engine.io.xllm import ifm_config, read_artifact
from adapters.engine.io.raven import (
    MODEL_TYPE as HUGINN_TYPE,
    engine_tensors,
    huginn_config,
    is_retrofit,
    retrofit_config,
)
from adapters.engine.model import LoopedLM
from adapters.engine.io.presets import preset


# ----------------------------------------------------------------------- config.json files
CONFIG_LIMIT = (
    16 * MIB
)  # a config.json or shard index; real ones are a few KB (an index of thousands of tensors, a few MB)


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (config.json, the shard index) as an object; AdapterError naming it otherwise."""
    if not path.exists():
        raise AdapterError(f"{path} not found: expected a checkpoint directory with config.json and model.safetensors")
    text = read_text(path, "checkpoint file", CONFIG_LIMIT)
    try:
        raw = parse_json(text)
    except ValueError as exc:
        raise AdapterError(f"cannot read {path} as JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdapterError(f"{path}: expected a JSON object, got a {type(raw).__name__}")
    return raw


def _hf_config(raw: dict[str, Any], family: str) -> LoopConfig:
    """Map a Qwen2/Qwen3/Ouro-style HF config.json (or a RavenConfig's) onto LoopConfig (which checks every field's type and range)."""
    if family == "huginn":
        return huginn_config(raw)
    if family == "retrofit":
        return retrofit_config(raw)
    where = "HF config.json"
    try:
        heads, hidden = integer(raw, "num_attention_heads", MISSING, where), integer(raw, "hidden_size", MISSING, where)
        rope = raw.get("rope_parameters")  # transformers 5 nests the RoPE fields here
        theta = number(rope if isinstance(rope, dict) and "rope_theta" in rope else raw, "rope_theta", 10000.0, where)
        eos = id_list(raw, "eos_token_id", where)
        cfg = dict(
            vocab_size=raw["vocab_size"],
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            ffn_size=raw["intermediate_size"],
            rope_theta=theta,
            norm_eps=raw.get("rms_norm_eps", 1e-6),
            tie_embeddings=flag(raw, "tie_word_embeddings", False, where),
            max_position=raw.get("max_position_embeddings", 32768),
            bos_token_id=first_id(raw, "bos_token_id", where),
            eos_token_id=eos[0] if eos else None,
            pad_token_id=first_id(raw, "pad_token_id", where),
            extra={"eos_token_ids": eos},
        )
        layers = raw["num_hidden_layers"]
    except KeyError as exc:
        raise AdapterError(f"HF config.json lacks field {exc.args[0]!r}") from exc
    if family == "qwen3":
        return LoopConfig(
            family="qwen3",
            shared_layers=layers,
            loops=1,
            norm_layout="pre",
            qk_norm=True,
            kv_strategy="standard",
            **cfg,
        )
    gated = family == "melt"
    return LoopConfig(
        family=family,
        shared_layers=layers,
        loops=raw.get("total_ut_steps", 4),
        norm_layout="sandwich",
        qk_norm=False,
        kv_strategy="gated" if gated else "per_loop",
        exit_gate=True,
        exit_threshold=raw.get("early_exit_threshold"),
        gate_variant=raw.get("melt_gate_variant", "elementwise"),
        chunk_size=raw.get("melt_chunk_size", 64),
        **cfg,
    )


def read_config(path: str | Path, family: str | None = None) -> LoopConfig:
    """LoopConfig of a checkpoint directory or config.json (engine or HF); `family` picks the HF mapping.

    `melt` asks for a gated model: an engine config of another strategy is refused here, before any
    weights are read. An engine checkpoint directory must hold its completion marker (`save_checkpoint`).
    """
    path = Path(path)
    if family == "ifm":
        return ifm_config(path)
    file = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise AdapterError(f"{path} not found: expected a preset name, a checkpoint directory or a config.json")
    if path.is_dir():
        check_closed(path)  # before its config is read: no FIFO, device or shard outside the folder
    raw = read_json(file)
    try:
        if raw.get("format") == ENGINE_FORMAT:
            if path.is_dir():  # a checkpoint loopeval wrote: whole, or refused (a bare config.json is only read)
                check_complete(path)
            cfg = LoopConfig.from_dict(raw.get("config"))
        else:
            cfg = _with_generation_config(_hf_config(raw, family or _hf_family(raw, file)), file.parent)
    except AdapterError as exc:
        raise AdapterError(str(exc) if str(path) in str(exc) else f"{file}: {exc}") from None
    if family == "melt" and not cfg.gated:
        raise AdapterError(
            f"{path}: melt: needs a gated checkpoint (engine config with kv_strategy 'gated' or an Ouro-format dir with gate tensors)"
        )
    return cfg


def _with_generation_config(cfg: LoopConfig, directory: Path) -> LoopConfig:
    """The config plus generation_config.json's eos ids (`generation_eos_ids`), which `tokenizer.token_ids` weighs against the tokenizer."""
    file = directory / "generation_config.json"
    if not file.is_file():
        return cfg
    ids = id_list(read_json(file), "eos_token_id", str(file))
    return cfg.replace(extra={**cfg.extra, "generation_eos_ids": ids})


def _hf_family(raw: dict[str, Any], file: Path) -> str:
    """qwen3, huginn, retrofit, melt or ouro, from an HF config's fields."""
    model_type = str(raw.get("model_type", "")).lower()
    raven = "retrofit" if is_retrofit(raw) else "huginn"
    family = (
        "qwen3"
        if model_type.startswith("qwen")
        else raven
        if model_type == HUGINN_TYPE
        else "melt"
        if "melt_gate_variant" in raw
        else "ouro"
        if "total_ut_steps" in raw
        else ""
    )
    if not family:
        raise AdapterError(
            f"{file}: neither an engine config nor an HF Qwen3/Ouro config (model_type={raw.get('model_type')!r})"
        )
    return family


SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file, each read straight into its own memory, in the file's dtype.

    Not through a memory map (`safetensors.torch.load_file`): tensors backed by the map keep the whole
    file's pages in the process once touched, so the parts stacked into fused projections (or converted
    to another dtype) stayed resident twice, 1.45 x the weights for Qwen3-1.7B (docs/benchmarks.md).
    """
    with file.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = parse_json(f.read(size).decode("utf-8"))
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            tensor = torch.empty(end - begin, dtype=torch.uint8)
            f.seek(8 + size + begin)
            # an ndarray is a writable buffer; numpy's stubs declare __buffer__ for Python 3.12 on only
            if f.readinto(tensor.numpy()) != end - begin:  # type: ignore[arg-type]
                raise ValueError(f"tensor {name} ends past the end of the file")
            tensors[name] = tensor.view(SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return tensors


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    try:
        if single.is_file():
            return read_safetensors(single)
        if index.is_file():
            tensors: dict[str, torch.Tensor] = {}
            for shard in index_shards(directory, index.name):
                tensors.update(read_safetensors(shard))
            return tensors
    except AdapterError:
        raise
    except Exception as exc:  # noqa: BLE001 (corrupt files surface as one clear line)
        raise AdapterError(f"cannot read safetensors weights in {directory}: {exc}") from exc
    raise AdapterError(
        f"{directory} has no model.safetensors (or model.safetensors.index.json): expected safetensors weights"
    )


def load_model(path: str | Path, family: str, dtype: torch.dtype, device: str | torch.device) -> LoopedLM:
    """Build a LoopedLM from a checkpoint directory, checking that every tensor is present with its shape."""
    directory = Path(path)
    if not directory.is_dir():
        raise AdapterError(
            f"{directory} is not a directory: expected a checkpoint directory (config.json + model.safetensors)"
        )
    if family == "ifm":
        cfg, tensors = read_artifact(directory)
    else:
        cfg = read_config(directory, family)
        tensors = _read_tensors(directory)
    if cfg.recurrent and any(
        name.startswith("transformer.") for name in tensors
    ):  # the official layout, not the engine's
        try:
            tensors = engine_tensors(tensors, cfg)
        except AdapterError as exc:
            raise AdapterError(f"{directory}: {exc}") from None
    if cfg.exit_gate and "model.early_exit_gate.weight" not in tensors:  # HF Ouro dirs without the gate still run
        cfg = cfg.replace(exit_gate=False)
    if cfg.tie_embeddings:
        tensors.pop("lm_head.weight", None)
    with torch.device("meta"):
        model = LoopedLM(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise AdapterError(
            f"{directory}: checkpoint lacks {len(missing)} tensor(s) the {cfg.family} config needs, e.g. {', '.join(missing[:3])}"
        )
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise AdapterError(f"{directory}: unexpected tensor(s) {', '.join(extra[:3])} for a {cfg.family} config")
    for name, tensor in expected.items():
        if tuple(tensors[name].shape) != tuple(tensor.shape):
            raise AdapterError(
                f"{directory}: tensor {name} has shape {tuple(tensors[name].shape)}, config expects {tuple(tensor.shape)}"
            )
    model.load_state_dict(_fused_state(model, tensors, dtype), assign=True)
    return model.to(device=device, dtype=dtype).eval()


def _fused_state(model: LoopedLM, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`tensors` in `dtype` under the model's parameter names, fused projections stacked, built in place.

    Each part is dropped as soon as its stack exists, so loading holds the weights plus one module's
    projections at most: stacking them all while the parts were still referenced (as the load hook
    alone would) held most of the weights twice.
    """
    for name in list(tensors):
        tensors[name] = tensors[name].to(dtype)
    for prefix, module in model.named_modules():
        if hasattr(module, "fused"):
            fused, parts = module.fused
            tensors[f"{prefix}.{fused}.weight"] = torch.cat([tensors.pop(f"{prefix}.{part}.weight") for part in parts])
    return tensors


def save_checkpoint(
    model: LoopedLM, directory: str | Path, tokenizer: Any | None = None, extra_files: dict[str, str] | None = None
) -> Path:
    """Write the engine format: model.safetensors + config.json (+ tokenizer.json, + `extra_files`, name -> text).

    The files go in as one set (`adapters.files.commit_folder`): a save that is interrupted or runs out of
    disk leaves a folder that loading refuses as incomplete, never new weights beside old metadata. The config
    is saved without a run's KV policy and dtype (`kv_policy`, `kv_dtype`): they are how a run keeps its K/V,
    not the model, so the checkpoint loads with its own.
    """
    from safetensors.torch import save_file

    def write(staging: Path) -> None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # HF names: fused projections come split
        save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.replace(kv_policy=None, kv_dtype="auto").to_dict()
        (staging / "config.json").write_text(json.dumps({"format": ENGINE_FORMAT, "config": config}, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging))
        for name, text in (extra_files or {}).items():
            (staging / name).write_text(text)

    commit_folder(directory, write)
    return Path(directory)


def random_model(
    name_or_config: str | LoopConfig, seed: int, dtype: torch.dtype, device: str | torch.device
) -> LoopedLM:
    """A seeded random-init model of a preset (built on the target device, no fp32 detour)."""
    cfg = preset(name_or_config) if isinstance(name_or_config, str) else name_or_config
    with torch.device("meta"):
        model = LoopedLM(cfg)
    model = model.to_empty(device=device).to(dtype)
    model.init_weights(torch.Generator(device=device).manual_seed(seed))
    return model.eval()
