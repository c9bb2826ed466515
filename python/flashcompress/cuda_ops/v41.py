"""The ``v41`` JIT family: DeepSeek-V4.1's low-ratio compressor ops on CUDA tensors (spec ``v41.md`` §3-§5).

Same functions and arguments as :mod:`flashcompress.torch_backend.v41` (already validated
tensors, outputs written in place), so :mod:`flashcompress.v41.api` picks one or the other
by device and nothing after validation branches again.  Kernels: ``jit_kernel/v41.cuh``
(one warp per 512-dim row, 16 lanes per index key, 16-byte loads, PDL wait first), launched
on the caller's current stream, never synchronising the host, CUDA-graph capturable.

Variants: ``(op, layout, design)`` with ``op`` in ``c1``, ``c2_decode`` (decode and verify),
``c2_prefill`` (pool pass + ring write-back) and ``index_k`` (``layout="none"``);
page size, ring size, draft length and ratio are runtime arguments.  ``design``:
``"base"`` (the first kernels), ``"fast"`` (latency-first load groups,
one warp per block for decode-sized launches, division-free quantisation, branch-free
pair weights, one warp per row pair in prefill) or ``"fast2"`` (``"fast"`` with two warps
per row for decode-sized c1 and c2 decode / verify launches) or ``"fast3"`` (``"fast2"``'s
launches with fewer instructions per row in the wide c1 / c2 kernels and the prefill pool pass:
packed bf16 roundings, hardware e4m3 scale bytes, a select-free pair weight; the default); index_k has only ``"base"``.  The calls below use :func:`current_design` (``set_design``, or the
environment variable ``FLASHCOMPRESS_V41_DESIGN`` at import).  One export, ``forward``
(signatures in ``jit_kernel/v41_binding.h``).  Bytes equal the PyTorch backend's on every
layout (``tests/test_gpu_v41_kernels.py``, ``tests/test_gpu_v41fast.py``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..jit.family import Family, module_memo, register_family
from ..v41.layouts import KVLayout

if TYPE_CHECKING:  # pragma: no cover
    from ..jit.variant import VariantKey

__all__ = ["DESIGNS", "EXPORTS", "OPS", "V41", "LAYOUTS", "c1_decode", "c2_decode", "c2_prefill", "current_design",
           "index_k", "set_design", "v41_module"]

EXPORTS = ("forward",)
OPS = ("c1", "c2_decode", "c2_prefill", "index_k")
LAYOUTS = tuple(m.value for m in KVLayout) + ("none",)
DESIGNS = ("base", "fast", "fast2", "fast3")
DEFAULT_DESIGN = "fast3"  # measured fastest or level in every c1 / c2 case (benchmarks/RESULTS.md, s19.2)
INDEX_K_DESIGN = "base"  # index_k has one design


def _validate(params: Mapping[str, Any]) -> None:
    op, layout = params.get("op"), params.get("layout")
    if (op == "index_k") != (layout == "none"):
        raise ValueError(f"v41: index_k takes layout='none', the other ops a KVLayout value; got op={op!r}, "
                         f"layout={layout!r}")
    if op == "index_k" and params.get("design", INDEX_K_DESIGN) != INDEX_K_DESIGN:
        raise ValueError(f"v41: index_k has one design ({INDEX_K_DESIGN!r}); got design={params.get('design')!r}")


# Compressed-pool layout of the ratio-1/2 source layers per target (spec v41.md §7.4, §10):
# an SM100-class GPU (capability major 10) runs the V4.1 main layouts, whose low-ratio pools are
# V41_FP4 (V41 main) or V41_FP4_NEW (V41_NEW main); other CUDA GPUs (Hopper, SM 12x) V4.
# The family has no HIP build, so a HIP target gets no layout (no preset).
SM100_LAYOUTS = ("v41_fp4", "v41_fp4_new")
DEFAULT_LAYOUTS = ("v4",)


def preset_layouts(target: str | None) -> tuple[str, ...]:
    """The cache layouts a V4.1 deployment on ``target`` stores (None: those of every CUDA target)."""
    if target is None:
        return DEFAULT_LAYOUTS + SM100_LAYOUTS
    from ..jit.variant import normalize_target

    arch = normalize_target(target)
    if not arch.startswith("cuda:"):
        return ()
    return SM100_LAYOUTS if arch.startswith("cuda:10.") else DEFAULT_LAYOUTS


def _presets(model: str, target: str | None = None) -> list[dict[str, Any]]:
    """What a model's ratio-1/2 source layers run on ``target``: c1 (ratio 1), c2 decode/verify and
    prefill (ratio 2) in the target's layouts, and the index-K store (page size, ratio: runtime)."""
    from ..jit.models import model_config

    ratios = model_config(model).low_ratios
    layouts = preset_layouts(target)
    if not ratios or not layouts:
        return []
    ops = (("c1",) if 1 in ratios else ()) + (("c2_decode", "c2_prefill") if 2 in ratios else ())
    return [{"op": op, "layout": layout, "design": DEFAULT_DESIGN} for layout in layouts for op in ops] + \
        [{"op": "index_k", "layout": "none", "design": INDEX_K_DESIGN}]


