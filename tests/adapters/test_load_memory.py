"""Loading a bf16 checkpoint holds the weights once: no float32 copy, no file map kept resident beside the tensors.

The full-size figures are bench/bench_real_shapes.py's; this is the same measurement on a ~0.3 GB
Qwen3-shaped checkpoint, in a fresh process so that its peak is the load's own, with generous bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from adapters.engine.memory import count_params
from adapters.engine.presets import preset
from adapters.testing import save_public_checkpoint

SHAPE = dict(vocab_size=32000, hidden_size=1024, num_heads=8, num_kv_heads=4, head_dim=128, ffn_size=2816, shared_layers=8,
             max_position=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
CHILD = """
import json, resource, sys, psutil, torch
import adapters
from adapters.engine.checkpoint import load_model
from adapters.engine.model import LoopedLM
from adapters.engine.presets import preset
with torch.device("meta"):
    LoopedLM(preset("qwen3-tiny"))  # the first model built imports torch's meta kernels (~75 MB of code), not the load's
before = psutil.Process().memory_info().rss
model = load_model(sys.argv[1], "qwen3", torch.bfloat16, "cpu")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with torch.no_grad():
    model(torch.arange(64)[None])  # touches every weight, as generation does
print(json.dumps({"before": before, "peak": peak, "after": psutil.Process().memory_info().rss}))
"""


def test_loading_holds_the_bf16_weights_once(tmp_path):
    cfg = preset("qwen3-1.7b").replace(**SHAPE)
    save_public_checkpoint(tmp_path / "ckpt", cfg, shard_bytes=100_000_000)
    weights = count_params(cfg) * 2
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "ckpt")], capture_output=True, text=True, check=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert (got["peak"] - got["before"]) / weights < 1.3  # a float32 copy on the way would be >= 2
    assert (got["after"] - got["before"]) / weights < 1.2  # the file map kept resident beside the stacked projections was ~1.45
