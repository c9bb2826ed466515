"""Backend choice, made once per call at the API boundary.

``ops_backend(device)`` returns the module that runs the compress / store ops
for tensors on ``device``: ``torch_backend.ops`` (the PyTorch reference) for
CPU tensors or when ``FLASHCOMPRESS_BACKEND=torch``, else ``cuda_ops.ops``
(the JIT kernels).  Both modules have the same functions with the same
signatures (``compress_forward``, ``compress_norm_rope_store``,
``compress_and_store``), so the API layer never branches on the backend again.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .jit.settings import jit_enabled_for
from .torch_backend import ops as _torch_ops

_cuda_ops: ModuleType | None = None


def ops_backend(device: torch.device) -> ModuleType:
    """The ops module for tensors on ``device`` (imports ``cuda_ops.ops`` on first GPU use)."""
    global _cuda_ops
    if not jit_enabled_for(device):
        return _torch_ops
    if _cuda_ops is None:
        from .cuda_ops import ops as cuda_ops

        _cuda_ops = cuda_ops
    return _cuda_ops


# Op families that have JIT kernels (plan builders; compress / store / fused run through ops_backend).
JIT_FAMILIES: frozenset[str] = frozenset({"plan"})


def use_jit(device: torch.device, family: str) -> bool:
    """True when a call on ``device`` for ``family`` should launch a JIT kernel."""
    return family in JIT_FAMILIES and jit_enabled_for(device)
