"""JIT settings: shipped defaults < user config file < ``FLASHCOMPRESS_*`` environment.

Every setting has exactly one TOML key and one environment variable, named
``FLASHCOMPRESS_<KEY>`` (upper case).  The defaults live in ``.cache-config.toml``
at the repository root, shipped as ``flashcompress/default-cache-config.toml``;
``SCHEMA`` below gives each key its type and meaning and is the source of the
table in the README's Settings section (``flashcompress config --markdown``).

Settings are read once per process, on first use; ``reload_settings()`` forgets
them (tests, or a process that changes its environment on purpose).

This module is imported by ``flashcompress.jit`` at import time, so it must stay
cheap: standard library only, no torch, no tvm-ffi.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["SCHEMA", "Setting", "Settings", "SettingsError", "debug_checks_enabled", "default_config_path",
           "forget_settings", "get_settings", "jit_enabled_for", "markdown_table", "reload_settings",
           "user_config_path", "validated"]

ENV_PREFIX = "FLASHCOMPRESS_"
CONFIG_ENV = "FLASHCOMPRESS_CONFIG"
# FLASHCOMPRESS_* names that are not settings but are read elsewhere: the test suite's knobs and
# the v41 family's kernel design at import (cuda_ops/v41.py, an A/B switch)
OTHER_ENV = ("FLASHCOMPRESS_PROPERTY_SEEDS", "FLASHCOMPRESS_TEST_DEVICE", "FLASHCOMPRESS_V41_DESIGN")


class SettingsError(ValueError):
    """A config file or environment variable holds a value the schema rejects."""


# --------------------------------------------------------------------------- schema


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"must be a boolean (1/0, true/false), got {text!r}")


def _parse_count(value: Any) -> int:
    """A non-negative integer from TOML (an int) or the environment (decimal digits)."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, bool) or not (isinstance(text, int) or (isinstance(text, str) and text.isdigit())):
        raise ValueError(f"must be a non-negative integer, got {value!r}")
    return int(text)


def _parse_list(text: str) -> list[str]:
    return [part for part in re.split(r"[\s,;]+", text.strip()) if part]


@dataclass(frozen=True)
class Setting:
    """One configurable value: its TOML key, Python type and documentation."""

    key: str
    kind: str  # "str" | "int" | "bool" | "list" | "choice"
    meaning: str
    choices: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        """The environment variable that overrides this setting."""
        return ENV_PREFIX + self.key.upper()

    def coerce(self, value: Any, origin: str) -> Any:
        """Convert a TOML value or an environment string to this setting's type.

        A bad value raises :class:`SettingsError` naming where it came from:
        ``FLASHCOMPRESS_JOBS must be a non-negative integer, got 'abc'``.
        """
        try:
            if self.kind == "bool":
                if isinstance(value, bool):
                    return value
                if isinstance(value, str):
                    return _parse_bool(value)
                if isinstance(value, int) and value in (0, 1):
                    return bool(value)
                raise ValueError(f"must be a boolean, got {value!r}")
            if self.kind == "int":
                return _parse_count(value)
            if self.kind == "list":
                if isinstance(value, str):
                    return tuple(_parse_list(value))
                if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                    return tuple(value)
                raise ValueError(f"must be a list of strings, got {value!r}")
            if not isinstance(value, str):
                raise ValueError(f"must be a string, got {value!r}")
            if self.kind == "choice":
                choice = value.strip().lower()
                if choice not in self.choices:
                    raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")
                return choice
            return value.strip()
        except ValueError as exc:
            where = self.env if origin == self.env else f"{origin}: setting {self.key!r}"
            raise SettingsError(f"{where} {exc}") from None


