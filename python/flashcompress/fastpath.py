"""The binding-first eager path of the ops on CUDA tensors (what an engine's decode step runs).

A steady-state eager call on CUDA tensors goes straight to the loaded tvm-ffi binding: the
variant is found from a handful of cheap facts of the call (ratio, head dim, online, the plan's
class / ratio / kind, the dtypes of the input, state and output, the store flags and page size:
one dict lookup), and the binding checks in C++, before anything is launched, everything the
Python checks would reject for CUDA tensors outside ``FLASHCOMPRESS_DEBUG=1``: every tensor's
dtype, shape, contiguity, alignment and device, that the buffers a launch writes share no byte
with the ones it reads, the scalars' ranges (``jit_kernel/compress_binding.h``,
``store_binding.h``, ``ffi_check.h``).  The facts the binding cannot see stay here: the
scalars' Python types (``0`` is not ``False``), the plan's class, ratio and kind (part of the
key), ``requires_grad`` (tested with grad enabled, as ``validation`` does).

A call the binding rejects launched nothing; the caller then runs the full path
(``validation.check_*`` + ``dispatch``), which raises the named error of that path, or, when the
Python checks find nothing (a case the full path handles by converting an argument: an ``ape`` /
``norm_weight`` of another dtype, a strided ``freq_cis``), runs the call there, where the binding
raises again if the arguments really are wrong.

The compress bindings are those of the process-wide tiling (``cuda_ops.compress.current_tiling``;
``set_tiling`` empties ``COMPRESS`` / ``FUSED``).

Covered: ``compress_forward`` and ``compress_and_store`` of decode plans, every
``compress_norm_rope_store``, ``CompressorDecodePlan.generate`` / ``generate_online``.  Where the
call returns new rows (a plan; ``compress_forward`` with ``out=None``) the binding allocates them
itself through torch's allocator (tvm-ffi's environment allocator; probed once per key on
zero-row views, else the rows are allocated here with ``torch.empty``).

A key is learnt (``remember_*``) from a call that passed the full path on the JIT backend, so
only layer kinds, flags and dtypes that path accepted are ever looked up.  The memos hold bound
binding functions (no tensor) and are emptied with the JIT engine's memos (``jit.clear_memo``,
a settings reload).  Value checks (``FLASHCOMPRESS_DEBUG=1``), CPU tensors, the PyTorch backend,
``torch.compile`` and prefill plans of the compress ops take the full path as before.

The op functions return True (``compress_forward``: the output) when they launched, the plan
functions the plan; None means the caller must run the full path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import layouts as L
from .jit import settings as _settings
from .jit.family import module_memo

__all__ = ["compress_and_store", "compress_forward", "compress_norm_rope_store", "decode_plan", "online_decode_plan",
           "remember_compress", "remember_decode_plan", "remember_online_decode_plan", "remember_store"]

# (plan ratio, plan.is_online, compress_ratio, head_dim, is_online, state / input dtype, out dtype or
#  None for out=None) -> (compress_decode_alloc of the variant, True) for out=None where the binding
#  can allocate through torch's allocator, else (compress_decode, False)
COMPRESS: dict[tuple[Any, ...], tuple[Callable[..., Any], bool]] = module_memo()
# (plan ratio, plan.is_online, compress_ratio, head_dim, is_online, state / input dtype, use_fp4,
#  bf16_store, page_size, layout) -> compress_store_decode of the variant (layout "v4": the other
#  layouts run the two-step path, learnt nowhere)
FUSED: dict[tuple[Any, ...], Callable[..., None]] = module_memo()
# (plan class, plan ratio, kv dtype, head dim, use_fp4, bf16_store, page_size, layout value)
#   -> (forward_checked of the variant, is_decode, ratio); a KVLayout hashes and compares as its value
STORE: dict[tuple[Any, ...], tuple[Callable[..., None], bool, int]] = module_memo()

# (compress_ratio, swa_page_size, ring_size, use_req_ring) / ("online", state_slot_offset)
#   -> (the plan variant's decode_alloc, True) where the binding can allocate through torch's
#      allocator, else (its decode_checked, False): the rows are then allocated here
PLANS: dict[tuple[Any, ...], tuple[Callable[..., Any], bool]] = module_memo()

_DecodePlan: type | None = None  # plans.CompressorDecodePlan (set by plans.py: no import cycle)
_U8 = torch.uint8
_new_tuple = tuple.__new__


def _binding_checks() -> bool:
    """True when the bindings are the last line for CUDA tensors: the JIT backend, no debug checks.

    Reads the settings' memoised flags (None until first resolved: then the full path resolves
    them); the hot paths below read them inline (a function call costs about 0.1 µs)."""
    return _settings._JIT_ENABLED is True and _settings._DEBUG is False


def _needs_grad(*tensors: Any) -> bool:
    """True when a tensor requires grad (asked only in grad mode: the full path then names it)."""
    return any(t is not None and t.requires_grad for t in tensors)


def compress_forward(buf: Any, inp: Any, ape: Any, plan: Any, head_dim: Any, ratio: Any, out: Any,
                     online: Any) -> torch.Tensor | None:
    """``compress_forward`` of a decode plan through the binding; the output, or None (full path)."""
    if type(plan) is not _DecodePlan:
        return None
    try:
        hit = COMPRESS.get((plan[0], plan.is_online, ratio, head_dim, online, buf.dtype, inp.dtype,
                            None if out is None else out.dtype))
    except AttributeError:  # not tensors: the full path names the argument
        return None
    if (hit is None or type(head_dim) is not int or type(ratio) is not int or type(online) is not bool
            or not buf.is_cuda or _settings._DEBUG is not False or _settings._JIT_ENABLED is not True):
        return None
    if torch.is_grad_enabled() and _needs_grad(buf, inp, ape, out):
        return None
    launch, allocates = hit
    rows = plan[1]
    try:
        if allocates:  # out is None: the binding allocates it
            return launch(buf, inp, ape, rows)
        if out is None:
            out = torch.empty((rows.shape[0], head_dim), dtype=inp.dtype, device=inp.device)
        launch(buf, inp, ape, rows, out)
    except Exception:  # rejected before any launch: the full path raises the named error (or converts)
        return None
    return out


def compress_and_store(buf: Any, inp: Any, ape: Any, plan: Any, head_dim: Any, ratio: Any, online: Any,
                       store: tuple[Any, ...]) -> bool | None:
    """``compress_and_store`` of a decode plan through the binding; True, or None (full path).

    ``store``: ``(norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store,
    layout)``."""
    if type(plan) is not _DecodePlan:
        return None
    norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout = store
    try:
        launch = FUSED.get((plan[0], plan.is_online, ratio, head_dim, online, buf.dtype, inp.dtype, use_fp4,
                            bf16_store, page_size, layout))
    except (AttributeError, TypeError):  # not tensors, or an unhashable layout: the full path names it
        return None
    if (launch is None or type(head_dim) is not int or type(ratio) is not int or type(online) is not bool
            or type(use_fp4) is not bool or type(bf16_store) is not bool or type(page_size) is not int
            or not buf.is_cuda or _settings._DEBUG is not False or _settings._JIT_ENABLED is not True):
        return None
    if torch.is_grad_enabled() and _needs_grad(buf, inp, ape, norm_weight, freq_cis):
        return None
    try:
        launch(buf, inp, ape, plan[1], norm_weight, freq_cis, out_loc, kvcache, norm_eps, page_size)
    except Exception:
        return None
    return True


def compress_norm_rope_store(kv: Any, plan: Any, store: tuple[Any, ...]) -> bool | None:
    """``compress_norm_rope_store`` (decode or prefill plan) through the binding; True, or None."""
    norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, use_fp4, bf16_store, layout = store
    try:
        hit = STORE.get((type(plan), plan[0], kv.dtype, kv.shape[1], use_fp4, bf16_store, page_size, layout))
    except (AttributeError, IndexError, TypeError):
        return None
    if (hit is None or type(use_fp4) is not bool or type(bf16_store) is not bool or type(page_size) is not int
            or not kv.is_cuda or _settings._DEBUG is not False or _settings._JIT_ENABLED is not True):
        return None
    if torch.is_grad_enabled() and _needs_grad(kv, norm_weight, freq_cis):
        return None
    launch, is_decode, ratio = hit
    try:
        launch(kv, plan[1], norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size, is_decode, ratio)
    except Exception:
        return None
    return True


def _plan(ratio: int, plan_d: torch.Tensor, online: bool) -> Any:
    """``CompressorDecodePlan(ratio, plan_d, is_online=online)`` without its ``__new__`` (about 1 µs)."""
    plan = _new_tuple(_DecodePlan, (ratio, plan_d))
    plan.is_online = online
    return plan


def decode_plan(ratio: Any, req_pool_indices: Any, req_to_token: Any, full_to_state: Any, seq_lens: Any,
                swa_page_size: Any, ring_size: Any, use_req_ring: Any) -> Any:
    """``CompressorDecodePlan.generate`` through the binding: the plan, or None (full path)."""
    hit = PLANS.get((ratio, swa_page_size, ring_size, use_req_ring))
    if (hit is None or type(ratio) is not int or type(swa_page_size) is not int or type(ring_size) is not int
            or type(use_req_ring) is not bool or _settings._DEBUG is not False or _settings._JIT_ENABLED is not True):
        return None
    launch, allocates = hit
    try:
        if not req_pool_indices.is_cuda:
            return None
        if allocates:
            out = launch(req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size, ring_size,
                         use_req_ring)
        else:
            out = torch.empty((req_pool_indices.shape[0], 16), dtype=_U8, device=req_pool_indices.device)
            launch(out, req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size, ring_size,
                   use_req_ring)
    except Exception:  # not tensors, or rejected before any launch: the full path names the argument
        return None
    return _plan(ratio, out, False)


def online_decode_plan(seq_lens: Any, req_pool_indices: Any, req_to_token: Any, state_slot_offset: Any) -> Any:
    """``CompressorDecodePlan.generate_online`` through the binding: the plan, or None (full path)."""
    hit = PLANS.get(("online", state_slot_offset))
    if (hit is None or type(state_slot_offset) is not int or _settings._DEBUG is not False
            or _settings._JIT_ENABLED is not True):
        return None
    launch, allocates = hit
    try:
        if not req_pool_indices.is_cuda:
            return None
        if allocates:
            out = launch(req_pool_indices, req_to_token, seq_lens, state_slot_offset)
        else:
            out = torch.empty((req_pool_indices.shape[0], 16), dtype=_U8, device=req_pool_indices.device)
            launch(out, req_pool_indices, req_to_token, seq_lens, state_slot_offset)
    except Exception:
        return None
    return _plan(128, out, True)


# --------------------------------------------------------------------------
# Learning the keys from calls the full path accepted
# --------------------------------------------------------------------------


def _learnable(device: int) -> bool:
    """A call on ``device`` (``get_device()`` index) whose binding is the last line of checks."""
    return device >= 0 and _binding_checks()


def remember_compress(call: Any, plan: Any, head_dim: int, ratio: int, online: bool, out: Any) -> None:
    """Learn the key of a ``compress_forward`` / ``compress_and_store`` decode call (``call``: the
    ``validation.CompressCall`` the full path launched) unless it is known or not eligible."""
    if call.device < 0 or type(plan) is not _DecodePlan or not _learnable(call.device):
        return
    from .cuda_ops import compress as cc

    pool, inp, st = call.pool, call.inp, call.store
    layer = call.layer
    if st is None:
        key = (plan[0], plan.is_online, ratio, head_dim, online, pool.dtype, inp.dtype,
               None if out is None else out.dtype)
        if key not in COMPRESS:
            out_dtype = inp.dtype if out is None else out.dtype
            module = cc._module(layer.ratio, layer.online, layer.head_dim, inp.dtype, pool.dtype, out_dtype, "none",
                                cc.current_tiling())
            entry = (_no_gil(module.compress_decode), False)
            if out is None:  # probe the allocating export on zero-row views: allocates and launches nothing
                alloc = _no_gil(module.compress_decode_alloc)
                if _allocates(alloc, (0, layer.head_dim), out_dtype, pool, inp[:0], call.ape, call.plan_rows[:0]):
                    entry = (alloc, True)
            COMPRESS[key] = entry
        return
    if inp.dtype is not torch.float32:  # bf16 input: the backend rounds the weight per call (full path)
        return
    fmt = st.fmt
    if fmt.name not in cc.EPILOGUE_FORMATS:  # a V4.1 layout: compress_and_store runs the two steps
        return
    use_fp4, bf16_store = fmt.name == "idx_fp4", fmt.name == "bf16"
    key = (plan[0], plan.is_online, ratio, head_dim, online, pool.dtype, inp.dtype, use_fp4, bf16_store,
           st.page_size, "v4")
    if key not in FUSED:
        module = cc._module(layer.ratio, layer.online, layer.head_dim, inp.dtype, pool.dtype, inp.dtype, fmt.name,
                            cc.current_tiling())
        FUSED[key] = _no_gil(module.compress_store_decode)


def remember_store(call: Any, plan: Any) -> None:
    """Learn the key of a ``compress_norm_rope_store`` call the full path launched (``call``: its
    ``validation.StoreCall``)."""
    if call.device < 0 or not _learnable(call.device):
        return
    from .cuda_ops import store as cs

    kv, st = call.kv, call.store
    fmt = st.fmt
    layout = fmt.name if fmt.name in L.MAIN_LAYOUT_NAMES else "v4"  # the indexer and bf16 formats: layout v4
    key = (type(plan), plan[0], kv.dtype, kv.shape[1], fmt.name == "idx_fp4", fmt.name == "bf16", st.page_size,
           layout)
    if key not in STORE:
        STORE[key] = (_no_gil(cs.store_module(fmt, kv.dtype).forward_checked), call.is_decode, call.ratio)


def remember_decode_plan(plan: Any, ratio: int, swa_page_size: int, ring_size: int, use_req_ring: bool,
                         req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, full_to_state: torch.Tensor,
                         seq_lens: torch.Tensor) -> None:
    """Learn the scalars of a ``CompressorDecodePlan.generate`` call the full path built on the GPU
    (its tensors: for the allocator probe of ``_plan_entry``)."""
    if not _learnable(plan[1].get_device()):
        return
    key = (ratio, swa_page_size, ring_size, use_req_ring)
    if key not in PLANS:
        from .cuda_ops import plans as cp

        module = cp._module(ratio, False)
        PLANS[key] = _plan_entry(module, req_pool_indices[:0], req_to_token, full_to_state, seq_lens[:0],
                                 swa_page_size, ring_size, use_req_ring)


def remember_online_decode_plan(plan: Any, state_slot_offset: int, req_pool_indices: torch.Tensor,
                                req_to_token: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Learn the offset of a ``CompressorDecodePlan.generate_online`` call the full path built on the GPU."""
    if not _learnable(plan[1].get_device()):
        return
    key = ("online", state_slot_offset)
    if key not in PLANS:
        from .cuda_ops import plans as cp

        module = cp._module(128, True)
        PLANS[key] = _plan_entry(module, req_pool_indices[:0], req_to_token, seq_lens[:0], state_slot_offset)


