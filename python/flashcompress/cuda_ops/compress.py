"""The ``compress`` JIT family: CUDA kernels of ``compress_forward`` and ``compress_and_store``.

Same functions and signatures as the PyTorch backend's op entry points
(``torch_backend/ops.py``): each takes the checked call object of ``flashcompress.validation``
and the variant's ``tiling`` (default ``auto``).
Kernels: ``jit_kernel/compress.cuh`` (header comment: shapes, plan rows read; the
files by role it includes: tiling, pooling, epilogue, decode, prefill), binding checks ``jit_kernel/compress_binding.h``, templates
``templates/compress_{kernel.cu,binding.cpp}.j2`` (one explicit instantiation).

Variant parameters::

    ratio       4 | 128                 online      False | True (ratio 128, head 512)
    head_dim    512 | 128 (ratio 4)     in_dtype / state_dtype / out_dtype   "f32" | "bf16"
    store       "none" (compress_forward) | "v4" | "bf16" (head 512) | "idx_fp8" | "idx_fp4" (head 128)
    tiling      "auto" (thread block clusters for C128 rows where the target has them) |
                "whole_row" (one 512-thread block per C128 row, as on targets without clusters) |
                "closing" ("auto", but the C128 decode of every batch size by the grid that pools
                only the window-closing requests, copies spread over all blocks: "auto" uses it
                for batches of more than 128 requests, one block per (request, slice) below)

``compress_forward`` / ``compress_and_store`` take ``tiling`` as a keyword, so a test can run
every tiling on one GPU; without it they run the process-wide tiling of ``set_tiling`` (default
"auto"), which the public ops' eager fast path (``flashcompress.fastpath``) follows too: A/B
benchmarks switch designs with it.

A store variant rounds each compressed row to the input dtype (``out_dtype ==
in_dtype``, the dtype of the two-step path's intermediate) before the store.

Every call launches on the caller's current CUDA stream and never synchronises:
decode is one kernel; prefill is the compress pass then the write pass (the
second waits on the first through programmatic dependent launch on SM90).
``compress_and_store`` is the compress kernel with the store epilogue (no intermediate
rows) in decode and C4 prefill; C128 and online C128 prefill run the two-step path's
launches (compress pass, write pass, store kernel), which measured faster there (the
README's "which to use" paragraph).  A store into one of the V4.1 layouts (``layout=`` other
than ``"v4"``; no epilogue variant exists for them) runs as the two steps as well:
``compress_forward`` into rows of the input dtype, then the store kernel (same bytes).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..jit.family import Family, module_memo, register_family
from ..jit.models import model_config
from ..validation import CompressCall
from .store import freq_table

__all__ = ["COMPRESS", "TILINGS", "compress_and_store", "compress_forward", "current_tiling", "set_tiling"]

_DTYPES: dict[torch.dtype, str] = {torch.float32: "f32", torch.bfloat16: "bf16"}
# The cache formats the compress kernel's store epilogue writes (the family's ``store`` values
# other than "none"); any other format (the V4.1 layouts) is stored by the store kernel after it.
_STORES = ("none", "v4", "idx_fp8", "idx_fp4", "bf16")
EPILOGUE_FORMATS: frozenset[str] = frozenset(_STORES[1:])
# The family's ``tiling`` values (the module docstring; templates/_common.j2 maps them to
# jit_kernel/compress_launch.h's Tiling).
TILINGS: tuple[str, ...] = ("auto", "whole_row", "closing")


def _validate(p: Mapping[str, Any]) -> None:
    """The constraints ``space`` cannot express (the peer's variant inventory, plus stores)."""
    ratio, online, head, store = p["ratio"], p["online"], p["head_dim"], p["store"]
    if ratio == 128 and head != 512:
        raise ValueError(f"compress: ratio 128 exists only with head_dim 512, got {head}")
    if online and not (ratio == 128 and p["in_dtype"] == "f32" and p["out_dtype"] == "f32"):
        raise ValueError("compress: online=True needs ratio 128, head_dim 512 and f32 input and output")
    if store in ("v4", "bf16") and head != 512:
        raise ValueError(f"compress: store={store!r} is the main-KV format (head_dim 512), got {head}")
    if store in ("idx_fp8", "idx_fp4") and head != 128:
        raise ValueError(f"compress: store={store!r} is an indexer format (head_dim 128), got {head}")
    if store != "none" and p["out_dtype"] != p["in_dtype"]:
        raise ValueError("compress: a store variant rounds rows to the input dtype (out_dtype == in_dtype)")


def _presets(model: str) -> list[dict[str, Any]]:
    """What DeepSeek-V4 runs: fp32 input and state, every layer kind, plain and fused."""
    cfg = model_config(model)
    f32 = {"in_dtype": "f32", "state_dtype": "f32", "out_dtype": "f32"}
    out: list[dict[str, Any]] = []
    if 4 in cfg.compress_ratios:
        for store in ("none", "v4"):
            out.append({"ratio": 4, "online": False, "head_dim": cfg.head_dim, **f32, "store": store})
        for store in ("none", "idx_fp8", "idx_fp4"):
            out.append({"ratio": 4, "online": False, "head_dim": cfg.index_head_dim, **f32, "store": store})
    if 128 in cfg.compress_ratios:
        for store in ("none", "v4"):
            out.append({"ratio": 128, "online": False, "head_dim": cfg.head_dim, **f32, "store": store})
        for store in ("none", "v4"):
            out.append({"ratio": 128, "online": True, "head_dim": cfg.head_dim, **f32, "store": store})
    return [{**p, "tiling": "auto"} for p in out]


def _warmup(key: Any) -> None:
    """Launch a loaded variant once on the current GPU: one decode row that closes a window."""
    from ..jit import load

    p = key.param_dict
    ratio, head, online, store = int(p["ratio"]), int(p["head_dim"]), bool(p["online"]), str(p["store"])
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}
    dev = torch.device("cuda", torch.cuda.current_device())
    width_in = (4 if ratio == 4 else 2) * head
    width_state = 3 * head if online else width_in
    state = torch.zeros((2 * ratio, width_state), dtype=dt[p["state_dtype"]], device=dev)
    inp = torch.zeros((1, width_in), dtype=dt[p["in_dtype"]], device=dev)
    ape = torch.zeros((8 if ratio == 4 else 128, head), dtype=dt[p["in_dtype"]], device=dev)
    row = [ratio, ratio - 1, 0, 0] if not online else [128, 1, 1, -1]
    plan = torch.tensor(row, dtype=torch.int32).view(torch.uint8).view(1, 16).to(dev)
    module = load(key)
    if store == "none":
        out = torch.empty((1, head), dtype=dt[p["out_dtype"]], device=dev)
        module.compress(state, inp, ape, plan, plan, out, True)
    else:
        from ..layouts import select_cache_format

        fmt = select_cache_format(head, store == "idx_fp4", store == "bf16")
        cache = torch.zeros((1, fmt.cache_row_bytes(1)), dtype=torch.uint8, device=dev)
        weight = torch.ones((head,), dtype=torch.float32, device=dev)
        freq = torch.zeros((1, 64), dtype=torch.float32, device=dev)
        loc = torch.zeros((1,), dtype=torch.int64, device=dev)
        module.compress_store(state, inp, ape, plan, plan, weight, freq, loc, cache, 1e-6, 1, True)
    torch.cuda.synchronize()


