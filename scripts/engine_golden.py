"""Record (or check) the engine's outputs on a fixed workload: every tiny preset and zoo model, greedy and sampled.

The engine's speed work must not change a single token: this records a fingerprint of the token ids
(and the loops each token was read from) that the engine generates for every tiny preset and every zoo model at two loop
counts, greedy and with the paper's sampling, through the continuous scheduler (default cap, and a cap
of 2 on blocks of 4 tokens) and the static path. `tests/adapters/engine/test_golden.py` regenerates them and
compares token for token.

    python scripts/engine_golden.py --write     # record (only when a change is meant to change outputs)
    python scripts/engine_golden.py --write --only zoo:NEW   # add a new model's cases, every other case kept as recorded
    python scripts/engine_golden.py             # compare with the recorded file, print any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import adapters  # noqa: E402
from adapters.base import PAPER_PROTOCOL, Sampling  # noqa: E402
from adapters.zoo import zoo_names  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "adapters" / "engine" / "data" / "engine_golden.json"
PRESETS = ["qwen3-tiny", "ouro-tiny", "coreloop-tiny", "melt-tiny"]
PROMPTS = ["1+2=", "x", "17*3=51; 4*4=", "abcdefghijklmnopqrstu", "c30k4 0110100110 -> ", "chain3: a=4 b=a+3 c=b*2 c?"]
SAMPLINGS = {
    "greedy": Sampling(temperature=0.0, max_new_tokens=24),
    "paper": replace(PAPER_PROTOCOL, max_new_tokens=24, n=2, seed=7),
}
MODES = {
    "continuous": {},
    "continuous-cap2-block4": {"max_batch": 2, "block_size": 4},
    "static": {"batching": "static"},
}


def specs() -> list[str]:
    return [f"preset:{name}" for name in PRESETS] + [f"zoo:{name}" for name in zoo_names()]


def case_outputs(spec: str) -> dict[str, list]:
    """Every case of one model: '{mode} r={loops} {sampling}' -> [(token ids, loops used)] per sample."""
    out: dict[str, list] = {}
    for mode, overrides in MODES.items():
        adapter = adapters.load(spec, dtype="fp32", device="cpu", **overrides)
        if spec.startswith("preset:"):
            adapter.config.eos_token_id = None  # random weights: lengths set by max_new_tokens
        trained = adapter.config.loops
        for loops in sorted({trained, 2}) if trained > 1 else [1]:
            adapter.loops = loops
            for name, sampling in SAMPLINGS.items():
                gens = adapter.generate(PROMPTS, sampling)
                out[f"{mode} r={loops} {name}"] = [[g.token_ids, g.loops_used] for g in gens]
    return out


def fingerprint(outputs: list) -> str:
    """16 hex digits of sha256 over one case's outputs (the file stays small; a difference is found by case)."""
    return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()[:16]


def record(only: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Every spec's case fingerprints, or those of the specs in `only`."""
    return {
        spec: {case: fingerprint(out) for case, out in case_outputs(spec).items()}
        for spec in specs()
        if not only or spec in only
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the outputs into the golden file")
    parser.add_argument(
        "--only",
        action="append",
        metavar="SPEC",
        help="with --write: record only this model (repeatable; a new zoo model), keeping every other recorded case",
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    unknown = sorted(set(args.only or []) - set(specs()))
    if unknown or (args.only and not args.write):
        parser.error(
            f"--only {unknown[0]}: not a preset or zoo model of the workload" if unknown else "--only goes with --write"
        )
    torch.set_num_threads(args.threads)
    outputs = record(args.only)
    if args.write:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=GOLDEN.parent
        ).stdout.strip()
        if args.only:  # added to the recorded file: the other models' cases stay as they were recorded, and when
            data = json.loads(GOLDEN.read_text())
            data["outputs"].update(outputs)
            data.setdefault("added_at", {}).update({spec: commit for spec in outputs})
        else:
            data = {"recorded_at": commit, "outputs": outputs}
        GOLDEN.write_text(json.dumps(data, indent=1) + "\n")
        print(
            f"wrote {GOLDEN} ({sum(len(v) for v in outputs.values())} cases of {', '.join(outputs)}, recorded at {commit})"
        )
        return
    golden = json.loads(GOLDEN.read_text())["outputs"]
    differ = [
        f"{spec} {case}"
        for spec in golden
        for case in golden[spec]
        if outputs.get(spec, {}).get(case) != golden[spec][case]
    ]
    print("\n".join(differ) or f"all {sum(len(v) for v in golden.values())} cases identical")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