def _plan_entry(module: Any, *probe: Any) -> tuple[Callable[..., Any], bool]:
    """``(decode_alloc, True)`` when the binding allocates through the caller's allocator (probed
    once on zero-row views of the learnt call: allocates nothing, launches nothing), else
    ``(decode_checked, False)``."""
    alloc = _no_gil(module.decode_alloc)
    if _allocates(alloc, (0, 16), torch.uint8, *probe):
        return alloc, True
    return _no_gil(module.decode_checked), False


def _allocates(fn: Any, shape: tuple[int, int], dtype: torch.dtype, *probe: Any) -> bool:
    """True when ``fn(*probe)`` returns a CUDA tensor of ``shape`` and ``dtype`` (an allocating export
    called on zero-row views; False where tvm-ffi's environment has no allocator)."""
    try:
        rows = fn(*probe)
    except Exception:  # noqa: BLE001
        return False
    return isinstance(rows, torch.Tensor) and tuple(rows.shape) == shape and rows.dtype == dtype and rows.is_cuda


def _no_gil(fn: Any) -> Any:
    """``fn`` (a tvm-ffi function) called without releasing the GIL: the bindings only check and
    launch (as a torch op does with the GIL held); releasing and taking it back costs per call."""
    try:
        fn.release_gil = False
    except AttributeError:  # a test's stand-in
        pass
    return fn
