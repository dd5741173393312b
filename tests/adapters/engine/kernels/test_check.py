"""`kernels.check`: each kernel's first-use case against torch's ops, through Triton's interpreter on the CPU
(`tests.support.triton_interpreter`): the real kernels pass, and a kernel that computes wrong or raises is named."""

from __future__ import annotations

import torch

from adapters.engine.kernels.check import failure
from tests.adapters.engine.kernels.test_kernels import KERNELS, misread_blocks
from tests.support.triton_interpreter import add_rms_norm

CPU = torch.device("cpu")


def test_each_kernel_passes_its_first_use_check_and_a_wrong_or_failing_one_is_named() -> None:
    assert failure(KERNELS, CPU, torch.float32) is None
    wrong = failure({**KERNELS, "paged_attention": misread_blocks}, CPU, torch.float32)
    assert wrong is not None and wrong.startswith("paged_attention differs from torch by ")
    broken = failure({**KERNELS, "add_rms_norm": lambda *args: add_rms_norm(*args[:3])}, CPU, torch.float32)
    assert broken is not None and broken.startswith("add_rms_norm failed: TypeError: ")