def _warmup(key: "VariantKey") -> None:
    """Launch a loaded variant once on the current GPU: one padded row (stores nothing)."""
    from ..jit import load

    params = key.param_dict
    op, layout = str(params["op"]), str(params["layout"])
    dev = torch.device("cuda", torch.cuda.current_device())
    mod = load(key)
    freqs = torch.zeros((1, 64), dtype=torch.float32, device=dev)
    pos = torch.zeros((1,), dtype=torch.int64, device=dev)
    loc = torch.zeros((1,), dtype=torch.int64, device=dev)
    if op == "index_k":
        mod.forward(torch.zeros((1, 128), dtype=torch.bfloat16, device=dev),
                    torch.ones((128,), dtype=torch.bfloat16, device=dev), 1e-6, freqs, pos, loc,
                    torch.zeros((1, 68), dtype=torch.uint8, device=dev), 1)
    else:
        lay = KVLayout(layout)
        cache = torch.zeros((1, lay.page_bytes(1)), dtype=torch.uint8, device=dev)
        weight = torch.ones((512,), dtype=torch.bfloat16, device=dev)
        out = torch.zeros((1, 512), dtype=torch.bfloat16, device=dev)
        if op == "c1":
            mod.forward(torch.zeros((1, 512), dtype=torch.bfloat16, device=dev), weight, pos, loc, 1e-6, freqs, cache,
                        1, out)
        else:
            kv = torch.zeros((1, 1024), dtype=torch.float32, device=dev)
            state = torch.zeros((2, 1024), dtype=torch.float32, device=dev)
            if op == "c2_decode":
                mod.forward(kv, state, weight, pos, loc, loc, 1e-6, freqs, cache, 1, 2, 1, out)
            else:
                i32 = torch.zeros((1,), dtype=torch.int32, device=dev)
                mod.forward(kv, state, weight, pos, loc, loc, 1e-6, freqs, cache, 1, 2, i32, i32, out)
    torch.cuda.synchronize(dev)


V41 = register_family(
    Family(
        "v41",
        sources=(("v41_kernel.cu.j2", "kernel.cu"), ("v41_binding.cpp.j2", "binding.cpp")),
        exports=EXPORTS,
        space={"op": OPS, "layout": LAYOUTS, "design": DESIGNS},
        defaults={"design": DEFAULT_DESIGN},
        warmup=_warmup,
    ),
    validate=_validate,
    presets=_presets,
)

_MODULES: dict[tuple[str, str, str], Any] = module_memo()
_DESIGN = [os.environ.get("FLASHCOMPRESS_V41_DESIGN", DEFAULT_DESIGN)]


def set_design(design: str) -> None:
    """Pick the kernel design (one of :data:`DESIGNS`) that the c1 / c2 calls launch from now on."""
    if design not in DESIGNS:
        raise ValueError(f"v41: design must be one of {DESIGNS}, got {design!r}")
    _DESIGN[0] = design


def current_design() -> str:
    """The kernel design the c1 / c2 calls launch (index_k always runs ``"base"``)."""
    if _DESIGN[0] not in DESIGNS:
        raise ValueError(f"FLASHCOMPRESS_V41_DESIGN must be one of {DESIGNS}, got {_DESIGN[0]!r}")
    return _DESIGN[0]


def v41_module(op: str, layout: str, design: str | None = None) -> Any:
    """The loaded variant of ``op`` for ``layout`` (a KVLayout value, or ``"none"`` for index_k) and
    ``design`` (default :func:`current_design`; index_k: ``"base"``), memoised."""
    design = INDEX_K_DESIGN if op == "index_k" else (design or current_design())
    key = (op, layout, design)
    module = _MODULES.get(key)
    if module is None:
        from ..jit import get_module

        module = get_module("v41", op=op, layout=layout, design=design)
        _MODULES[key] = module
    return module


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def c1_decode(kv_input: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor,
              eps: float, freqs_cis: torch.Tensor, k_cache: torch.Tensor, *, page_size: int, layout: KVLayout,
              out: torch.Tensor) -> None:
    """Ratio 1 (see :func:`flashcompress.torch_backend.v41.c1_decode`): one launch."""
    v41_module("c1", layout.value).forward(kv_input, norm_weight, positions, out_loc, eps, freqs_cis,
                                           _bytes(k_cache), page_size, out)


def c2_decode(kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor,
              req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
              k_cache: torch.Tensor, *, page_size: int, ring_size: int, draft_len: int, layout: KVLayout,
              out: torch.Tensor) -> None:
    """Ratio 2 decode / verify (see :func:`flashcompress.torch_backend.v41.c2_decode`): one launch."""
    v41_module("c2_decode", layout.value).forward(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                                  freqs_cis, _bytes(k_cache), page_size, ring_size, draft_len, out)


def c2_prefill(kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor,
               req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
               k_cache: torch.Tensor, extend_start_loc: torch.Tensor, extend_seq_lens: torch.Tensor, *,
               page_size: int, ring_size: int, layout: KVLayout, out: torch.Tensor) -> None:
    """Ratio 2 extend (see :func:`flashcompress.torch_backend.v41.c2_prefill`): pool pass + ring write-back."""
    v41_module("c2_prefill", layout.value).forward(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                                   freqs_cis, _bytes(k_cache), page_size, ring_size,
                                                   extend_start_loc, extend_seq_lens, out)


def index_k(input: torch.Tensor, norm_weight: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
            positions: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor, *, ratio: int) -> None:
    """Index keys (see :func:`flashcompress.torch_backend.v41.index_k`): one launch."""
    v41_module("index_k", "none").forward(input, norm_weight, eps, freqs_cis, positions, loc, cache, ratio)