SCHEMA: tuple[Setting, ...] = (
    Setting("cache_dir", "str", "Root of the compiled-kernel cache (`~` and `$VARS` expanded). Must be "
            "writable wherever a variant may be built; a prewarmed cache may be read-only."),
    Setting("gpu_backend", "choice", "GPU toolchain: `auto` (HIP when torch is a ROCm build, else CUDA), "
            "`cuda` (nvcc) or `hip` (hipcc). Chosen once per process.", ("auto", "cuda", "hip")),
    Setting("cuda_arch", "str", "CUDA target override, e.g. `9.0a` (also `sm_90a`, `sm90a`, `90a`, `cuda:9.0a`; "
            "from 9.0 on the suffix is required, and targets below sm_80 are refused). Empty: the current GPU's "
            "compute capability (`a` suffix from 9.0 on), else the first of `default_cuda_archs`."),
    Setting("hip_arch", "str", "HIP target override, e.g. `gfx942`. Empty: the current GPU's "
            "`gcnArchName`, else the first of `default_hip_archs`."),
    Setting("default_cuda_archs", "list", "CUDA targets for machines without a GPU (build boxes, CI); "
            "`flashcompress prewarm` builds every one of them. Env: space- or comma-separated."),
    Setting("default_hip_archs", "list", "HIP targets for machines without a GPU."),
    Setting("jobs", "int", "Parallel compiler processes. 0: min(CPU cores, available memory / 2 GiB). "
            "`prewarm -j N` (N >= 1) overrides it; N is still capped by CPU cores and available memory "
            "(with a note)."),
    Setting("size_cap_mb", "int", "Soft cap on the cache size in MiB, enforced after each build by evicting "
            "other package versions first, then the least recently loaded entries. 0: unlimited."),
    Setting("lock_timeout_s", "int", "Seconds to wait for another process that is building the same "
            "variant before failing with an error naming the lock file."),
    Setting("offline", "bool", "Never compile: a cache miss raises `OfflineCacheMiss`, naming the variant "
            "and the exact `flashcompress prewarm` command that would build it. An entry built from the same "
            "sources, flags and target by other compiler versions is loaded rather than treated as a miss."),
    Setting("force_rebuild", "bool", "Ignore cached entries and rebuild each variant once per process "
            "(the new build replaces the old entry)."),
    Setting("verbose", "bool", "Log cache hits, misses and every compiler command with its output to "
            "stderr (logger `flashcompress.jit`)."),
    Setting("backend", "choice", "`auto`: JIT kernels for CUDA tensors, PyTorch for CPU tensors; prefill stage 0 "
            "from host lengths runs in the native host planner (`plan_host`) on either. `torch`: the PyTorch "
            "backend even for CUDA tensors, and the PyTorch prefill stage 0. `jit` is accepted as a synonym of "
            "`auto`.",
            ("auto", "torch", "jit")),
    Setting("debug", "bool", "Enable expensive data-dependent checks (they synchronise with the GPU)."),
)

_BY_KEY: dict[str, Setting] = {s.key: s for s in SCHEMA}


# --------------------------------------------------------------------------- TOML


def _read_toml(path: Path) -> dict[str, Any]:
    """Parse a config file with ``tomllib``."""
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: {exc}") from None


# --------------------------------------------------------------------------- resolution


