"""The objects ``flashcompress.integrations.sglang.apply()`` binds into SGLang (imported by ``apply()``).

SGLang 0.5.23's compressor ops and flashcompress's share names and signatures,
except that SGLang's ``compress_norm_rope_store`` takes a few more keywords:

  layout=                passed on: SGLang's ``KVLayout`` member (as its value) or string, any case
                         (``flashcompress.compress_norm_rope_store(layout=...)``: V4 and the V4.1
                         layouts of the ratio-4 / 128 pools)
  kvcache_scale=, rope_cache=, fp4_k_write_metadata=
                         the HIP FP4 indexer writer's split scale pool and tables (refused)
  fp8_2buff=, kvcache_rope=
                         the HIP unified-KV two-pool store (refused)

``compress_norm_rope_store`` below takes them, refuses the ones flashcompress
does not implement with ``UnsupportedFeatureError`` before anything is written,
and passes the rest on (a layout flashcompress does not know, or a V4.1 layout with
``use_fp4`` / ``bf16_store`` or a cache of another size, raises flashcompress's
``ValueError`` before anything is written).  The plan classes and ``compress_forward``
are bound as flashcompress's own objects.

Fused mode joins the two op calls of SGLang's ``_forward_compress_all_in_one``
into one ``compress_and_store`` while SGLang's method runs unchanged: inside
that method (and only there) ``compress_forward`` defers its work and returns
a placeholder of the output's shape; the store call that receives the
placeholder runs both steps as one.  A deferred compress that no store picks up
runs as a plain ``compress_forward`` when the method returns.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

import flashcompress as fc

from .errors import UnsupportedFeatureError

_V4_LAYOUT = "v4"  # SGLang's KVLayout.V4 is a str enum with this value (its members carry .value)


def _refuse(keyword: str, value: object, why: str) -> None:
    raise UnsupportedFeatureError(
        f"compress_norm_rope_store({keyword}={value!r}): {why}; "
        "flashcompress writes nothing for this call (revert the SGLang integration to use SGLang's own kernel)"
    )


def check_sglang_store_keywords(
    kvcache_scale: object, rope_cache: object, fp4_k_write_metadata: object, fp8_2buff: object,
    kvcache_rope: object,
) -> None:
    """Refuse SGLang store keywords flashcompress does not implement (``UnsupportedFeatureError``)."""
    for keyword, value in (("kvcache_scale", kvcache_scale), ("rope_cache", rope_cache),
                           ("fp4_k_write_metadata", fp4_k_write_metadata)):
        if value is not None:
            _refuse(keyword, type(value).__name__, "the HIP FP4 indexer writer (split scale pool, BF16 RoPE "
                    "tables) is not implemented")
    if fp8_2buff is not False:
        _refuse("fp8_2buff", fp8_2buff, "the unified-KV two-pool FP8 store is not implemented")
    if kvcache_rope is not None:
        _refuse("kvcache_rope", type(kvcache_rope).__name__, "the unified-KV two-pool FP8 store is not implemented")


@dataclass
class _Deferred:
    """A ``compress_forward`` call held back so the store can run it fused."""

    out: torch.Tensor  # the placeholder handed back to SGLang
    plan: object
    args: tuple[Any, ...]  # kv_score_buffer, kv_score_input, ape
    head_dim: int
    compress_ratio: int
    is_online: bool


class _FuseScope(threading.local):
    """Per thread: inside ``_forward_compress_all_in_one``? and the deferred compress, if any."""

    active: bool = False
    deferred: _Deferred | None = None


_SCOPE = _FuseScope()


def compress_forward(
    kv_score_buffer: torch.Tensor,
    kv_score_input: torch.Tensor,
    ape: torch.Tensor,
    plan: fc.CompressorDecodePlan | fc.CompressorPrefillPlan,
    *,
    head_dim: int,
    compress_ratio: int,
    out: torch.Tensor | None = None,
    is_online: bool = False,
) -> torch.Tensor:
    """``flashcompress.compress_forward``; inside a fused SGLang layer call, deferred to the store."""
    scope = _SCOPE
    if not scope.active or out is not None or scope.deferred is not None or not isinstance(kv_score_input, torch.Tensor):
        return fc.compress_forward(kv_score_buffer, kv_score_input, ape, plan, head_dim=head_dim,
                                   compress_ratio=compress_ratio, out=out, is_online=is_online)
    placeholder = kv_score_input.new_empty((plan[1].shape[0], head_dim))
    scope.deferred = _Deferred(placeholder, plan, (kv_score_buffer, kv_score_input, ape), head_dim,
                               compress_ratio, is_online)
    return placeholder


def compress_norm_rope_store(
    kv: torch.Tensor,
    plan: fc.CompressorDecodePlan | fc.CompressorPrefillPlan,
    *,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int,
    use_fp4: bool = False,
    bf16_store: bool = False,
    kvcache_scale: torch.Tensor | None = None,
    rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    fp4_k_write_metadata: object = None,
    layout: object = _V4_LAYOUT,
    fp8_2buff: bool = False,
    kvcache_rope: torch.Tensor | None = None,
) -> None:
    """SGLang 0.5.23's ``compress_norm_rope_store`` signature on ``flashcompress.compress_norm_rope_store``.

    ``layout`` is passed on (its ``.value`` for SGLang's ``KVLayout``).  Keywords flashcompress
    does not implement raise ``UnsupportedFeatureError`` (module docstring).  Receiving the
    placeholder of a deferred ``compress_forward`` runs both steps as
    ``flashcompress.compress_and_store``.
    """
    check_sglang_store_keywords(kvcache_scale, rope_cache, fp4_k_write_metadata, fp8_2buff, kvcache_rope)
    store = dict(norm_weight=norm_weight, norm_eps=norm_eps, freq_cis=freq_cis, out_loc=out_loc,
                 kvcache=kvcache, page_size=page_size, use_fp4=use_fp4, bf16_store=bf16_store,
                 layout=getattr(layout, "value", layout))  # SGLang's KVLayout member -> its string
    deferred = _SCOPE.deferred
    if deferred is not None and kv is deferred.out and plan is deferred.plan:
        _SCOPE.deferred = None
        fc.compress_and_store(*deferred.args, plan, head_dim=deferred.head_dim,
                              compress_ratio=deferred.compress_ratio, is_online=deferred.is_online, **store)
        return
    fc.compress_norm_rope_store(kv, plan, **store)


def _run_deferred(d: _Deferred) -> None:
    fc.compress_forward(*d.args, d.plan, head_dim=d.head_dim, compress_ratio=d.compress_ratio, out=d.out,
                        is_online=d.is_online)


def fused_layer_call(method: Callable[..., None]) -> Callable[..., None]:
    """Wrap SGLang's ``_forward_compress_all_in_one`` so its two op calls run as one (module docstring)."""

    @functools.wraps(method)
    def _forward_compress_all_in_one(self: object, *args: Any, **kwargs: Any) -> None:
        scope = _SCOPE
        if scope.active:  # re-entered: the outer call owns the scope
            return method(self, *args, **kwargs)
        scope.active = True
        try:
            method(self, *args, **kwargs)
            left = scope.deferred
            if left is not None:  # no store took the placeholder: compress for real
                scope.deferred = None
                _run_deferred(left)
        finally:
            scope.active = False
            scope.deferred = None

    _forward_compress_all_in_one.__flashcompress_fused__ = True  # type: ignore[attr-defined]
    return _forward_compress_all_in_one
