"""Backend choice, made once per call at the API boundary.

``ops_backend(device)`` returns the module that runs the compress / store ops
for tensors on ``device``: ``torch_backend.ops`` (the PyTorch reference) for
CPU tensors or when ``FLASHCOMPRESS_BACKEND=torch``, else ``cuda_ops.ops``
(the JIT kernels).  Both modules have the same functions with the same
signatures (``compress_forward``, ``compress_norm_rope_store``,
``compress_and_store``), so the API layer never branches on the backend again.
``plans_backend(device)`` does the same for the plan builders (``torch_backend.plans``
or ``cuda_ops.plans``), for ``flashcompress.plans``.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .jit.settings import jit_enabled_for
from .torch_backend import ops as _torch_ops
from .torch_backend import plans as _torch_plans

_cuda_ops: ModuleType | None = None
_cuda_plans: ModuleType | None = None


def ops_backend(device: torch.device) -> ModuleType:
    """The ops module for tensors on ``device`` (imports ``cuda_ops.ops`` on first GPU use)."""
    global _cuda_ops
    if not jit_enabled_for(device):
        return _torch_ops
    if _cuda_ops is None:
        from .cuda_ops import ops as cuda_ops

        _cuda_ops = cuda_ops
    return _cuda_ops


def plans_backend(device: torch.device) -> ModuleType:
    """The plan-builder module for tensors on ``device``: ``torch_backend.plans`` or ``cuda_ops.plans``
    (same planner functions and signatures; ``cuda_ops.plans`` is imported on first GPU use)."""
    global _cuda_plans
    if not jit_enabled_for(device):
        return _torch_plans
    if _cuda_plans is None:
        from .cuda_ops import plans as cuda_plans

        _cuda_plans = cuda_plans
    return _cuda_plans
