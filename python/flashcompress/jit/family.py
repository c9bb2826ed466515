"""Kernel families: what a family renders and compiles, and the registry of families.

A family is one op's template set (``templates/<op>_*.j2``) plus its build flags,
exported function names, parameter space, model presets and an optional warm
launch.  Op modules register their family at import time::

    PLAN = register_family(
        Family("plan", sources=(("plan_kernel.cu.j2", "kernel.cu"), ("plan_binding.cpp.j2", "binding.cpp")),
               exports=("decode_plan",), space={"ratio": (4, 128), "online": (False, True)}),
        validate=_check_plan_params,
        presets=lambda model: [{"ratio": 4, "online": False}, ...],
    )

Families living in ``flashcompress.cuda_ops.*`` are found by ``discover_families()``
(``flashcompress prewarm --all``); the engine's own ``selftest`` family is
imported on demand and is not part of ``--all``.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
import re
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union

from .errors import UnknownFamily
from .models import MODELS

if TYPE_CHECKING:  # pragma: no cover
    from .variant import VariantKey

__all__ = [
    "Family",
    "ParamValue",
    "Presets",
    "RESERVED_PARAMS",
    "discover_families",
    "families",
    "get_family",
    "register_family",
]

ParamValue = Union[int, str, bool]
Presets = Union[Mapping[str, Sequence[Mapping[str, ParamValue]]], Callable[[str], Iterable[Mapping[str, ParamValue]]]]

# Names the renderer adds to every template context; a parameter may not shadow them.
RESERVED_PARAMS = frozenset({"module_name", "namespace", "target_arch", "backend"})

# Packages whose submodules register production families (``prewarm --all``).
FAMILY_PACKAGES: tuple[str, ...] = ("flashcompress.cuda_ops",)
# Families imported only when named (engine tests); not part of ``--all``.
ON_DEMAND_FAMILIES: dict[str, str] = {"selftest": "flashcompress.testing.selftest"}

_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".h", ".hpp", ".cuh", ".inc")


@dataclass(frozen=True)
class Family:
    """One kernel family: templates to render, how to compile them, what the module exports.

    ``space`` (param name -> allowed values, in display order) is optional; when
    given, every variant must set exactly these params to one of the listed values
    (same Python type), ``prewarm --all`` enumerates it and partial CLI specs expand
    over it.  ``validate``/``presets`` are attached by ``register_family``.
    ``warmup(key)`` launches a loaded variant once on the current GPU (prewarm calls
    it so that nothing is first-loaded during CUDA-graph capture).
    """

    name: str
    sources: tuple[tuple[str, str], ...]
    cuda_flags: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    space: tuple[tuple[str, tuple[ParamValue, ...]], ...] | None = None
    warmup: Callable[["VariantKey"], None] | None = field(default=None, compare=False)
    validate: Callable[[Mapping[str, Any]], None] | None = field(default=None, compare=False)
    presets: Presets | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"family name {self.name!r}: use lower-case letters, digits and _")
        object.__setattr__(self, "sources", tuple((str(t), str(o)) for t, o in self.sources))
        object.__setattr__(self, "cuda_flags", tuple(self.cuda_flags))
        object.__setattr__(self, "cxx_flags", tuple(self.cxx_flags))
        object.__setattr__(self, "exports", tuple(self.exports))
        if not self.sources:
            raise ValueError(f"family {self.name!r} has no sources")
        outputs = [o for _, o in self.sources]
        if len(set(outputs)) != len(outputs):
            raise ValueError(f"family {self.name!r}: duplicate rendered file names {outputs}")
        for out in outputs:
            if "/" in out or not out.endswith(_SOURCE_SUFFIXES):
                raise ValueError(f"family {self.name!r}: rendered name {out!r} must be a plain "
                                 f"file name ending in one of {_SOURCE_SUFFIXES}")
        if not any(o.endswith((".cu", ".cpp", ".cc", ".cxx")) for o in outputs):
            raise ValueError(f"family {self.name!r} renders no translation unit")
        if self.space is not None:
            items = self.space.items() if isinstance(self.space, Mapping) else self.space
            space = tuple((str(k), tuple(v)) for k, v in items)
            for pname, values in space:
                if pname in RESERVED_PARAMS or not re.fullmatch(r"[a-z][a-z0-9_]*", pname):
                    raise ValueError(f"family {self.name!r}: bad parameter name {pname!r}")
                if not values or not all(isinstance(v, (int, str)) for v in values):
                    raise ValueError(f"family {self.name!r}: parameter {pname!r} needs int/str/bool values")
            object.__setattr__(self, "space", space)

    # ------------------------------------------------------------------ params

    @property
    def param_names(self) -> tuple[str, ...] | None:
        """Declared parameter names in display order (None when no space is declared)."""
        return None if self.space is None else tuple(name for name, _ in self.space)

    def check_params(self, params: Mapping[str, object]) -> None:
        """Raise ``ValueError`` unless ``params`` is a valid variant of this family."""
        for pname, value in params.items():
            if pname in RESERVED_PARAMS:
                raise ValueError(f"{self.name}: parameter name {pname!r} is reserved")
            if not re.fullmatch(r"[a-z][a-z0-9_]*", pname):
                raise ValueError(f"{self.name}: parameter name {pname!r} must be lower-case [a-z0-9_]")
            if not isinstance(value, (int, str)):  # bool is an int
                raise ValueError(f"{self.name}: parameter {pname}={value!r} must be int, str or bool")
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
        if self.validate is not None:
            self.validate(params)

    def expand(self, partial: Mapping[str, ParamValue] | None = None) -> list[dict[str, ParamValue]]:
        """Every valid param dict that agrees with ``partial`` (declared order, validator applied)."""
        partial = dict(partial or {})
        if self.space is None:
            self.check_params(partial)
            return [partial]
        declared = dict(self.space)
        unknown = [n for n in partial if n not in declared]
        if unknown:
            raise ValueError(f"{self.name}: unknown parameter(s) {unknown}; declared: {list(declared)}")
        axes = [[partial[n]] if n in partial else list(v) for n, v in declared.items()]
        result: list[dict[str, ParamValue]] = []
        first_error: ValueError | None = None
        for combo in itertools.product(*axes):
            candidate = dict(zip(declared, combo))
            try:
                self.check_params(candidate)
            except ValueError as exc:
                first_error = first_error or exc
                continue
            result.append(candidate)
        if not result:
            raise ValueError(f"{self.name}: no valid variant matches {partial}: {first_error}")
        return result

    def preset_params(self, model: str) -> list[dict[str, ParamValue]]:
        """The variants ``model`` needs from this family (empty when the family has no preset for it)."""
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known models: {', '.join(MODELS)}")
        if self.presets is None:
            return []
        if callable(self.presets):
            entries = list(self.presets(model))
        else:
            entries = list(self.presets.get(model, ()))
        out = []
        for entry in entries:
            params = dict(entry)
            self.check_params(params)
            out.append(params)
        return out


_LOCK = threading.RLock()
_FAMILIES: dict[str, Family] = {}
_PROVIDERS: dict[str, str] = {}
_REGISTER_HOOKS: list[Callable[[str], None]] = []
_DISCOVERED = False


def register_family(
    family: Family,
    *,
    validate: Callable[[Mapping[str, Any]], None] | None = None,
    presets: Presets | None = None,
) -> Family:
    """Register ``family`` (with its validator and model presets) and return the stored object.

    Registering a name again replaces the previous definition (module reloads) and
    drops the engine's in-process memo for that family.
    """
    if validate is not None:
        family = replace(family, validate=validate)
    if presets is not None:
        family = replace(family, presets=presets)
    caller = sys._getframe(1).f_globals.get("__name__", "?")
    with _LOCK:
        replaced = family.name in _FAMILIES
        _FAMILIES[family.name] = family
        _PROVIDERS.setdefault(family.name, caller)  # the defining module, not a later re-registration
    if replaced:
        for hook in _REGISTER_HOOKS:
            hook(family.name)
    return family


def on_reregister(hook: Callable[[str], None]) -> None:
    """Run ``hook(name)`` whenever an existing family is replaced (the engine clears its memo)."""
    _REGISTER_HOOKS.append(hook)


def provider_module(name: str) -> str | None:
    """The module that registered family ``name`` (used in prewarm hints)."""
    return _PROVIDERS.get(name)


def discover_families() -> dict[str, Family]:
    """Import every module under ``flashcompress.cuda_ops`` so that its families register."""
    global _DISCOVERED
    with _LOCK:
        if not _DISCOVERED:
            for package_name in FAMILY_PACKAGES:
                try:
                    package = importlib.import_module(package_name)
                except ModuleNotFoundError as exc:
                    if exc.name != package_name:
                        raise
                    continue
                for info in pkgutil.iter_modules(package.__path__, package_name + "."):
                    importlib.import_module(info.name)
            _DISCOVERED = True
        return dict(_FAMILIES)


def families() -> dict[str, Family]:
    """The families registered so far (no discovery)."""
    with _LOCK:
        return dict(_FAMILIES)


def get_family(name: str) -> Family:
    """The family called ``name``, importing its module on first use; ``UnknownFamily`` otherwise."""
    family = _FAMILIES.get(name)
    if family is not None:
        return family
    if name in ON_DEMAND_FAMILIES:
        importlib.import_module(ON_DEMAND_FAMILIES[name])
    else:
        discover_families()
    family = _FAMILIES.get(name)
    if family is None:
        known = sorted(set(_FAMILIES) | set(ON_DEMAND_FAMILIES))
        raise UnknownFamily(f"unknown JIT kernel family {name!r}; known: {', '.join(known) or 'none'} "
                            f"(families register when their module under flashcompress.cuda_ops is imported)")
    return family