COMPRESS = register_family(
    Family(
        "compress",
        sources=(("compress_kernel.cu.j2", "kernel.cu"), ("compress_binding.cpp.j2", "binding.cpp")),
        exports=("compress", "compress_store", "compress_decode", "compress_decode_alloc", "compress_store_decode"),
        space={
            "ratio": (4, 128),
            "online": (False, True),
            "head_dim": (512, 128),
            "in_dtype": ("f32", "bf16"),
            "state_dtype": ("f32", "bf16"),
            "out_dtype": ("f32", "bf16"),
            "store": _STORES,
            "tiling": TILINGS,
        },
        defaults={"tiling": "auto"},
        warmup=_warmup,
    ),
    validate=_validate,
    presets=_presets,
)


_MODULES: dict[tuple[Any, ...], Any] = module_memo()


def _module(ratio: int, online: bool, head_dim: int, inp: torch.dtype, state: torch.dtype,
            out: torch.dtype, store: str, tiling: str) -> Any:
    """The loaded variant, memoised on the call's own values (the launchers look in ``_MODULES``
    themselves first and call this only on a miss)."""
    memo = (ratio, online, head_dim, inp, state, out, store, tiling)
    module = _MODULES.get(memo)
    if module is None:
        from ..jit import get_module

        module = get_module("compress", ratio=ratio, online=online, head_dim=head_dim, in_dtype=_DTYPES[inp],
                            state_dtype=_DTYPES[state], out_dtype=_DTYPES[out], store=store, tiling=tiling)
        _MODULES[memo] = module
    return module