def default_config_path() -> Path:
    """The shipped defaults: ``flashcompress/default-cache-config.toml`` (repo: ``.cache-config.toml``)."""
    package_dir = Path(__file__).resolve().parent.parent
    shipped = package_dir / "default-cache-config.toml"
    if shipped.is_file():
        return shipped
    return package_dir.parent.parent / ".cache-config.toml"


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$FLASHCOMPRESS_CONFIG``, else ``$XDG_CONFIG_HOME/flashcompress/config.toml`` (``~/.config``)."""
    env = os.environ if environ is None else environ
    explicit = env.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "flashcompress" / "config.toml"


@dataclass(frozen=True)
class Settings:
    """The effective settings of this process, and where each value came from."""

    cache_dir: Path
    gpu_backend: str
    cuda_arch: str
    hip_arch: str
    default_cuda_archs: tuple[str, ...]
    default_hip_archs: tuple[str, ...]
    jobs: int
    size_cap_mb: int
    lock_timeout_s: int
    offline: bool
    force_rebuild: bool
    verbose: bool
    backend: str
    debug: bool
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    config_files: tuple[Path, ...] = field(default=(), compare=False, repr=False)

    @staticmethod
    def resolve(environ: Mapping[str, str] | None = None) -> "Settings":
        """Read defaults, the user file and the environment (in that order of precedence)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        files: list[Path] = []

        def apply(table: Mapping[str, Any], origin: str, *, require_all: bool) -> None:
            for key, raw in table.items():
                setting = _BY_KEY.get(key)
                if setting is None:
                    known = ", ".join(sorted(_BY_KEY))
                    raise SettingsError(f"{origin}: unknown setting {key!r} (known: {known})")
                values[key] = setting.coerce(raw, origin)
                origins[key] = origin
            if require_all:
                missing = sorted(set(_BY_KEY) - set(table))
                if missing:
                    raise SettingsError(f"{origin}: defaults file lacks {', '.join(missing)}")

        default_path = default_config_path()
        apply(_read_toml(default_path), str(default_path), require_all=True)
        files.append(default_path)
        user_path = user_config_path(env)
        if user_path.is_file():
            apply(_read_toml(user_path), str(user_path), require_all=False)
            files.append(user_path)
        elif env.get(CONFIG_ENV):
            raise SettingsError(f"{CONFIG_ENV}={env[CONFIG_ENV]!r}: no such file")
        for setting in SCHEMA:
            if setting.env in env:
                values[setting.key] = setting.coerce(env[setting.env], setting.env)
                origins[setting.key] = f"${setting.env}"
        warn_unknown_environment(env)
        if not values["cache_dir"]:
            where = origins.get("cache_dir", str(default_path))
            raise SettingsError(f"{where}: setting 'cache_dir' is empty (it would mean the current directory); "
                                f"give a directory, or unset {_BY_KEY['cache_dir'].env} for the default")
        values["cache_dir"] = Path(os.path.expandvars(os.path.expanduser(values["cache_dir"])))
        return Settings(**values, origins=origins, config_files=tuple(files))

    def origin(self, key: str) -> str:
        """Where the value of ``key`` came from: a file path or ``$FLASHCOMPRESS_<KEY>``."""
        return self.origins.get(key, "?")

    def how_to_set(self, key: str) -> str:
        """A human hint naming both ways to change ``key``."""
        return f"set {_BY_KEY[key].env} or `{key}` in {user_config_path()}"


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for every ``FLASHCOMPRESS_*`` variable that is no setting."""
    import difflib

    env = os.environ if environ is None else environ
    known = [s.env for s in SCHEMA] + [CONFIG_ENV, *OTHER_ENV]
    out = []
    suffixes = {k[len(ENV_PREFIX):]: k for k in known}
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n not in known):
        close = difflib.get_close_matches(name[len(ENV_PREFIX):], list(suffixes), n=1, cutoff=0.6)
        out.append((name, suffixes[close[0]] if close else None))
    return out


def _outside_package_stacklevel() -> int:
    """The ``stacklevel`` of the innermost caller outside flashcompress (and the import machinery),
    so that a warning names the user's line, not ours; counted from the function calling this."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2  # level 1 is warn_unknown_environment, 2 its caller
    while frame is not None and (frame.f_code.co_filename.startswith(package)
                                 or frame.f_code.co_filename.startswith("<frozen importlib")):
        frame, level = frame.f_back, level + 1
    return level


def warn_unknown_environment(environ: Mapping[str, str] | None = None) -> None:
    """Warn (``UserWarning``) about each unknown ``FLASHCOMPRESS_*`` variable, naming the closest setting.

    The warning is attributed to the first caller outside the package, so it shows no line of ours.
    """
    import warnings

    for name, close in unknown_environment(environ):
        hint = f"did you mean {close}?" if close else "`flashcompress config` lists the settings"
        warnings.warn(f"{name} is not a flashcompress setting and is ignored; {hint}", UserWarning,
                      stacklevel=_outside_package_stacklevel())


_CURRENT: Settings | None = None


