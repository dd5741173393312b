"""The IFM Part II release's artifact layout (ifm-ai/xllm-loop, `xllm/paper_part2/artifacts.py`) read into the engine.

An artifact (`IFM/LoopedLM-P2-<name>` on the Hub, or `export_paper_part2.py`'s output) is a folder holding
`config.json` ({"model": the `ModelConf` fields, "tokenizer": ...}), `model.safetensors.index.json` and its BF16 shards
`model-0000k-of-0000N.safetensors`, the tokenizer in `tokenizer/` (not for distilled students), the model card,
`LICENSE`, `NOTICE` and `artifact_manifest.json`, which lists every other file's size and SHA-256 and carries the
SHA-256 of its own fields. `verify_artifact` checks all of it as the official `verify_artifact` does, before a tensor is
read: the manifest's own digest, the closed set of files (what `hf download --local-dir` adds beside them excepted), no
symbolic links, and every file's size and SHA-256; a mismatch is one line naming the file.

`ifm_config` maps the model fields onto `LoopConfig`: `arch` "huginn" (the looped rows: prelude, recurrent block and
coda of Llama blocks, `families.ifm`) or "transformer" (the dense D4 rows: a plain stack, loops 1). Training-only
fields (the depth sampling, the learned prior, backprop depth) do not change what evaluation computes and are not read.

Tensors are named as the official state dict (`embed`, `layers.{i}.attention.{norm,wq,wk,wv,wo}`,
`layers.{i}.nffn.{norm,fc1,fc2,fc3}`, `output.{final_norm,output}`, `input_injection.*`,
`huginn_prelude_norm_module`). Two conventions differ from the engine's and are converted once, at load: the official
RMSNorm stores its weight minus one (it multiplies by weight + 1), and the official RoPE rotates adjacent channel
pairs (2j, 2j + 1) where the engine rotates (j, j + D/2), so q's and k's rows are reordered per head
(`adapters.engine.io.raven.rope_order`, as for Huginn-0125).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from adapters.base import AdapterError
from adapters.engine.config import IFM_INJECTIONS, LoopConfig
from adapters.engine.io.raven import rope_order

ARTIFACT_FORMAT = "xllm-native-bf16-safetensors"
RELEASE = "paper-part2"
MANIFEST = "artifact_manifest.json"
INDEX = "model.safetensors.index.json"
SCHEMA_VERSION = 1
DOCUMENTS = ("README.md", "LICENSE", "NOTICE")
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HUB_FILES = frozenset({".gitattributes"})  # what `hf download --local-dir` writes beside the release's files
HUB_CACHE = ".cache/huggingface/"
CHUNK = 8 * 1024**2  # bytes hashed at a time


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The SHA-256 the manifest carries of its own fields: compact JSON, keys sorted, `manifest_sha256` left out."""
    payload = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _hub_metadata(root: Path, path: Path) -> bool:
    relative = path.relative_to(root).as_posix()
    return relative in HUB_FILES or relative.startswith(HUB_CACHE) or (relative in (".cache", HUB_CACHE[:-1]))


def _read_object(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"cannot read {path.name} of the IFM artifact {path.parent}: {exc}") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"{path}: expected a JSON object")
    return raw


