"""Variant keys and GPU targets.

A ``VariantKey`` is a plain frozen value: the family name, the template
parameters (in the family's declared order) and the target (``"cuda:9.0a"``,
``"hip:gfx942"``).  Families make keys (``Family.key`` / ``family.make_key``),
which validates the parameters once; this module knows nothing about families.
The key names the module (``fc_plan_online0_ratio4``, also the C++ namespace of
the variant) and, with the digests computed by the engine, its cache directory.
Host-only families (no GPU code) use the target ``host:<machine>`` (``host_target``).

Targets are detected once per process: the configured override, else the
current GPU (torch), else the first configured default arch.  The backend
(CUDA or HIP) is part of the target string and is chosen once, here.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from typing import Mapping, Union

from .settings import get_settings, on_reload

__all__ = ["ParamValue", "VariantKey", "detect_backend", "detect_target", "format_spec", "host_target",
           "normalize_target", "target_arch", "target_tag"]

ParamValue = Union[int, str, bool]

_CUDA_ARCH = re.compile(r"(?:sm_?|compute_)?(\d+)\.?(\d)([af]?)")
_HIP_ARCH = re.compile(r"gfx[0-9a-f]+(?::[a-z0-9+-]+)*")


CUDA_SPELLINGS = "'9.0a', 'sm_90a', 'sm90a', '90a' or 'cuda:9.0a' (likewise 10.0a; 8.0, sm_80, 8.6, 8.9 before 9.0)"
MIN_CUDA_MAJOR = 8  # the kernels need sm_80 or newer (bf16, cp.async)


def normalize_target(target: str) -> str:
    """Canonical target string: ``cuda:<M>.<m>[a|f]`` or ``hip:gfx...``.

    Accepts ``"cuda:9.0a"``, ``"9.0a"``, ``"90a"``, ``"sm_90a"``, ``"sm90a"``, ``"8.0"``, ``"sm_80"``,
    ``"hip:gfx942"``, ``"gfx942"``.  Refused with a ``ValueError`` listing the accepted spellings:
    targets below sm_80, and suffix-less forms from 9.0 on (``"sm90"``, ``"9.0"``): a 9.0 GPU is
    built for the arch-specific ``9.0a``, and ``sm90`` silently meaning something else is a trap.
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
            major, minor, suffix = int(match.group(1)), match.group(2), match.group(3)
            if major < MIN_CUDA_MAJOR:
                raise ValueError(f"CUDA target {target!r} (sm_{major}{minor}) is not supported: flashcompress needs "
                                 f"sm_80 or newer; accepted spellings: {CUDA_SPELLINGS}")
            if major >= 9 and not suffix:
                raise ValueError(f"ambiguous CUDA target {target!r}: from 9.0 on give the arch-specific target, "
                                 f"'{major}.{minor}a' (what a compute capability {major}.{minor} GPU is built for); "
                                 f"accepted spellings: {CUDA_SPELLINGS}")
            if major < 9 and suffix:
                raise ValueError(f"CUDA target {target!r}: there are no '{suffix}' targets before 9.0; "
                                 f"accepted spellings: {CUDA_SPELLINGS}")
            return f"cuda:{major}.{minor}{suffix}"
    raise ValueError(f"bad target {target!r}; expected a CUDA target, {CUDA_SPELLINGS}, or a HIP one, 'gfx942'")


def host_target() -> str:
    """The target of host-only families: ``host:<machine>`` (``host:x86_64``), whatever GPU is present."""
    return f"host:{platform.machine().lower() or 'unknown'}"


def target_arch(target: str) -> str:
    """The arch as templates see it: ``"90a"`` for ``cuda:9.0a``, ``"gfx942"`` for ``hip:gfx942``,
    ``"x86_64"`` for ``host:x86_64``."""
    backend, arch = target.split(":", 1)
    return arch.replace(".", "") if backend == "cuda" else arch


def target_tag(target: str) -> str:
    """Directory name of a target in the cache: ``sm90a`` / ``gfx942`` / ``host-x86_64``."""
    backend, arch = target.split(":", 1)
    if backend == "host":
        return f"host-{arch}"
    return "sm" + arch.replace(".", "") if backend == "cuda" else arch.replace(":", "_")


_DETECTED: dict[str, str] = {}  # "backend" / "target" of this process
on_reload(_DETECTED.clear)


def detect_backend() -> str:
    """The GPU backend of this process: the ``gpu_backend`` setting, else HIP iff torch is a ROCm build."""
    if "backend" not in _DETECTED:
        choice = get_settings().gpu_backend
        if choice == "auto":
            import torch

            choice = "hip" if getattr(torch.version, "hip", None) else "cuda"
        _DETECTED["backend"] = choice
    return _DETECTED["backend"]


def detect_target() -> str:
    """The target of this process: configured override, else the current GPU, else the default arch."""
    if "target" in _DETECTED:
        return _DETECTED["target"]
    settings = get_settings()
    backend = detect_backend()
    override, defaults = ((settings.cuda_arch, settings.default_cuda_archs) if backend == "cuda"
                          else (settings.hip_arch, settings.default_hip_archs))
    import torch

    if override:
        target = normalize_target(f"{backend}:" + override.removeprefix(f"{backend}:"))
    elif torch.cuda.is_available():
        if backend == "cuda":
            major, minor = torch.cuda.get_device_capability(torch.cuda.current_device())
            target = f"cuda:{major}.{minor}{'a' if major >= 9 else ''}"
        else:
            name = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
            target = normalize_target("hip:" + name.split(":", 1)[0])
    elif defaults:
        target = normalize_target(f"{backend}:" + defaults[0].removeprefix(f"{backend}:"))
    else:
        var = "FLASHCOMPRESS_CUDA_ARCH, e.g. 9.0a" if backend == "cuda" else "FLASHCOMPRESS_HIP_ARCH"
        raise RuntimeError(f"no {backend.upper()} GPU visible and default_{backend}_archs is empty; set {var}")
    _DETECTED["target"] = target
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
    """Family name + template parameters (declared order) + target: one compiled module."""

    family: str
    params: tuple[tuple[str, ParamValue], ...]
    target: str

    @property
    def param_dict(self) -> dict[str, ParamValue]:
        """The parameters as a dict."""
        return dict(self.params)

    @property
    def backend(self) -> str:
        """``"cuda"``, ``"hip"`` or ``"host"`` (host-only families)."""
        return self.target.split(":", 1)[0]

    @property
    def module_name(self) -> str:
        """Readable module name, a valid C identifier: ``fc_<family>_<name><value>...`` (names sorted)."""
        return "_".join([f"fc_{self.family}"] + [f"{n}{_ident_value(v)}" for n, v in sorted(self.params)])

    def describe(self) -> str:
        """Human-readable form, e.g. ``plan(ratio=4, online=False) @ cuda:9.0a``."""
        return f"{self.family}({', '.join(f'{n}={v!r}' for n, v in self.params)}) @ {self.target}"

    def spec(self) -> str:
        """The CLI form: ``plan:ratio=4,online=false``."""
        return format_spec(self.family, dict(self.params))


def format_spec(family: str, params: Mapping[str, ParamValue]) -> str:
    """``family:name=value,...`` (booleans as ``true``/``false``)."""
    if not params:
        return family
    return family + ":" + ",".join(f"{k}={_format_value(v)}" for k, v in params.items())
