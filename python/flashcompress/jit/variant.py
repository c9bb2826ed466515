"""Variant keys: the exact specialisation of one kernel family for one GPU target.

A ``VariantKey`` is frozen and hashable; its fields are exactly the template
parameters plus the target (``"cuda:9.0a"``, ``"hip:gfx942"``).  It names the
module (``fc_plan_online0_ratio4``, also the C++ namespace of the variant) and,
together with the content hash computed by the cache, its cache directory.

Targets are detected once per process: the configured override, else the
current GPU (torch), else the first configured default arch.  The backend
(CUDA or HIP) is part of the target string and is chosen once, here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .family import ParamValue, get_family, families
from .settings import get_settings, on_reload

__all__ = [
    "VariantKey",
    "backend_of",
    "detect_backend",
    "detect_target",
    "format_spec",
    "normalize_target",
    "parse_spec",
    "target_arch",
    "target_tag",
]

_CUDA_ARCH = re.compile(r"(?:sm_?|compute_)?(\d+)\.?(\d)([af]?)")
_HIP_ARCH = re.compile(r"gfx[0-9a-f]+(?::[a-z0-9+-]+)*")


def normalize_target(target: str) -> str:
    """Canonical target string: ``cuda:<M>.<m>[a|f]`` or ``hip:gfx...``.

    Accepts ``"cuda:9.0a"``, ``"9.0a"``, ``"90a"``, ``"sm_90a"``, ``"hip:gfx942"``, ``"gfx942"``.
    """
    text = target.strip()
    backend, _, arch = text.partition(":") if text.startswith(("cuda:", "hip:")) else ("", "", text)
    if arch.startswith("gfx") and backend in ("", "hip"):
        if not _HIP_ARCH.fullmatch(arch):
            raise ValueError(f"bad HIP target {target!r}; expected e.g. 'gfx942'")
        return f"hip:{arch}"
    if backend in ("", "cuda"):
        match = _CUDA_ARCH.fullmatch(arch)
        if match:
            major, minor, suffix = match.groups()
            return f"cuda:{int(major)}.{minor}{suffix}"
    raise ValueError(f"bad target {target!r}; expected e.g. 'cuda:9.0a' or 'hip:gfx942'")


def backend_of(target: str) -> str:
    """``"cuda"`` or ``"hip"``."""
    return target.split(":", 1)[0]


def target_arch(target: str) -> str:
    """The arch as templates see it: ``"90a"`` for ``cuda:9.0a``, ``"gfx942"`` for ``hip:gfx942``."""
    backend, arch = target.split(":", 1)
    return arch.replace(".", "") if backend == "cuda" else arch


def target_tag(target: str) -> str:
    """Directory name of a target in the cache: ``sm90a`` / ``gfx942``."""
    backend, arch = target.split(":", 1)
    return "sm" + arch.replace(".", "") if backend == "cuda" else arch.replace(":", "_")


_BACKEND: str | None = None
_TARGET: str | None = None


def _forget() -> None:
    global _BACKEND, _TARGET
    _BACKEND = None
    _TARGET = None


on_reload(_forget)


def detect_backend() -> str:
    """The GPU backend of this process: the ``gpu_backend`` setting, else HIP iff torch is a ROCm build."""
    global _BACKEND
    if _BACKEND is None:
        choice = get_settings().gpu_backend
        if choice == "auto":
            import torch

            choice = "hip" if getattr(torch.version, "hip", None) else "cuda"
        _BACKEND = choice
    return _BACKEND


def _gpu_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def detect_target() -> str:
    """The target of this process: configured override, else the current GPU, else the default arch."""
    global _TARGET
    if _TARGET is not None:
        return _TARGET
    settings = get_settings()
    backend = detect_backend()
    if backend == "cuda":
        if settings.cuda_arch:
            target = normalize_target("cuda:" + settings.cuda_arch.removeprefix("cuda:"))
        elif _gpu_present():
            import torch

            major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
            target = f"cuda:{major}.{minor}{'a' if major >= 9 else ''}"
        elif settings.default_cuda_archs:
            target = normalize_target("cuda:" + settings.default_cuda_archs[0].removeprefix("cuda:"))
        else:
            raise RuntimeError("no CUDA GPU visible and default_cuda_archs is empty; "
                               "set FLASHCOMPRESS_CUDA_ARCH, e.g. 9.0a")
    else:
        if settings.hip_arch:
            target = normalize_target("hip:" + settings.hip_arch.removeprefix("hip:"))
        elif _gpu_present():
            import torch

            name = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
            target = normalize_target("hip:" + name.split(":", 1)[0])
        elif settings.default_hip_archs:
            target = normalize_target("hip:" + settings.default_hip_archs[0].removeprefix("hip:"))
        else:
            raise RuntimeError("no HIP GPU visible and default_hip_archs is empty; set FLASHCOMPRESS_HIP_ARCH")
    _TARGET = target
    return target


def _format_value(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _ident_value(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value) if value >= 0 else f"m{-value}"
    return re.sub(r"[^A-Za-z0-9]", "_", value)


@dataclass(frozen=True)
class VariantKey:
    """Family name + sorted template parameters + target: one compiled module."""

    family: str
    params: tuple[tuple[str, ParamValue], ...]
    target: str

    @staticmethod
    def make(family: str, target: str | None = None, **params: ParamValue) -> "VariantKey":
        """Build and validate a key; ``target=None`` uses ``detect_target()``.

        The family must be registered (its module is imported on demand) and its
        ``check_params`` must accept ``params``; otherwise ``ValueError``/``UnknownFamily``.
        """
        fam = get_family(family)
        fam.check_params(params)
        resolved = detect_target() if target is None else normalize_target(target)
        return VariantKey(family, tuple(sorted(params.items())), resolved)

    @property
    def param_dict(self) -> dict[str, ParamValue]:
        """The parameters as a dict."""
        return dict(self.params)

    @property
    def backend(self) -> str:
        """``"cuda"`` or ``"hip"``."""
        return backend_of(self.target)

    @property
    def module_name(self) -> str:
        """Readable module name, a valid C identifier: ``fc_<family>_<name><value>...``."""
        parts = [f"fc_{self.family}"] + [f"{name}{_ident_value(value)}" for name, value in self.params]
        return "_".join(parts)

    def _display_order(self) -> list[tuple[str, ParamValue]]:
        fam = families().get(self.family)
        names = fam.param_names if fam is not None else None
        if not names:
            return list(self.params)
        order = {name: i for i, name in enumerate(names)}
        return sorted(self.params, key=lambda item: (order.get(item[0], len(order)), item[0]))

    def describe(self) -> str:
        """Human-readable form, e.g. ``plan(ratio=4, online=False) @ cuda:9.0a``."""
        args = ", ".join(f"{name}={value!r}" for name, value in self._display_order())
        return f"{self.family}({args}) @ {self.target}"

    def spec(self) -> str:
        """The CLI form understood by ``parse_spec``: ``plan:ratio=4,online=false``."""
        return format_spec(self.family, dict(self._display_order()))


def format_spec(family: str, params: Mapping[str, ParamValue]) -> str:
    """``family:name=value,...`` (booleans as ``true``/``false``)."""
    if not params:
        return family
    return family + ":" + ",".join(f"{k}={_format_value(v)}" for k, v in params.items())


def _parse_value(text: str, allowed: tuple[ParamValue, ...] | None) -> ParamValue:
    lowered = text.strip().lower()
    if allowed:
        for candidate in allowed:
            if _format_value(candidate).lower() == lowered:
                return candidate
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"[+-]?\d+", lowered):
        return int(lowered)
    return text.strip()


def parse_spec(spec: str) -> tuple[str, dict[str, ParamValue]]:
    """Parse ``family[:name=value,...]`` into the family name and a (possibly partial) param dict."""
    name, _, rest = spec.strip().partition(":")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"bad variant spec {spec!r}; expected family[:name=value,...]")
    fam = get_family(name)
    allowed = dict(fam.space) if fam.space is not None else {}
    params: dict[str, ParamValue] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        pname, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"bad variant spec {spec!r}: {item!r} is not name=value")
        params[pname.strip()] = _parse_value(value, allowed.get(pname.strip()))
    return name, params