def verify_artifact(root: Path) -> dict[str, Any]:
    """The artifact's manifest, after every check of the official `verify_artifact` (module docstring)."""
    if not (root / MANIFEST).is_file():
        raise AdapterError(f"{root} is not an IFM Part II artifact: it has no {MANIFEST}")
    manifest = _read_object(root / MANIFEST)
    if manifest.get("manifest_sha256") != manifest_digest(manifest):
        raise AdapterError(f"{root}: {MANIFEST} does not match its own SHA-256 (manifest_sha256)")
    if (manifest.get("schema_version"), manifest.get("release"), manifest.get("format")) != (
        SCHEMA_VERSION,
        RELEASE,
        ARTIFACT_FORMAT,
    ):
        raise AdapterError(f"{root}: {MANIFEST} is not a Part II artifact manifest ({RELEASE}, {ARTIFACT_FORMAT})")
    records = {record["path"]: record for record in manifest.get("files", [])}
    entries = [path for path in root.rglob("*") if not _hub_metadata(root, path)]
    if any(path.is_symlink() for path in entries):
        raise AdapterError(f"{root}: the artifact holds symbolic links (load an `hf download --local-dir` folder)")
    present = {p.relative_to(root).as_posix() for p in entries if p.is_file()} - {MANIFEST}
    folders = {p.relative_to(root).as_posix() for p in entries if p.is_dir()}
    if not folders <= {TOKENIZER_DIR}:
        raise AdapterError(
            f"{root}: unexpected folder(s) in the artifact: {', '.join(sorted(folders - {TOKENIZER_DIR}))}"
        )
    if present != set(records):
        missing, unlisted = sorted(set(records) - present), sorted(present - set(records))
        raise AdapterError(
            f"{root}: the artifact's files differ from {MANIFEST}: missing {missing}, unlisted {unlisted}"
        )
    shards = {name for name in records if name.startswith("model-") and name.endswith(".safetensors")}
    layout = {"config.json", INDEX, *DOCUMENTS, *(f"{TOKENIZER_DIR}/{name}" for name in TOKENIZER_FILES)}
    if not set(records) - shards <= layout:
        raise AdapterError(
            f"{root}: files outside the Part II layout: {', '.join(sorted(set(records) - shards - layout))}"
        )
    if ("LICENSE" in records) != ("NOTICE" in records):
        raise AdapterError(f"{root}: the artifact holds one of LICENSE and NOTICE without the other")
    if (TOKENIZER_DIR in folders) != all(f"{TOKENIZER_DIR}/{name}" in records for name in TOKENIZER_FILES):
        raise AdapterError(f"{root}: the artifact's tokenizer is incomplete (it needs {', '.join(TOKENIZER_FILES)})")
    for name, record in sorted(records.items()):
        path = root / name
        if path.stat().st_size != record.get("size_bytes") or sha256_file(path) != record.get("sha256"):
            raise AdapterError(f"{root}: {name} does not match {MANIFEST} (size or SHA-256)")
    for name in DOCUMENTS:
        text = (root / name).read_text(encoding="utf-8", errors="replace") if name in records else "x"
        if not text.strip() or "<REQUIRED:" in text:
            raise AdapterError(f"{root}: {name} is empty or has an unfilled <REQUIRED: field")
    weight_map = _read_object(root / INDEX).get("weight_map", {})
    model = manifest.get("model", {})
    if (len(weight_map), set(weight_map.values())) != (model.get("tensor_count"), shards) or len(shards) != model.get(
        "shards"
    ):
        raise AdapterError(f"{root}: {INDEX} does not match {MANIFEST} (tensor count or shards)")
    return manifest


def read_artifact(root: Path) -> tuple[LoopConfig, dict[str, torch.Tensor]]:
    """The verified artifact's config and its tensors under the engine's names (`LoopedLM.state_dict()`)."""
    from adapters.engine.io.checkpoint import read_safetensors

    cfg = ifm_config(root)
    weight_map = _read_object(root / INDEX)["weight_map"]
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        part = read_safetensors(root / shard)
        if set(part) != {key for key, name in weight_map.items() if name == shard}:
            raise AdapterError(f"{root}: the tensors of {shard} differ from {INDEX}")
        tensors.update(part)
    return cfg, engine_tensors(tensors, cfg)


def ifm_config(root: Path) -> LoopConfig:
    """The verified artifact's `LoopConfig` (module docstring); a distilled student is refused by name."""
    verify_artifact(root)
    raw = _read_object(root / "config.json")
    fields = raw.get("model")
    if not isinstance(fields, dict):
        raise AdapterError(f"{root}/config.json has no model section")
    if "student" in raw or "teacher" in raw:
        raise AdapterError(
            f"{root} is a distilled student: its prefill path runs with its teacher artifact, which the engine does not load"
        )
    return model_config(fields)


def model_config(fields: dict[str, Any]) -> LoopConfig:
    """`LoopConfig` of an artifact's model fields (the `ModelConf` of `xllm/config.py`)."""
    arch = fields.get("arch")
    if arch not in ("huginn", "transformer"):
        raise AdapterError(f"IFM artifact: arch {arch!r} is neither 'huginn' (looped rows) nor 'transformer' (D4)")
    unsupported = {
        "apply_attn_gate": False,
        "qknorm": False,
        "scale_emb": False,
        "swiglu": True,
        "apply_rmsnorm": True,
        "norm_affine": True,
        "residual_func": "base",
        "attn_act_func": "softmax",
        "num_experts": 0,
        "layernorm_num_groups": 1,
    }
    for name, value in unsupported.items():
        if fields.get(name, _MODELCONF_DEFAULTS.get(name)) != value:
            raise AdapterError(
                f"IFM artifact: model field {name} must be {value!r} (the released rows), got {fields.get(name)!r}"
            )
    d, heads = fields["model_dim"], fields["num_heads"]
    head_dim = fields.get("head_dim") or d // heads
    if fields.get("rope_head_dim", head_dim) not in (None, head_dim):
        raise AdapterError("IFM artifact: rope_head_dim must be the head dim (RoPE on every channel)")
    shape = dict(
        vocab_size=fields["vocab_size"],
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=fields.get("num_kv_heads") or heads,
        head_dim=head_dim,
        ffn_size=fields["ffn_hidden_dim"],
        rope_theta=float(fields.get("rope_base", 100000.0)),
        norm_eps=float(fields.get("rmsnorm_eps", 1e-6)),
        tie_embeddings=False,
        norm_layout="pre",
        max_position=int(fields.get("chunk_size", 2048)) * 16,  # the official RoPE table's length
    )
    layers = fields["num_layers"]
    if arch == "transformer":
        return LoopConfig(family="custom", shared_layers=layers, loops=1, kv_strategy="standard", **shape)
    return _looped_config(fields, layers, shape)


