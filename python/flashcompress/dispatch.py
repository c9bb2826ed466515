"""Backend choice, made once per call at the API boundary.

CPU tensors always run the PyTorch backend.  CUDA tensors run the JIT kernels
of an op family once that family has kernels (``JIT_FAMILIES``), unless
``FLASHCOMPRESS_BACKEND=torch`` forces the PyTorch backend on the GPU too.
Families without kernels yet run the PyTorch backend on the GPU.
"""

from __future__ import annotations

import os

import torch

# Op families that have JIT kernels.  Later issues add "compress" and "store".
JIT_FAMILIES: frozenset[str] = frozenset({"plan"})

def _backend_setting() -> str:
    value = os.environ.get("FLASHCOMPRESS_BACKEND", "auto").strip().lower()
    if value not in ("auto", "torch", "jit"):
        raise ValueError(f"FLASHCOMPRESS_BACKEND: expected auto, torch or jit, got {value!r}")
    return value


def use_jit(device: torch.device, family: str) -> bool:
    """True when a call on ``device`` for ``family`` should launch a JIT kernel."""
    if device.type != "cuda":
        return False
    if _backend_setting() == "torch":
        return False
    return family in JIT_FAMILIES
