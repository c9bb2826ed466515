"""The ``selftest`` family: a tiny add-a-constant kernel that exercises the whole JIT path.

Params: ``value`` (int, added to every element) and ``block`` (int, threads per
block; the header static_asserts a positive multiple of 32 <= 1024, so
``block=100`` is a deliberate compile error for the engine's error tests).

Exports: ``add_value(in, out)`` (GPU, current stream), ``add_value_cpu(in, out)``
(host reference, so tests can call a built module without a GPU),
``variant_value()``, ``variant_block()``, ``variant_arch()``.

Not part of ``prewarm --all``; name it explicitly (``prewarm 'selftest:value=1,block=128'``).
Its model presets exist only to test the ``--model`` plumbing.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..jit.family import Family, register_family
from ..jit.variant import VariantKey

__all__ = ["SELFTEST", "run_selftest"]


def _validate(params: Mapping[str, Any]) -> None:
    for name in ("value", "block"):
        if name not in params:
            raise ValueError(f"selftest: missing parameter {name!r}")
        if not isinstance(params[name], int) or isinstance(params[name], bool):
            raise ValueError(f"selftest: {name} must be an int, got {params[name]!r}")
    extra = set(params) - {"value", "block"}
    if extra:
        raise ValueError(f"selftest: unexpected parameters {sorted(extra)}")
    if not -1000 <= params["value"] <= 1000:
        raise ValueError(f"selftest: value must be in [-1000, 1000], got {params['value']}")
    if params["block"] <= 0:
        raise ValueError(f"selftest: block must be positive, got {params['block']}")


def _warmup(key: VariantKey) -> None:
    """Launch the variant once on the current GPU and check the result."""
    import torch

    from ..jit.engine import load

    module = load(key)
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    module.add_value(x, out)
    torch.cuda.synchronize()
    value = dict(key.params)["value"]
    if not torch.equal(out, x + value):
        raise RuntimeError(f"selftest warm launch of {key.describe()} computed wrong values")


SELFTEST = register_family(
    Family(
        "selftest",
        sources=(
            ("selftest_config.h.j2", "config.h"),
            ("selftest_kernel.cu.j2", "kernel.cu"),
            ("selftest_binding.cpp.j2", "binding.cpp"),
        ),
        exports=("add_value", "add_value_cpu", "variant_value", "variant_block", "variant_arch"),
        warmup=_warmup,
    ),
    validate=_validate,
    presets={
        "deepseek-v4-flash": [{"value": 4, "block": 128}],
        "deepseek-v4-pro": [{"value": 4, "block": 128}, {"value": 128, "block": 256}],
    },
)


def run_selftest(value: int = 3, block: int = 128) -> None:
    """Build (or load) one selftest variant and check its host function; raises on any mismatch."""
    import torch

    from ..jit.engine import get_module

    module = get_module("selftest", value=value, block=block)
    x = torch.arange(64, dtype=torch.float32)
    out = torch.empty_like(x)
    module.add_value_cpu(x, out)
    if not torch.equal(out, x + value) or module.variant_value() != value or module.variant_block() != block:
        raise RuntimeError("selftest module returned wrong results")