def _looped_config(fields: dict[str, Any], layers: int, shape: dict[str, Any]) -> LoopConfig:
    if not fields.get("huginn_depth_control") or fields.get("huginn_hierarchical_state", "none") != "none":
        raise AdapterError(
            "IFM artifact: only the Part II rows (huginn_depth_control, one recurrent state) are supported"
        )
    if fields.get("huginn_state_init") != "normal":
        raise AdapterError("IFM artifact: huginn_state_init must be 'normal' (the hashed evaluation state)")
    prelude, coda = fields.get("huginn_prelude_layers", 1), fields.get("huginn_coda_layers", 1)
    recurrent = fields.get("huginn_recurrent_layers") or layers - prelude - coda
    kind = fields.get("huginn_input_injection", "diagonal")
    injection = "orthogonal" if kind == "diagonal" and fields.get("huginn_prelude_orthogonal") else kind
    if injection not in IFM_INJECTIONS:
        raise AdapterError(f"IFM artifact: huginn_input_injection {kind!r} is not diagonal or linear")
    return LoopConfig(
        family="ifm",
        prelude_layers=prelude,
        shared_layers=recurrent,
        coda_layers=coda,
        loops=fields.get("loop_times", 5),
        kv_strategy="per_loop",
        ifm_injection=injection,
        ifm_prelude_norm=fields.get("huginn_prelude_norm", "none") == "rms",
        ifm_exit_norm=fields.get("huginn_recurrent_exit_norm", "none") == "parameterless_rms",
        **shape,
    )


_MODELCONF_DEFAULTS: dict[str, Any] = {  # `ModelConf`'s defaults of the fields checked above
    "apply_attn_gate": False,
    "qknorm": False,
    "scale_emb": False,
    "swiglu": False,
    "apply_rmsnorm": False,
    "norm_affine": True,
    "residual_func": "base",
    "attn_act_func": "softmax",
    "num_experts": 0,
    "layernorm_num_groups": 1,
}

BLOCK_NAMES = {
    "attention.norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "nffn.norm.weight": "post_attention_layernorm.weight",
    "nffn.fc1.weight": "mlp.gate_proj.weight",
    "nffn.fc3.weight": "mlp.up_proj.weight",
    "nffn.fc2.weight": "mlp.down_proj.weight",
}
TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "output.final_norm.weight": "model.norm.weight",
    "output.output.weight": "lm_head.weight",
    "input_injection.input_adapter.weight": "model.recurrence.input_adapter.weight",
    "input_injection.A_log": "model.recurrence.A_log",
    "input_injection.dt_bias": "model.recurrence.dt_bias",
    "input_injection.adapter.weight": "model.recurrence.adapter.weight",
    "input_injection.adapter.bias": "model.recurrence.adapter.bias",
    "huginn_prelude_norm_module.weight": "model.recurrence.prelude_norm.weight",
}
ZERO_CENTRED = ("norm.weight", "final_norm.weight", "huginn_prelude_norm_module.weight")  # stored as weight - 1


def engine_tensors(tensors: dict[str, torch.Tensor], cfg: LoopConfig) -> dict[str, torch.Tensor]:
    """The official state dict under the engine's names: norms' weights + 1, q and k rows reordered for rotate-half
    RoPE; a name neither knows is kept, for `load_model` to report."""
    order = rope_order(cfg.head_dim)
    out = {}
    for name, tensor in tensors.items():
        value = tensor.float() + 1 if name.endswith(ZERO_CENTRED) else tensor  # rounded once, to the run's dtype
        parts = name.split(".", 2)
        if parts[0] == "layers" and len(parts) == 3 and parts[2] in BLOCK_NAMES:
            new = BLOCK_NAMES[parts[2]]
            if new in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                heads = cfg.num_heads if new.startswith("self_attn.q") else cfg.num_kv_heads
                value = value.view(heads, cfg.head_dim, -1)[:, order].reshape(value.shape)
            out[f"model.layers.{parts[1]}.{new}"] = value
        else:
            out[TOP_NAMES.get(name, name)] = value
    return out
