"""The ``store`` JIT family: ``compress_norm_rope_store`` on CUDA tensors (spec store-and-jit.md §3-§6).

Same function and signature as ``flashcompress.torch_backend.ops.compress_norm_rope_store``:
it takes the checked ``validation.StoreCall``.  One warp per plan row
(``jit_kernel/store.cuh``): RMSNorm, interleaved RoPE on the last 64 dims at
``seq_len - ratio``, the 128-point Hadamard for the indexer, then the V4 / indexer FP8 /
indexer FP4 / bf16 encoding, or one of the V4.1 layouts (``layout=``: v41, v41_fp4, uniform_fp8,
v41_new, v41_fp4_new), scattered into the paged cache.  Skipped rows (decode:
``seq_len % ratio != 0``; prefill: invalid rows) write nothing.  The launch goes to the
caller's current stream, never synchronises the host and can be captured in a CUDA graph.

Variants: ``(head_dim, fmt, dtype)`` with ``fmt`` in {v4, bf16, v41, v41_fp4, uniform_fp8,
v41_new, v41_fp4_new} at 512 and {idx_fp8, idx_fp4} at 128, ``dtype`` (of ``kv`` and of the
weight the kernel reads) fp32 or bf16; ``page_size`` is a runtime argument.  The layout is the
variant's ``fmt`` (a template parameter of the kernel): the v4 variants' code is the same as
without the V4.1 ones.  Exports (``jit_kernel/store_binding.h``):
``forward``, ``forward_checked`` (the API's eager path, ``flashcompress.fastpath``: complex64
``freq_cis`` only), ``page_bytes``, ``format_info``.

Bytes match the PyTorch backend: scale bytes, bf16 rope / rows exactly; fp8 / fp4 codes
except where a value sits on a rounding tie within fp32 noise; indexer fp32 scales to
within an ulp or so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..jit.family import Family, module_memo, register_family
from ..layouts import CACHE_FORMATS, CacheFormat
from ..validation import StoreCall

if TYPE_CHECKING:  # pragma: no cover
    from ..jit.variant import VariantKey

__all__ = ["EXPORTS", "STORE", "compress_norm_rope_store", "store_module"]

EXPORTS = ("forward", "forward_checked", "page_bytes", "format_info")
FORMATS: dict[str, CacheFormat] = dict(CACHE_FORMATS)  # the V4 formats, then the V4.1 layouts
DTYPES: dict[torch.dtype, str] = {torch.float32: "f32", torch.bfloat16: "bf16"}


# --------------------------------------------------------------------------
# Family registration
# --------------------------------------------------------------------------


def _validate(params: Mapping[str, Any]) -> None:
    fmt, head_dim = params.get("fmt"), params.get("head_dim")
    if fmt not in FORMATS:
        raise ValueError(f"store: fmt must be one of {list(FORMATS)}, got {fmt!r}")
    if head_dim != FORMATS[fmt].head_dim or isinstance(head_dim, bool):
        raise ValueError(f"store: fmt={fmt} stores head_dim {FORMATS[fmt].head_dim} rows, got head_dim={head_dim!r}")
    if params.get("dtype") not in DTYPES.values():
        raise ValueError(f"store: dtype must be one of {list(DTYPES.values())}, got {params.get('dtype')!r}")


def _presets(model: str) -> list[dict[str, Any]]:
    """What a DeepSeek-V4 deployment stores: fp32 rows into the V4 main cache and both indexer caches."""
    from ..jit.models import model_config

    ratios = model_config(model).v4_ratios  # V4.1's ratio-1/2 layers store through the v41 family
    main = [{"head_dim": 512, "fmt": "v4", "dtype": "f32"}] if ratios else []
    indexer = [{"head_dim": 128, "fmt": fmt, "dtype": "f32"} for fmt in ("idx_fp8", "idx_fp4")] if 4 in ratios else []
    return main + indexer


def _warmup(key: "VariantKey") -> None:
    """Launch a loaded variant once on the current GPU: one decode row stored into a one-slot page."""
    from ..jit import load

    params = key.param_dict
    fmt = FORMATS[str(params["fmt"])]
    dtype = next(d for d, n in DTYPES.items() if n == params["dtype"])
    dev = torch.device("cuda", torch.cuda.current_device())
    kv = torch.zeros((1, fmt.head_dim), dtype=dtype, device=dev)
    weight = torch.ones((fmt.head_dim,), dtype=dtype, device=dev)
    freq = torch.ones((1, 32), dtype=torch.complex64, device=dev)
    plan = torch.tensor([4, 0, 0, 0], dtype=torch.int32).view(torch.uint8).view(1, 16).to(dev)  # stored, position 0
    loc = torch.zeros((1,), dtype=torch.int64, device=dev)
    cache = torch.zeros((1, fmt.cache_row_bytes(1)), dtype=torch.uint8, device=dev)
    _launch(load(key), kv, plan, True, 4, weight, 1e-6, freq, loc, cache, 1)
    torch.cuda.synchronize(dev)


STORE = register_family(
    Family(
        "store",
        sources=(("store_kernel.cu.j2", "kernel.cu"), ("store_binding.cpp.j2", "binding.cpp")),
        exports=EXPORTS,
        space={"head_dim": (512, 128), "fmt": tuple(FORMATS), "dtype": ("f32", "bf16")},
        warmup=_warmup,
    ),
    validate=_validate,
    presets=_presets,
)


# --------------------------------------------------------------------------
# Launcher
# --------------------------------------------------------------------------

_MODULES: dict[tuple[str, torch.dtype], Any] = module_memo()


def store_module(fmt: CacheFormat, dtype: torch.dtype) -> Any:
    """The loaded variant for ``fmt`` and ``kv``/weight dtype ``dtype`` (memoised per variant)."""
    key = (fmt.name, dtype)
    module = _MODULES.get(key)
    if module is None:
        from ..jit import get_module

        module = get_module("store", head_dim=fmt.head_dim, fmt=fmt.name, dtype=DTYPES[dtype])
        _MODULES[key] = module
    return module


def compress_norm_rope_store(call: StoreCall) -> None:
    """RMSNorm + RoPE (+ Hadamard) + quantised store of the plan's stored rows (one launch).

    Host work: one memo lookup, a weight cast only when its dtype differs from ``kv``'s
    (the peer's rounding of the weight), and ``freq_table`` (no view for a contiguous table).
    """
    kv, st = call.kv, call.store
    mod = _MODULES.get((st.fmt.name, kv.dtype)) or store_module(st.fmt, kv.dtype)
    norm_weight = st.norm_weight
    if norm_weight.dtype is not kv.dtype:
        norm_weight = norm_weight.to(kv.dtype)
    mod.forward(kv, call.plan_rows, norm_weight, st.norm_eps, freq_table(st.freq_cis), st.out_loc, st.kvcache,
                st.page_size, call.is_decode, call.ratio)


def _launch(
    mod: Any, kv: torch.Tensor, plan_rows: torch.Tensor, is_decode: bool, ratio: int, norm_weight: torch.Tensor,
    norm_eps: float, freq_cis: torch.Tensor, out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
) -> None:
    if norm_weight.dtype != kv.dtype:
        norm_weight = norm_weight.to(kv.dtype)
    mod.forward(kv, plan_rows, norm_weight, norm_eps, freq_table(freq_cis), out_loc, kvcache, page_size, is_decode,
                ratio)


def freq_table(freq_cis: torch.Tensor) -> torch.Tensor:
    """``freq_cis`` (complex64 ``[T, 32]``) as the bindings take it: the table itself when it is
    contiguous (the bindings read complex64 ``[T, 32]`` as its fp32 ``[T, 64]`` bytes), else a
    contiguous fp32 ``[T, 64]`` copy (re, im pairs).

    Nothing is memoised: a memo would keep the table alive, and under
    ``torch.compile(mode="reduce-overhead")`` that table can live in the CUDA graph pool, which
    CUDA-graph trees then refuse ("tensor(s) in the cudagraph pool not tracked as outputs";
    seen on the H200, 2026-12-02).
    """
    if freq_cis.is_contiguous():
        return freq_cis  # no view: a torch view costs about a microsecond per call
    return torch.view_as_real(freq_cis).flatten(-2).contiguous()
