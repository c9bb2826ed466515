"""Run SGLang's DeepSeek-V4 / V4.1 compressors on flashcompress: ``apply()`` before model load, ``revert()`` to undo.

    import flashcompress.integrations.sglang as fc_sglang
    handle = fc_sglang.apply()          # or: with fc_sglang.apply(): ...
    ...                                 # load and serve the model as usual
    handle.revert()

``apply()`` rebinds the compressor entry points SGLang's DeepSeek-V4 code
resolves (``CompressorDecodePlan``, ``CompressorPrefillPlan``,
``compress_forward``, ``compress_norm_rope_store``) in
``sglang.kernels.ops.attention.dsv4`` (so later imports get flashcompress's)
and in every already-imported ``sglang`` module holding the originals
(``compressor_v2``, the attention backends, ...).  ``fused=True`` also wraps
``CompressorBackendMixin._forward_compress_all_in_one`` so each layer's two op
calls run as one ``flashcompress.compress_and_store`` (SGLang's method body
still runs as written).

``low_ratio=True`` (the default) also rebinds DeepSeek-V4.1's ratio-1 / 2
entry points (``low_ratio_compress.c1_decode_norm_rope_store``,
``c2_decode_norm_rope_store``, ``c2_prefill_norm_rope_store``,
``fp4_indexer_rope.index_k_norm_rope_pack_store``) to adapters with SGLang's
signatures, and the gate ``dsv41_sparse.fused_low_ratio_compress_supported``
so that SGLang takes that fused path on Hopper too (it gates it on SM100).
``docs/sglang.md`` lists every name.

Importing this module imports neither SGLang nor torch and compiles nothing.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import warnings

from ._patching import Binding, Handle, find_bindings, rebind
from .errors import IntegrationError, UnsupportedFeatureError, UnsupportedVersionError

__all__ = [
    "SUPPORTED_VERSIONS",
    "V41_TARGETS",
    "Binding",
    "Handle",
    "IntegrationError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "apply",
    "installed_version",
]

SUPPORTED_VERSIONS: tuple[str, ...] = ("0.5.23",)
"""SGLang releases whose sources this integration was checked and tested against."""

OPS_MODULE = "sglang.kernels.ops.attention.dsv4"
"""The package SGLang's DeepSeek-V4 code imports the compressor ops from."""

LAYER_MODULE = "sglang.srt.layers.attention.dsv4.compressor_v2"
"""The module of ``CompressorBackendMixin``, whose ``_forward_compress_all_in_one`` calls both ops."""

OP_NAMES: tuple[str, ...] = (
    "CompressorDecodePlan", "CompressorPrefillPlan", "compress_forward", "compress_norm_rope_store",
)

LOW_RATIO_MODULE = "sglang.kernels.ops.attention.dsv4.low_ratio_compress"
"""Where SGLang defines the V4.1 ratio-1 / 2 ops (``_low_ratio_compress_fused`` imports them from here)."""

INDEX_K_MODULE = "sglang.kernels.ops.attention.dsv4.fp4_indexer_rope"
"""Where SGLang defines the V4.1 index-key store."""

GATE_MODULE = "sglang.srt.layers.attention.dsv4.dsv41_sparse"
"""The module of ``fused_low_ratio_compress_supported`` and ``DeepseekV41Compressor``."""

V41_TARGETS: tuple[tuple[str, str], ...] = (
    (LOW_RATIO_MODULE, "c1_decode_norm_rope_store"),
    (LOW_RATIO_MODULE, "c2_decode_norm_rope_store"),
    (LOW_RATIO_MODULE, "c2_prefill_norm_rope_store"),
    (INDEX_K_MODULE, "index_k_norm_rope_pack_store"),
    (GATE_MODULE, "fused_low_ratio_compress_supported"),
)
"""``(module, name)`` of every V4.1 object ``apply(low_ratio=True)`` replaces (and wherever else it is bound)."""

_active: Handle | None = None


