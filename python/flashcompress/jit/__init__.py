"""flashcompress JIT engine: Jinja2 templates -> tvm-ffi modules in a content-addressed disk cache.

Public API::

    Family, register_family, get_family        declare / look up a kernel family
    make_key(family, target=None, **params)    get_family(family).key(target, **params): validated once
    VariantKey                                 the plain key value: family + params + target; names the module
    load(key) -> tvm_ffi.Module                memo -> cache hit (no lock, no compiler) -> locked build
    get_module(family, **params)               load(make_key(family, **params)), memoised
    jit_enabled_for(device), debug_checks_enabled()   hot-path switches for the API layer
    get_settings(), reload_settings()          effective settings (README: Settings)
    JitError, BuildError, OfflineCacheMiss, ToolchainMissing, CacheNotWritable, CaptureBuildError,
    LockTimeout, UnknownFamily, CacheCorruptionWarning      what can go wrong
    HostPlannerFallbackWarning                 the native host planner fell back to PyTorch

Importing this package is cheap: no torch, tvm-ffi, Jinja2 or filelock import, no
CUDA initialisation and no compilation.  ``load``/``get_module``/``acquire`` and
the engine internals are imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (BuildError, CacheCorruptionWarning, CacheNotWritable, CaptureBuildError,
                     HostPlannerFallbackWarning, JitError, LockTimeout, OfflineCacheMiss, ToolchainMissing,
                     UnknownFamily)
from .family import Family, get_family, make_key, register_family
from .models import MODELS, ModelConfig, model_config
from .settings import debug_checks_enabled, get_settings, jit_enabled_for, reload_settings
from .variant import VariantKey, detect_target

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Acquired, acquire, clear_memo, get_module, load

__all__ = ["Acquired", "BuildError", "CacheCorruptionWarning", "CacheNotWritable", "CaptureBuildError", "Family",
           "HostPlannerFallbackWarning", "JitError", "LockTimeout", "MODELS", "ModelConfig", "OfflineCacheMiss",
           "ToolchainMissing", "UnknownFamily", "VariantKey", "acquire", "clear_memo", "debug_checks_enabled",
           "detect_target", "get_family", "get_module", "get_settings", "jit_enabled_for", "load", "make_key",
           "model_config", "register_family", "reload_settings"]

_ENGINE_NAMES = frozenset({"Acquired", "acquire", "clear_memo", "get_module", "load"})


def __getattr__(name: str) -> Any:
    if name in _ENGINE_NAMES:
        from . import engine

        value = getattr(engine, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'flashcompress.jit' has no attribute {name!r}")
