"""The V4.1 low-ratio compressor ops, with SGLang 0.5.23's signatures (drop-in for
``sglang.kernels.ops.attention.dsv4.low_ratio_compress`` and ``...fp4_indexer_rope``).

Data flow: arguments -> :mod:`.validation` (everything checked before anything
is written) -> a backend with the same functions: the CUDA kernels of the ``v41``
JIT family (:mod:`flashcompress.cuda_ops.v41`) for CUDA tensors, the PyTorch
backend :mod:`flashcompress.torch_backend.v41` for CPU tensors or under
``FLASHCOMPRESS_BACKEND=torch`` (the same choice as ``flashcompress.dispatch``).

Differences from SGLang, all on inputs SGLang leaves undefined: empty batches
are no-ops; bad shapes / dtypes / devices raise named errors; for CPU tensors
(and under ``FLASHCOMPRESS_DEBUG=1``) positions, slots, ring rows and extend
ranges are bounds-checked; ``out=None`` allocates a zeroed latent (rows the op
does not write read 0 instead of garbage).
"""

from __future__ import annotations

import torch

from types import ModuleType

from ..jit.settings import jit_enabled_for
from ..torch_backend import v41 as _torch_v41
from . import library as _library  # torch.compile: the flashcompress:: custom ops (used only while tracing)
from . import validation as V
from .layouts import LATENT_DIM, KVLayout

_cuda_v41: ModuleType | None = None


def _backend(t: torch.Tensor) -> ModuleType:
    """The module that runs the ops for ``t``'s device: ``cuda_ops.v41`` (imported on first GPU use)
    or ``torch_backend.v41``."""
    global _cuda_v41
    if not jit_enabled_for(t.device):
        return _torch_v41
    if _cuda_v41 is None:
        from ..cuda_ops import v41 as cuda_v41

        _cuda_v41 = cuda_v41
    return _cuda_v41


def _latent_out(out: torch.Tensor | None, kv_input: torch.Tensor) -> torch.Tensor:
    if out is not None:
        return out
    return torch.zeros((kv_input.shape[0], LATENT_DIM), dtype=torch.bfloat16, device=kv_input.device)


def c1_decode_norm_rope_store(
    kv_input: torch.Tensor,
    norm_weight: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    k_cache: torch.Tensor,
    *,
    page_size: int,
    layout: KVLayout | str = KVLayout.V4,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ratio 1: RMSNorm every row, publish the pre-RoPE bf16 latent, RoPE + fp4 fake-quant + store.

    Args:
        kv_input: ``[N, 512]`` bf16, the ``wkv`` projection (not normed).
        norm_weight: ``[512]`` bf16 RMSNorm weight.
        positions: ``[N]`` int32/int64 token positions (RoPE row = position).
        out_loc: ``[N]`` int32/int64 compressed slots; rows with ``out_loc <= 0`` (0 = padding) store nothing.
        eps: RMSNorm epsilon (used in fp32; V4.1-Flash: 1e-20).
        freqs_cis: ``[rows, 64]`` fp32 RoPE table, (cos, sin) interleaved.
        k_cache: ``[pages, layout.page_bytes(page_size)]`` uint8 (or float8_e4m3fn view), written in place.
        page_size: slots per page, a power of two (256 for the ratio-1 pool).
        layout: a :class:`KVLayout` or its name.
        out: optional ``[N, 512]`` bf16 destination of the latent.

    Returns:
        ``out``: the post-norm, pre-RoPE bf16 latent of every row (padded rows included).
    """
    if torch.compiler.is_compiling():  # traced by torch.compile: one custom op, no value checks in the graph
        return _library.c1_decode_norm_rope_store(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache,
                                                  page_size=page_size, layout=layout, out=out)
    a = V.check_c1(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache, page_size, layout, out)
    result = _latent_out(a.out, a.kv_input)
    if a.kv_input.shape[0]:
        _backend(a.kv_input).c1_decode(a.kv_input, a.norm_weight, a.positions, a.out_loc, a.eps, a.freqs_cis, a.k_cache,
                          page_size=a.page_size, layout=a.layout, out=result)
    return result


def c2_decode_norm_rope_store(
    kv_input: torch.Tensor,
    kv_state: torch.Tensor,
    norm_weight: torch.Tensor,
    positions: torch.Tensor,
    req: torch.Tensor,
    raw_out_loc: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    k_cache: torch.Tensor,
    *,
    page_size: int,
    ring_size: int,
    draft_len: int = 1,
    layout: KVLayout | str = KVLayout.V4,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ratio 2 decode (``draft_len == 1``, one row per request) or target verify (``draft_len > 1``).

    Even positions park their input row in the pair ring (row ``req * ring + pos % ring``);
    odd positions softmax-pool with their partner (the previous row of the verify block,
    else ring row ``req * ring + (pos - 1) % ring``), RMSNorm, write ``out[row]``, then RoPE at
    ``pos - 1``, fake-quantise and store at slot ``raw_out_loc >> 1``.  ``raw_out_loc == 0``
    marks a padded row (nothing written; its ``req`` / ``pos`` must still be in range).

    Args:
        kv_input: ``[N, 1024]`` fp32, ``kv | score`` of each row.
        kv_state: ``[rows, 1024]`` fp32 pair ring, written in place.
        norm_weight, eps, freqs_cis, k_cache, page_size, layout, out: as for :func:`c1_decode_norm_rope_store`
            (``page_size`` 128 for the ratio-2 pool).
        positions: ``[N]`` int32/int64 own positions.
        req: ``[N]`` int64 request slots.
        raw_out_loc: ``[N]`` int32/int64 full-KV slots (0 = padding).
        ring_size: ring rows per request (> ``draft_len`` when verifying).
        draft_len: rows per request block; ``N`` must be a multiple of it.

    Returns:
        ``out``; only odd, non-padded rows are written.
    """
    if torch.compiler.is_compiling():
        return _library.c2_decode_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                                  freqs_cis, k_cache, page_size=page_size, ring_size=ring_size,
                                                  draft_len=draft_len, layout=layout, out=out)
    a = V.check_c2(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
                   page_size, ring_size, layout, out)
    d = V.check_c2_decode(a, draft_len)
    result = _latent_out(a.out, a.kv_input)
    if a.kv_input.shape[0]:
        _backend(a.kv_input).c2_decode(a.kv_input, a.kv_state, a.norm_weight, a.positions, a.req, a.raw_out_loc, a.eps,
                          a.freqs_cis, a.k_cache, page_size=a.page_size, ring_size=a.ring_size, draft_len=d,
                          layout=a.layout, out=result)
    return result