def get_settings() -> Settings:
    """The process's settings, resolved on first use."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = Settings.resolve()
    return _CURRENT


def forget_settings() -> None:
    """Drop the cached settings (and everything derived from them); the next use reads them again."""
    global _CURRENT, _JIT_ENABLED, _DEBUG
    _CURRENT = None
    _JIT_ENABLED = None
    _DEBUG = None
    for hook in _RELOAD_HOOKS:
        hook()


def reload_settings() -> Settings:
    """Forget the cached settings and read them again (after changing the environment)."""
    forget_settings()
    return get_settings()


_RELOAD_HOOKS: list[Callable[[], None]] = []


def on_reload(hook: Callable[[], None]) -> None:
    """Register a callback run by ``reload_settings`` (other modules drop their derived caches)."""
    _RELOAD_HOOKS.append(hook)


# --------------------------------------------------------------------------- hot-path queries

_JIT_ENABLED: bool | None = None
_DEBUG: bool | None = None
# device -> its type string. ``torch.device.type`` costs about 0.6 µs (torch 2.13), a dict hit about
# 0.1; devices are immutable values (hashed by type and index), so an entry never goes stale.
_DEVICE_TYPES: dict[Any, str] = {}


def validated() -> Settings:
    """The settings, resolved and checked once per process (until ``reload_settings``).

    The API path calls this on its first call whatever the device (through
    ``jit_enabled_for``), so a bad value (``FLASHCOMPRESS_BACKEND=cuda``) is a
    :class:`SettingsError` there too, and an unknown ``FLASHCOMPRESS_*`` variable warns,
    even when only CPU tensors are used.
    """
    return get_settings()


def jit_enabled_for(device: Any) -> bool:
    """True when a call on ``device`` (a ``torch.device``) should launch JIT kernels.

    CPU tensors always use the PyTorch backend; GPU tensors (``device.type == "cuda"``,
    which includes ROCm builds of torch) use JIT kernels unless ``backend = "torch"``.
    The first call validates the settings (:func:`validated`), for every device.
    """
    global _JIT_ENABLED
    if _JIT_ENABLED is None:
        _JIT_ENABLED = validated().backend != "torch"
    kind = _DEVICE_TYPES.get(device)
    if kind is None:
        kind = _DEVICE_TYPES[device] = getattr(device, "type", device)
    return kind == "cuda" and _JIT_ENABLED


def debug_checks_enabled() -> bool:
    """True when ``FLASHCOMPRESS_DEBUG`` asks for expensive data-dependent checks."""
    global _DEBUG
    if _DEBUG is None:
        _DEBUG = get_settings().debug
    return _DEBUG


# --------------------------------------------------------------------------- documentation


def _format_default(value: Any) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (list, tuple)):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def markdown_table() -> str:
    """The settings reference as Markdown: the README's "Settings" block, between its markers."""
    defaults = _read_toml(default_config_path())
    lines = [
        "Precedence, lowest first: the shipped defaults (`.cache-config.toml`, installed as "
        "`flashcompress/default-cache-config.toml`), the user file (`$FLASHCOMPRESS_CONFIG`, else "
        "`$XDG_CONFIG_HOME/flashcompress/config.toml`, else `~/.config/flashcompress/config.toml`; flat "
        "`key = value` lines), then the environment variable. Booleans accept `1/0/true/false/yes/no/on/off`. "
        "Settings are read and validated once per process, on the first API call (whatever the tensors' "
        "device) or CLI command: a bad value is a `SettingsError` naming the variable. `flashcompress config` "
        "prints the effective values and "
        "where each came from. An unknown `FLASHCOMPRESS_*` variable gets a warning naming the closest "
        "setting; an empty `cache_dir` is an error (not the current directory).",
        "",
        "| environment variable | config key | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for setting in SCHEMA:
        lines.append(
            f"| `{setting.env}` | `{setting.key}` | {_format_default(defaults[setting.key])} | {setting.meaning} |"
        )
    lines.append(f"| `{CONFIG_ENV}` | — | unset | Path of the user config file (must exist when set). |")
    lines += [
        "",
        "Toolchain variables honoured (not flashcompress-specific): `CUDA_HOME` / `CUDA_PATH` (CUDA toolkit "
        "root; else derived from `nvcc` on `PATH`, else `/usr/local/cuda`), `ROCM_HOME` / `ROCM_PATH` (else "
        "`/opt/rocm`), `CXX` (host compiler, default `c++`). Their `--version` output is part of every cache "
        "key, so a different compiler rebuilds. Loading a prewarmed cache does not need them: where they cannot "
        "be found (a runtime image without the toolkit) an entry built from the same sources, flags and target "
        "by any compiler is loaded, and a miss raises `ToolchainMissing` (a subclass of `OfflineCacheMiss`) "
        "naming the missing compiler, the prewarm command and `FLASHCOMPRESS_BACKEND=torch`.",
    ]
    return "\n".join(lines)
