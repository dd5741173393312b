"""`kernels.install` and `kernels.available`: the kernels are set on a model only where they run (a CUDA device with
triton importable, and not turned off) and pass their first-use check, and torch's ops everywhere else, so the CPU's
path stays the golden's.

`install` reads only the device's type and checks the kernels on the model's own parameters, so a CPU model stands
in for a GPU one; the kernels' modules it imports are the interpreted ones of `tests.support.triton_interpreter`.
"""

from __future__ import annotations

from typing import Any

import pytest
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
    assert install(model, CUDA, on=True) == (paged_attention, "triton")
    assert all(b.add_norm is add_rms_norm for b in blocks) and all(a.qk_rope is qk_rope for a in attentions)
    for device, on in ((CUDA, False), (CPU, True)):
        install(model, CUDA, on=True)
        assert install(model, device, on=on) == (None, "torch"), (device, on)
        assert all(b.add_norm is None for b in blocks) and all(a.qk_rope is None for a in attentions), (device, on)


KERNELS = {"paged_attention": paged_attention, "add_rms_norm": add_rms_norm, "qk_rope": qk_rope}


def misread_blocks(*args: Any, **kwargs: Any) -> Any:
    """The real kernel told the wrong block size: it reads other rows than SDPA does, as a miscompiled kernel would."""
    return paged_attention(*args, **{**kwargs, "block_size": 8})


def test_a_kernel_that_fails_its_check_falls_back_to_torch_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    model = load_preset("ouro-tiny", dtype="fp32", device="cpu", seed=3).model
    attention, path = install(model, CUDA, on=True, kernels={**KERNELS, "paged_attention": misread_blocks})
    assert attention is None and path.startswith("torch: paged_attention differs from torch by ")
    assert all(m.add_norm is None for m in model.modules() if isinstance(m, Block))
    assert all(m.qk_rope is None for m in model.modules() if isinstance(m, Attention))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"loopeval: warning: Triton kernel {path.removeprefix('torch: ')}; the engine runs torch's ops (SDPA)"
    ]


def test_the_run_records_which_ops_the_model_ran() -> None:
    assert load_preset("ouro-tiny", dtype="fp32", device="cpu").describe()["kernels"] == "torch"