def c2_prefill_norm_rope_store(
    kv_input: torch.Tensor,
    kv_state: torch.Tensor,
    norm_weight: torch.Tensor,
    positions: torch.Tensor,
    req: torch.Tensor,
    raw_out_loc: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    k_cache: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    *,
    page_size: int,
    ring_size: int,
    layout: KVLayout | str = KVLayout.V4,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Ratio 2 extend: pool every odd, non-padded row, then park each request's last ``ring_size`` rows.

    An odd row pairs with the previous input row when it is the same request, the previous
    position and not padded, else with the ring.  Request ``i`` owns rows
    ``[extend_start_loc[i], extend_start_loc[i] + extend_seq_lens[i])`` (int32 ``[B]``; zero
    lengths allowed); after the call the ring holds the last ``min(len, ring)`` non-padded rows
    of every request.  Other arguments as :func:`c2_decode_norm_rope_store`.

    Returns:
        ``out``; only odd, non-padded rows are written.
    """
    if torch.compiler.is_compiling():
        return _library.c2_prefill_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                                   freqs_cis, k_cache, extend_start_loc, extend_seq_lens,
                                                   page_size=page_size, ring_size=ring_size, layout=layout, out=out)
    a = V.check_c2(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
                   page_size, ring_size, layout, out,
                   extra_read={k: t for k, t in (("extend_start_loc", extend_start_loc),
                                                 ("extend_seq_lens", extend_seq_lens))
                               if isinstance(t, torch.Tensor)})
    start, lens = V.check_c2_prefill(a, extend_start_loc, extend_seq_lens)
    result = _latent_out(a.out, a.kv_input)
    if a.kv_input.shape[0]:
        _backend(a.kv_input).c2_prefill(a.kv_input, a.kv_state, a.norm_weight, a.positions, a.req, a.raw_out_loc, a.eps,
                           a.freqs_cis, a.k_cache, start, lens, page_size=a.page_size, ring_size=a.ring_size,
                           layout=a.layout, out=result)
    return result


def index_k_norm_rope_pack_store(
    input: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
    loc: torch.Tensor,
    cache: torch.Tensor,
    *,
    ratio: int,
) -> None:
    """Index keys: RMSNorm over 128, RoPE at ``pos & ~(ratio - 1)``, two-stage fp4, 68-byte slot store.

    Args:
        input: ``[N, 128]`` bf16, ``wk(latent)`` before ``k_norm``.
        norm_weight: ``[128]`` bf16 ``k_norm`` weight.
        eps: ``k_norm`` epsilon.
        freqs_cis: ``[rows, 64]`` fp32 RoPE table.
        positions: ``[N]`` int32/int64 token positions.
        loc: ``[N]`` int64 slots (``c1_out_loc`` / ``c2_out_loc``); ``loc <= 0`` stores nothing.
        cache: ``[pages, 68 * P]`` uint8 index-K pool (P = slots per page, a power of two), written in place.
        ratio: 1 or 2.
    """
    if torch.compiler.is_compiling():
        return _library.index_k_norm_rope_pack_store(input, norm_weight, eps, freqs_cis, positions, loc, cache,
                                                     ratio=ratio)
    a = V.check_index_k(input, norm_weight, eps, freqs_cis, positions, loc, cache, ratio)
    if a.input.shape[0]:
        _backend(a.input).index_k(a.input, a.norm_weight, a.eps, a.freqs_cis, a.positions, a.loc, a.cache, ratio=a.ratio)
