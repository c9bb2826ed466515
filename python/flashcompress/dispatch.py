"""Backend choice and the one launch path of every op.

``ops_backend(device)`` returns the module that runs the compress / store ops for
tensors on ``device`` (a ``torch.device`` or a ``Tensor.get_device()`` index, -1 for the
CPU): ``torch_backend.ops`` (the PyTorch reference) for CPU tensors or when
``FLASHCOMPRESS_BACKEND=torch``, else ``cuda_ops.ops`` (the JIT kernels).  Both modules
have the same functions, each taking one checked call object of ``validation``
(``compress_forward(call, out)``, ``compress_norm_rope_store(call)``,
``compress_and_store(call)``), so nothing after validation branches on the backend again.
``plans_backend(device)`` does the same for the plan builders (``torch_backend.plans``
or ``cuda_ops.plans``), for ``flashcompress.plans``.

``run_compress_forward`` / ``run_store`` / ``run_compress_and_store`` take a call object
from ``validation.check_*`` and launch it; ``flashcompress.api`` (eager calls) and
``flashcompress.library`` (the torch.compile ops at graph run time) both end here.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .jit.settings import jit_enabled_for
from .torch_backend import ops as _torch_ops
from .torch_backend import plans as _torch_plans
from .validation import CompressCall, StoreCall

_cuda_ops: ModuleType | None = None
_cuda_plans: ModuleType | None = None


def _device_type(device: torch.device | int) -> str | torch.device:
    """What ``jit_enabled_for`` takes: an index becomes its device type."""
    if type(device) is int:
        return "cpu" if device < 0 else "cuda"
    return device  # type: ignore[return-value]


def ops_backend(device: torch.device | int) -> ModuleType:
    """The ops module for tensors on ``device`` (imports ``cuda_ops.ops`` on first GPU use)."""
    global _cuda_ops
    if not jit_enabled_for(_device_type(device)):
        return _torch_ops
    if _cuda_ops is None:
        from .cuda_ops import ops as cuda_ops

        _cuda_ops = cuda_ops
    return _cuda_ops


def plans_backend(device: torch.device | int) -> ModuleType:
    """The plan-builder module for tensors on ``device``: ``torch_backend.plans`` or ``cuda_ops.plans``
    (same planner functions and signatures; ``cuda_ops.plans`` is imported on first GPU use)."""
    global _cuda_plans
    if not jit_enabled_for(_device_type(device)):
        return _torch_plans
    if _cuda_plans is None:
        from .cuda_ops import plans as cuda_plans

        _cuda_plans = cuda_plans
    return _cuda_plans


def run_compress_forward(call: CompressCall, out: torch.Tensor | None) -> torch.Tensor:
    """Launch a checked ``compress_forward`` call; ``out`` (checked with it) is allocated when None."""
    if out is None:
        out = torch.empty((call.plan_rows.shape[0], call.layer.head_dim), dtype=call.inp.dtype,
                          device=call.inp.device)
    if not call.is_empty():
        ops_backend(call.device).compress_forward(call, out)
    return out


def run_store(call: StoreCall) -> None:
    """Launch a checked ``compress_norm_rope_store`` call (nothing for an empty plan)."""
    if call.plan_rows.shape[0]:
        ops_backend(call.device).compress_norm_rope_store(call)


def run_compress_and_store(call: CompressCall) -> None:
    """Launch a checked ``compress_and_store`` call (nothing for an empty plan)."""
    if not call.is_empty():
        ops_backend(call.device).compress_and_store(call)
