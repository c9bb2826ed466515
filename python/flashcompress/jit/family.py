"""Kernel families: what a family renders and compiles, its parameter space, and the registry.

A family is one op's template set (``templates/<op>_*.j2``) plus its build flags,
exported function names, parameter space, model presets and an optional warm
launch.  Op modules register their family at import time::

    PLAN = register_family(
        Family("plan", sources=(("plan_kernel.cu.j2", "kernel.cu"), ("plan_binding.cpp.j2", "binding.cpp")),
               exports=("decode",), space={"ratio": (4, 128), "online": (False, True)}),
        validate=_online_needs_ratio_128,        # only what `space` cannot express
        presets=lambda model: [{"ratio": 4, "online": False}, ...],
    )

``family.key(target, **params)`` validates the parameters once and returns the
plain ``VariantKey``.  A ``host_only`` family compiles C++ for the host alone (binding
TUs, no ``.cu``, no GPU runtime; e.g. the native prefill planner): its keys always
carry ``host_target()``, whatever target is asked for, so a prewarm for several GPU
archs builds it once and a machine without CUDA can build it.

Families are found by importing every module under ``flashcompress.cuda_ops`` (and
the engine's test family ``flashcompress.testing.selftest``); a family without a
``space`` (selftest) takes any int/str/bool values its ``validate`` accepts and is not
part of ``prewarm --all``.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import pkgutil
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from .errors import UnknownFamily
from .models import model_config
from .variant import ParamValue, VariantKey, detect_target, host_target, normalize_target

__all__ = ["Family", "discover_families", "families", "get_family", "make_key", "module_memo", "parse_spec",
           "register_family"]

# A mapping model -> variants, or a callable ``presets(model)`` / ``presets(model, target)``; the
# two-argument form is for families whose variants depend on the target (``target`` is a
# normalised target string, or None for "every target the model may run on").
Presets = Union[Mapping[str, Sequence[Mapping[str, ParamValue]]], Callable[..., Iterable[Mapping[str, ParamValue]]]]

# Names the renderer adds to every template context; a parameter may not shadow them.
RESERVED_PARAMS = frozenset({"module_name", "namespace", "target_arch", "backend"})
# Modules (packages: every submodule) whose import registers the families.
FAMILY_MODULES: tuple[str, ...] = ("flashcompress.cuda_ops", "flashcompress.testing.selftest")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_UNIT_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx")  # translation units (build.py compiles these)
_SOURCE_SUFFIXES = (*_UNIT_SUFFIXES, ".h", ".hpp", ".cuh", ".inc")


def _param_name_ok(name: str) -> bool:
    return name not in RESERVED_PARAMS and _NAME.fullmatch(name) is not None


@dataclass(frozen=True)
class Family:
    """One kernel family: templates to render, how to compile them, what the module exports.

    ``space`` (param name -> allowed values, in display order): every variant sets exactly
    these params to one of the listed values (same Python type); ``prewarm --all``
    enumerates it.  ``validate(params)`` (attached by ``register_family``) adds the
    constraints ``space`` cannot express.  ``defaults`` (param name -> value) fills the params a
    ``key`` call leaves out.  ``warmup(key)`` launches a loaded variant once on
    the current GPU (prewarm calls it so that nothing is first-loaded during graph capture).
    ``host_only``: host C++ only (see the module docstring).
    """

    name: str
    sources: tuple[tuple[str, str], ...]
    cuda_flags: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    space: tuple[tuple[str, tuple[ParamValue, ...]], ...] | None = None
    defaults: tuple[tuple[str, ParamValue], ...] = ()
    warmup: Callable[[VariantKey], None] | None = field(default=None, compare=False)
    validate: Callable[[Mapping[str, Any]], None] | None = field(default=None, compare=False)
    presets: Presets | None = field(default=None, compare=False)
    host_only: bool = False

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"family name {self.name!r}: use lower-case letters, digits and _")
        for attr in ("cuda_flags", "cxx_flags", "exports"):
            object.__setattr__(self, attr, tuple(getattr(self, attr)))
        sources = tuple((str(t), str(o)) for t, o in self.sources)
        object.__setattr__(self, "sources", sources)
        outputs = [o for _, o in sources]
        if not any(o.endswith(_UNIT_SUFFIXES) for o in outputs) or len(set(outputs)) != len(outputs):
            raise ValueError(f"family {self.name!r}: rendered names {outputs} need a translation unit, no duplicates")
        if any("/" in o or not o.endswith(_SOURCE_SUFFIXES) for o in outputs):
            raise ValueError(f"family {self.name!r}: rendered names must be plain files ending in {_SOURCE_SUFFIXES}")
        if self.host_only and (self.cuda_flags or any(o.endswith(".cu") for o in outputs)):
            raise ValueError(f"family {self.name!r}: a host-only family has no .cu sources and no cuda_flags")
        if self.space is not None:
            items = self.space.items() if isinstance(self.space, Mapping) else self.space
            space = tuple((str(k), tuple(v)) for k, v in items)
            for pname, values in space:
                if not _param_name_ok(pname):
                    raise ValueError(f"family {self.name!r}: bad parameter name {pname!r}")
                if not values or not all(isinstance(v, (int, str)) for v in values):
                    raise ValueError(f"family {self.name!r}: parameter {pname!r} needs int/str/bool values")
            object.__setattr__(self, "space", space)
        defaults = tuple((self.defaults.items() if isinstance(self.defaults, Mapping) else self.defaults))
        declared = dict(self.space or ())
        for pname, value in defaults:
            if pname not in declared or value not in declared[pname]:
                raise ValueError(f"family {self.name!r}: default {pname}={value!r} is not in its space")
        object.__setattr__(self, "defaults", defaults)

    def check_params(self, params: Mapping[str, object]) -> None:
        """Raise ``ValueError`` unless ``params`` is a valid variant of this family."""
        if self.space is not None:
            declared = dict(self.space)
            missing = [n for n in declared if n not in params]
            extra = [n for n in params if n not in declared]
            if missing or extra:
                raise ValueError(f"{self.name}: parameters must be exactly {', '.join(declared)}"
                                 f" (missing: {missing or 'none'}, unexpected: {extra or 'none'})")
            for pname, allowed in declared.items():
                value = params[pname]
                if not any(type(value) is type(a) and value == a for a in allowed):
                    raise ValueError(f"{self.name}: {pname}={value!r} is not one of {list(allowed)}")
        else:
            for pname, value in params.items():
                if not _param_name_ok(pname) or not isinstance(value, (int, str)):
                    raise ValueError(f"{self.name}: bad parameter {pname}={value!r} (lower-case name; int, str "
                                     f"or bool value; not one of {sorted(RESERVED_PARAMS)})")
        if self.validate is not None:
            self.validate(params)

    def key(self, target: str | None = None, **params: ParamValue) -> VariantKey:
        """The validated key of one variant (``defaults`` fill the params left out);
        ``target=None`` uses ``detect_target()`` (host-only families: always ``host_target()``)."""
        params = {**dict(self.defaults), **params}
        self.check_params(params)
        order = [n for n, _ in self.space] if self.space is not None else sorted(params)
        if self.host_only:
            resolved = host_target()
        else:
            resolved = detect_target() if target is None else normalize_target(target)
        return VariantKey(self.name, tuple((n, params[n]) for n in order), resolved)

    def expand(self, partial: Mapping[str, ParamValue] | None = None) -> list[dict[str, ParamValue]]:
        """Every valid param dict that agrees with ``partial`` (declared order)."""
        partial = dict(partial or {})
        if self.space is None:
            self.check_params(partial)
            return [partial]
        declared = dict(self.space)
        unknown = [n for n in partial if n not in declared]
        if unknown:
            raise ValueError(f"{self.name}: unknown parameter(s) {unknown}; declared: {list(declared)}")
        axes = [[partial[n]] if n in partial else list(v) for n, v in declared.items()]
        result, first_error = [], None
        for combo in itertools.product(*axes):
            candidate = dict(zip(declared, combo))
            try:
                self.check_params(candidate)
                result.append(candidate)
            except ValueError as exc:
                first_error = first_error or exc
        if not result:
            raise ValueError(f"{self.name}: no valid variant matches {partial}: {first_error}")
        return result

    def preset_params(self, model: str, target: str | None = None) -> list[dict[str, ParamValue]]:
        """The variants ``model`` needs from this family on ``target`` (None: on any target; empty
        when the family has no preset for it).  Every entry must be a variant of the family."""
        model_config(model)  # unknown names raise, listing the known ones
        if self.presets is None:
            return []
        if callable(self.presets):
            takes_target = len(inspect.signature(self.presets).parameters) >= 2
            entries = self.presets(model, target) if takes_target else self.presets(model)
        else:
            entries = self.presets.get(model, ())
        out = [dict(entry) for entry in entries]
        for params in out:
            self.check_params(params)
        return out


_LOCK = threading.RLock()
_FAMILIES: dict[str, Family] = {}
_DISCOVERED = False


def register_family(family: Family, *, validate: Callable[[Mapping[str, Any]], None] | None = None,
                    presets: Presets | None = None) -> Family:
    """Register ``family`` (with its extra validator and model presets) and return the stored object."""
    if validate is not None or presets is not None:
        family = replace(family, validate=validate or family.validate, presets=presets or family.presets)
    with _LOCK:
        _FAMILIES[family.name] = family
    return family


_MODULE_MEMOS: list[dict[Any, Any]] = []


def module_memo() -> dict[Any, Any]:
    """A dict an op module keeps its loaded variants in (keyed on the call's own values);
    ``jit.clear_memo()`` empties every such dict with the engine's memo, so a test that switches
    cache directories or goes offline sees the next call look in the cache again."""
    memo: dict[Any, Any] = {}
    _MODULE_MEMOS.append(memo)
    return memo


def clear_module_memos() -> None:
    for memo in _MODULE_MEMOS:
        memo.clear()


def discover_families() -> dict[str, Family]:
    """Import every family module (``FAMILY_MODULES``) once, so that their families register."""
    global _DISCOVERED
    with _LOCK:
        if not _DISCOVERED:
            for name in FAMILY_MODULES:
                module = importlib.import_module(name)
                for info in pkgutil.iter_modules(getattr(module, "__path__", []), name + "."):
                    importlib.import_module(info.name)
            _DISCOVERED = True
        return dict(_FAMILIES)


def families() -> dict[str, Family]:
    """The families registered so far (no discovery)."""
    with _LOCK:
        return dict(_FAMILIES)


def get_family(name: str) -> Family:
    """The family called ``name`` (discovering the family modules on a miss); ``UnknownFamily`` otherwise."""
    family = _FAMILIES.get(name) or discover_families().get(name)
    if family is None:
        raise UnknownFamily(f"unknown JIT kernel family {name!r}; known: {', '.join(sorted(_FAMILIES)) or 'none'}")
    return family


def make_key(family: str, target: str | None = None, **params: ParamValue) -> VariantKey:
    """``get_family(family).key(target, **params)``."""
    return get_family(family).key(target, **params)


def _parse_value(text: str, allowed: tuple[ParamValue, ...]) -> ParamValue:
    lowered = text.strip().lower()
    for candidate in allowed:
        if str(candidate).lower() == lowered:
            return candidate
    if lowered in ("true", "false"):
        return lowered == "true"
    return int(lowered) if re.fullmatch(r"[+-]?\d+", lowered) else text.strip()


def parse_spec(spec: str) -> tuple[str, dict[str, ParamValue]]:
    """Parse ``family[:name=value,...]`` into the family name and a (possibly partial) param dict."""
    name, _, rest = spec.strip().partition(":")
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad variant spec {spec!r}; expected family[:name=value,...]")
    space = dict(get_family(name).space or ())
    params: dict[str, ParamValue] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        pname, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"bad variant spec {spec!r}: {item!r} is not name=value")
        params[pname.strip()] = _parse_value(value, space.get(pname.strip(), ()))
    return name, params