def installed_version() -> str | None:
    """The SGLang version: ``sglang.__version__`` if SGLang is imported, else its distribution's metadata."""
    version = getattr(sys.modules.get("sglang"), "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _check_version(strict: bool) -> None:
    version = installed_version()
    release = None if version is None else version.split("+", 1)[0]
    if release in SUPPORTED_VERSIONS:
        return
    found = "an SGLang whose version cannot be determined" if version is None else f"SGLang {version}"
    message = (f"flashcompress.integrations.sglang supports SGLang {', '.join(SUPPORTED_VERSIONS)}; found {found}. "
               "Pass strict=False to patch it anyway (the names it replaces are listed in docs/sglang.md).")
    if strict:
        raise UnsupportedVersionError(message)
    warnings.warn(message, stacklevel=3)


def _import(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise IntegrationError(f"flashcompress.integrations.sglang.apply() needs {name} importable: {e}") from e


def _replacements(ops: object, fused: bool) -> dict[int, tuple[object, object]]:
    """``id(SGLang object) -> (SGLang object, flashcompress object)`` for the four op names."""
    import flashcompress as fc

    from . import _sglang_ops

    ours = {
        "CompressorDecodePlan": fc.CompressorDecodePlan,
        "CompressorPrefillPlan": fc.CompressorPrefillPlan,
        "compress_forward": _sglang_ops.compress_forward if fused else fc.compress_forward,
        "compress_norm_rope_store": _sglang_ops.compress_norm_rope_store,
    }
    pairs = {}
    for name in OP_NAMES:
        original = getattr(ops, name, None)
        if original is None:
            raise IntegrationError(f"{OPS_MODULE} has no {name}: this SGLang does not have the expected ops")
        pairs[id(original)] = (original, ours[name])
    return pairs


def _v41_replacements() -> dict[int, tuple[object, object]]:
    """``id(SGLang object) -> (SGLang object, flashcompress object)`` for the V4.1 ops and the gate."""
    from . import _sglang_v41

    pairs = {}
    for module_name, name in V41_TARGETS:
        original = getattr(_import(module_name), name, None)
        if original is None:
            raise IntegrationError(f"{module_name} has no {name}: this SGLang does not have the expected V4.1 ops "
                                   "(apply(low_ratio=False) patches the V4 compressor only)")
        ours = _sglang_v41.low_ratio_gate(original) if name == "fused_low_ratio_compress_supported" \
            else _sglang_v41.ADAPTERS[name]
        pairs[id(original)] = (original, ours)
    return pairs


def _fused_binding() -> Binding:
    from ._sglang_ops import fused_layer_call

    layer = _import(LAYER_MODULE)
    mixin = getattr(layer, "CompressorBackendMixin", None)
    method = getattr(mixin, "_forward_compress_all_in_one", None)
    if method is None:
        raise IntegrationError(f"{LAYER_MODULE}.CompressorBackendMixin._forward_compress_all_in_one not found: "
                               "fused=True cannot find SGLang's two-step call site")
    return Binding(mixin, "_forward_compress_all_in_one", method, fused_layer_call(method))


def apply(*, fused: bool = False, strict: bool = True, low_ratio: bool = True) -> Handle:
    """Switch SGLang's DeepSeek-V4 (and V4.1) compressor ops to flashcompress; returns the ``Handle`` that undoes it.

    ``fused``: run each layer's compress and store as one ``compress_and_store``.
    ``low_ratio``: also switch the V4.1 ratio-1 / 2 ops and the index-key store
    (``V41_TARGETS``), with the gate that makes SGLang call them on Hopper;
    call ``apply()`` before the model is built, since the gate is read when a
    ``DeepseekV41Compressor`` is constructed.
    ``strict``: refuse an SGLang version not in ``SUPPORTED_VERSIONS``
    (``UnsupportedVersionError``); with ``strict=False`` warn and patch.
    Raises ``IntegrationError`` if SGLang cannot be imported, lacks the ops, or
    the integration is already applied (revert that handle first).  SGLang is
    imported first (its ``__version__`` is the version checked); nothing is
    patched when ``apply()`` raises.
    """
    global _active
    if not all(isinstance(v, bool) for v in (fused, strict, low_ratio)):
        raise TypeError(f"apply(fused=..., strict=..., low_ratio=...) take bools, got fused={fused!r}, "
                        f"strict={strict!r}, low_ratio={low_ratio!r}")
    if _active is not None and _active.active:
        raise IntegrationError("flashcompress.integrations.sglang is already applied; revert() that handle first")
    ops = _import(OPS_MODULE)
    _check_version(strict)
    pairs = _replacements(ops, fused)
    if low_ratio:
        pairs.update(_v41_replacements())
    extra = [_fused_binding()] if fused else []
    _active = rebind("sglang", find_bindings("sglang", pairs) + extra)
    return _active
