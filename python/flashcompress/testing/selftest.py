"""The ``selftest`` JIT family: the test-only kernels, a tiny add-a-constant kernel that exercises
the whole JIT path and a probe of the device encoders.

Params: ``value`` (int in [-1000, 1000], added to every element) and ``block``
(int > 0, threads per block; the header static_asserts a positive multiple of 32
<= 1024, so ``block=100`` is a deliberate compile error for the engine's error tests).
No ``space``: any such ints are variants, and the family is not part of ``prewarm --all``.

Exports: ``add_value(in, out)`` (GPU, current stream), ``add_value_cpu(in, out)``
(host reference, so tests can call a built module without a GPU),
``quant_probe(x, out)`` (GPU: the codes of ``jit_kernel/quant.cuh``'s device encoders for
fp32 ``x [n]`` into uint8 ``out [n, 4]``: fp8 e4m3, e2m1 threshold code, bf16 bits; see
``jit_kernel/selftest.cuh``), ``variant_value()``, ``variant_block()``, ``variant_arch()``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..jit.family import Family, register_family
from ..jit.variant import VariantKey

__all__ = ["SELFTEST"]


def _validate(params: Mapping[str, Any]) -> None:
    for name in {"value", "block"} - set(params):
        raise ValueError(f"selftest: missing parameter {name!r}")
    if set(params) - {"value", "block"}:
        raise ValueError(f"selftest: unexpected parameters {sorted(set(params) - {'value', 'block'})}")
    for name in ("value", "block"):
        if not isinstance(params[name], int) or isinstance(params[name], bool):
            raise ValueError(f"selftest: {name} must be an int, got {params[name]!r}")
    if not -1000 <= params["value"] <= 1000 or params["block"] <= 0:
        raise ValueError(f"selftest: need value in [-1000, 1000] and block > 0, got {dict(params)}")


def _warmup(key: VariantKey) -> None:
    """Launch the variant once on the current GPU."""
    import torch

    from ..jit.engine import load

    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    load(key).add_value(x, torch.empty_like(x))
    torch.cuda.synchronize()


SELFTEST = register_family(
    Family(
        "selftest",
        sources=(
            ("selftest_config.h.j2", "config.h"),
            ("selftest_kernel.cu.j2", "kernel.cu"),
            ("selftest_binding.cpp.j2", "binding.cpp"),
        ),
        exports=("add_value", "add_value_cpu", "quant_probe", "variant_value", "variant_block", "variant_arch"),
        warmup=_warmup,
    ),
    validate=_validate,
)
