"""The V4.1 objects ``flashcompress.integrations.sglang.apply()`` binds into SGLang (imported by ``apply()``).

SGLang 0.5.23 runs a DeepSeek-V4.1 ratio-1 / ratio-2 source layer through
``DeepseekV4AttnBackend._low_ratio_compress_fused`` when the layer's compressor
was built with ``use_fused_compress`` (the answer of
``dsv41_sparse.fused_low_ratio_compress_supported()``: CUDA capability major
>= 10, or gfx950), else through its multi-launch torch / Triton path.  The
fused method imports the four entry points below from their modules at call
time, so rebinding them there is enough; the gate is rebound so that the
fused method is also chosen on Hopper.

The adapters keep SGLang's signatures (argument order, keyword names,
defaults, return values).  ``layout`` is SGLang's ``KVLayout`` (a ``str``
enum with the same six values as :class:`flashcompress.KVLayout`) or its
string; it is mapped by value, and anything else raises
``UnsupportedFeatureError`` before anything is written.  flashcompress's
``v41`` kernels have no ROCm build, so on a ROCm torch the adapters refuse too
(and the gate keeps SGLang's answer).  Everything else (shapes, dtypes, value
ranges) is validated by the flashcompress ops, also before any write.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch

from flashcompress import v41 as _v41
from flashcompress.v41 import KVLayout

from .errors import UnsupportedFeatureError

MIN_CAPABILITY_MAJOR = 9
"""CUDA capability major from which the patched gate answers True (flashcompress's v41 kernels run there)."""

_BY_VALUE = {m.value: m for m in KVLayout}


def sglang_layout(op: str, layout: object) -> KVLayout:
    """flashcompress's ``KVLayout`` for SGLang's ``layout`` argument (a ``KVLayout`` member or its string).

    SGLang's members are matched by value (``KVLayout.V41_FP4.value == "v41_fp4"``),
    strings in any case as SGLang's ``KVLayout.parse`` does.  Anything else
    raises ``UnsupportedFeatureError`` naming ``op``.
    """
    value = getattr(layout, "value", layout)
    found = _BY_VALUE.get(value.lower()) if isinstance(value, str) else None
    if found is None:
        raise UnsupportedFeatureError(
            f"{op}(layout={layout!r}): flashcompress implements the layouts {sorted(_BY_VALUE)}; "
            "nothing was written (revert the SGLang integration to use SGLang's own kernel)")
    return found


def _refuse_rocm(op: str) -> None:
    if torch.version.hip is not None:
        raise UnsupportedFeatureError(
            f"{op}: flashcompress's V4.1 kernels have no ROCm build; nothing was written "
            "(apply the SGLang integration with low_ratio=False on ROCm)")


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
    layout: Union[KVLayout, str] = KVLayout.V4,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SGLang's ``low_ratio_compress.c1_decode_norm_rope_store`` on ``flashcompress.c1_decode_norm_rope_store``.

    Returns ``out`` (allocated zeroed when None): the pre-RoPE latent of every row.
    """
    lay = sglang_layout("c1_decode_norm_rope_store", layout)
    _refuse_rocm("c1_decode_norm_rope_store")
    return _v41.c1_decode_norm_rope_store(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache,
                                          page_size=page_size, layout=lay, out=out)


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
    layout: Union[KVLayout, str] = KVLayout.V4,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SGLang's ``low_ratio_compress.c2_decode_norm_rope_store`` (decode, or verify with ``draft_len > 1``)
    on ``flashcompress.c2_decode_norm_rope_store``.  Returns ``out``."""
    lay = sglang_layout("c2_decode_norm_rope_store", layout)
    _refuse_rocm("c2_decode_norm_rope_store")
    return _v41.c2_decode_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                          freqs_cis, k_cache, page_size=page_size, ring_size=ring_size,
                                          draft_len=draft_len, layout=lay, out=out)


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
    layout: Union[KVLayout, str] = KVLayout.V4,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SGLang's ``low_ratio_compress.c2_prefill_norm_rope_store`` on ``flashcompress.c2_prefill_norm_rope_store``.
    Returns ``out``."""
    lay = sglang_layout("c2_prefill_norm_rope_store", layout)
    _refuse_rocm("c2_prefill_norm_rope_store")
    return _v41.c2_prefill_norm_rope_store(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps,
                                           freqs_cis, k_cache, extend_start_loc, extend_seq_lens,
                                           page_size=page_size, ring_size=ring_size, layout=lay, out=out)


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
    """SGLang's ``fp4_indexer_rope.index_k_norm_rope_pack_store`` on ``flashcompress.index_k_norm_rope_pack_store``
    (the page size is ``cache.shape[1] // 68``, as in SGLang)."""
    _refuse_rocm("index_k_norm_rope_pack_store")
    _v41.index_k_norm_rope_pack_store(input, norm_weight, eps, freqs_cis, positions, loc, cache, ratio=ratio)


ADAPTERS: dict[str, Callable[..., object]] = {
    "c1_decode_norm_rope_store": c1_decode_norm_rope_store,
    "c2_decode_norm_rope_store": c2_decode_norm_rope_store,
    "c2_prefill_norm_rope_store": c2_prefill_norm_rope_store,
    "index_k_norm_rope_pack_store": index_k_norm_rope_pack_store,
}
"""SGLang entry-point name -> the flashcompress adapter with its signature."""


def hopper_capable() -> bool:
    """True on a CUDA (not ROCm) torch whose current GPU has capability major >= ``MIN_CAPABILITY_MAJOR``."""
    return (torch.version.hip is None and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] >= MIN_CAPABILITY_MAJOR)


def low_ratio_gate(original: Callable[[], bool]) -> Callable[[], bool]:
    """SGLang's ``fused_low_ratio_compress_supported`` widened to every GPU flashcompress's kernels serve.

    True where :func:`hopper_capable`, else SGLang's own answer (ROCm gfx950,
    older CUDA GPUs, no GPU).  SGLang reads it when a ``DeepseekV41Compressor``
    is built (it fixes ``use_fused_compress`` and the ratio-2 projection layout,
    one ``wkv_gate`` GEMM) and when the backend sizes its prefill-graph buffers.
    """

    @functools.wraps(original)
    def fused_low_ratio_compress_supported() -> bool:
        return True if hopper_capable() else bool(original())

    fused_low_ratio_compress_supported.__flashcompress_gate__ = True  # type: ignore[attr-defined]
    return fused_low_ratio_compress_supported