_TILING = "auto"


def set_tiling(tiling: str) -> None:
    """Make ``tiling`` the one the public ops run from now on in this process (default "auto").

    For A/B runs of kernel designs (``benchmarks/ --tiling``); the fast path's memoised
    bindings are forgotten so that it follows."""
    global _TILING
    if tiling not in TILINGS:
        raise ValueError(f"tiling: expected one of {', '.join(TILINGS)}, got {tiling!r}")
    if tiling != _TILING:
        from .. import fastpath

        _TILING = tiling
        fastpath.COMPRESS.clear()
        fastpath.FUSED.clear()


def current_tiling() -> str:
    """The tiling ``set_tiling`` chose ("auto" unless changed)."""
    return _TILING


def compress_forward(call: CompressCall, out: torch.Tensor, tiling: str | None = None) -> None:
    """Pool windows into ``out`` and update the state pool (decode: ``call.plan_w`` is None).

    The binding takes the pool as passed (flat or paged view: no view made here); ``tiling``
    None: ``current_tiling()``."""
    if tiling is None:
        tiling = _TILING
    layer, pool, inp, ape, plan_rows, plan_w = call.layer, call.pool, call.inp, call.ape, call.plan_rows, call.plan_w
    in_dtype = inp.dtype
    if ape.dtype is not in_dtype:
        ape = ape.to(in_dtype)
    memo = (layer.ratio, layer.online, layer.head_dim, in_dtype, pool.dtype, out.dtype, "none", tiling)
    module = _MODULES.get(memo)
    if module is None:
        module = _module(*memo)
    if plan_w is None:
        module.compress(pool, inp, ape, plan_rows, plan_rows, out, True)
    else:
        module.compress(pool, inp, ape, plan_rows, plan_w, out, False)


def compress_and_store(call: CompressCall, tiling: str | None = None) -> None:
    """Pool windows, update the state pool and store each compressed row into ``kvcache``: the
    compress kernel with the store epilogue (decode: one launch; C4 prefill: the pooling pass,
    which stores, then the state write pass). C128 and online C128 prefill run the two-step
    path's launches instead (compress pass, write pass, store kernel), which measured faster
    than the stored pooling pass there (RESULTS.md, s16.2 / s17.3), and so does every store into a
    V4.1 layout (no epilogue variant; the store kernel writes them). ``tiling`` None:
    ``current_tiling()``."""
    if tiling is None:
        tiling = _TILING
    if (call.plan_w is not None and call.layer.ratio == 128) or call.store.fmt.name not in EPILOGUE_FORMATS:
        _compress_then_store(call, tiling)
        return
    layer, pool, inp, ape, plan_rows, plan_w, st = (call.layer, call.pool, call.inp, call.ape, call.plan_rows,
                                                    call.plan_w, call.store)
    in_dtype = inp.dtype
    if ape.dtype is not in_dtype:
        ape = ape.to(in_dtype)
    norm_weight = st.norm_weight
    if norm_weight.dtype is not in_dtype:  # the two-step path rounds the weight to the kv dtype
        norm_weight = norm_weight.to(in_dtype)
    if in_dtype is not torch.float32:  # the kernel reads an fp32 weight
        norm_weight = norm_weight.float()
    memo = (layer.ratio, layer.online, layer.head_dim, in_dtype, pool.dtype, in_dtype, st.fmt.name, tiling)
    module = _MODULES.get(memo)
    if module is None:
        module = _module(*memo)
    is_decode = plan_w is None
    module.compress_store(pool, inp, ape, plan_rows, plan_rows if is_decode else plan_w, norm_weight,
                          freq_table(st.freq_cis), st.out_loc, st.kvcache, st.norm_eps, st.page_size, is_decode)


def _compress_then_store(call: CompressCall, tiling: str) -> None:
    """``compress_and_store`` of a C128 / online C128 prefill or into a V4.1 layout:
    ``compress_forward`` into rows of the input dtype (the two-step path's intermediate), then
    ``compress_norm_rope_store``."""
    from ..validation import StoreCall
    from .store import compress_norm_rope_store

    kv = torch.empty((call.plan_rows.shape[0], call.layer.head_dim), dtype=call.inp.dtype, device=call.inp.device)
    compress_forward(call, kv, tiling=tiling)
    compress_norm_rope_store(StoreCall(kv, call.plan_rows, call.is_decode, call.layer.ratio, call.store,
                                       call.device))
