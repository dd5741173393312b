"""`kernels.install` and `kernels.available`: the kernels are set on a model only where they run (a CUDA device with
triton importable, and not turned off), and torch's ops everywhere else, so the CPU's path stays the golden's.

`install` reads only the device's type, so a CPU model stands in for a GPU one; the kernels' modules it imports
are the interpreted ones of `tests.support.triton_interpreter`.
"""

from __future__ import annotations

import torch

from adapters.engine.adapter import load_preset
from adapters.engine.kernels import available, install
from adapters.engine.layers import Attention, Block
from tests.support.triton_interpreter import add_rms_norm, paged_attention, qk_rope

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_the_kernels_run_on_cuda_only() -> None:
    assert available(CUDA) and not available(CPU)  # triton is a test dependency: importable here


def test_install_fuses_every_block_where_the_kernels_run_and_restores_torchs_ops_elsewhere() -> None:
    model = load_preset("ouro-tiny", dtype="fp32", device="cpu", seed=3).model
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    assert blocks and attentions
    assert all(b.add_norm is None for b in blocks) and all(a.qk_rope is None for a in attentions)  # the CPU's load
    assert install(model, CUDA, on=True) is paged_attention
    assert all(b.add_norm is add_rms_norm for b in blocks) and all(a.qk_rope is qk_rope for a in attentions)
    for device, on in ((CUDA, False), (CPU, True)):
        install(model, CUDA, on=True)
        assert install(model, device, on=on) is None, (device, on)
        assert all(b.add_norm is None for b in blocks) and all(a.qk_rope is None for a in attentions), (device, on)
