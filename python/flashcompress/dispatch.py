"""Backend choice, made once per call at the API boundary.

CPU tensors always run the PyTorch backend.  CUDA tensors run the JIT kernels
of an op family once that family has kernels (``JIT_FAMILIES``), unless the
``backend`` setting (``FLASHCOMPRESS_BACKEND=torch``) forces the PyTorch
backend on the GPU too.  Families without kernels yet run the PyTorch backend
on the GPU.
"""

from __future__ import annotations

import torch

from .jit.settings import jit_enabled_for

# Op families that have JIT kernels.  Later issues add "compress" and "store".
JIT_FAMILIES: frozenset[str] = frozenset({"plan"})


def use_jit(device: torch.device, family: str) -> bool:
    """True when a call on ``device`` for ``family`` should launch a JIT kernel."""
    return family in JIT_FAMILIES and jit_enabled_for(device)
