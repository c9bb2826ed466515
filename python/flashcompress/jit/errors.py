"""Exceptions raised by the JIT engine.

Every error names the variant it concerns (``VariantKey.describe()``) and says
what to do next.  They all derive from ``JitError`` (a ``RuntimeError``), so a
caller can catch the family without importing the engine internals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

__all__ = ["BuildError", "CacheCorruptionWarning", "CacheNotWritable", "CaptureBuildError",
           "HostPlannerFallbackWarning", "JitError", "LockTimeout", "OfflineCacheMiss", "ToolchainMissing",
           "UnknownFamily"]


class JitError(RuntimeError):
    """Base class of every JIT engine error; ``variant`` names the variant it concerns (if any)."""

    def __init__(self, message: str = "", variant: str | None = None) -> None:
        super().__init__(message)
        self.variant = variant


class UnknownFamily(JitError, KeyError):
    """A variant names a kernel family nobody registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OfflineCacheMiss(JitError):
    """``FLASHCOMPRESS_OFFLINE=1`` and the variant is not in the cache."""

    def __init__(self, variant: str, leaf: Path, command: str, message: str | None = None) -> None:
        self.leaf = leaf
        self.command = command
        super().__init__(
            (message or f"JIT variant {variant} is not in the cache (expected at {leaf}) and FLASHCOMPRESS_OFFLINE=1 "
                        f"forbids compiling at runtime. Build it ahead of time with:")
            + f"\n    {command}\nor use the PyTorch backend instead of JIT kernels: FLASHCOMPRESS_BACKEND=torch",
            variant,
        )


class ToolchainMissing(OfflineCacheMiss):
    """The variant is not in the cache and this machine has no compiler to build it.

    A subclass of ``OfflineCacheMiss``: for the caller it is the same situation (a miss
    this process cannot compile), so ``except OfflineCacheMiss`` handles both.
    ``compilers`` names what is missing (``["nvcc"]``, ``["c++"]``, ...).
    """

    def __init__(self, variant: str, where: Path, command: str, missing: Sequence[tuple[str, str]],
                 backend: str, *, offline: bool = False, problem: str | None = None) -> None:
        self.missing = list(missing)
        self.compilers = [name for name, _ in self.missing]
        self.problem = problem
        kit = {"cuda": "the CUDA toolkit and a C++ compiler", "hip": "ROCm and a C++ compiler",
               "host": "a C++ compiler"}.get(backend, backend)
        what = " and ".join(f"`{name}`" for name in self.compilers) or "a compiler"
        details = "\n".join(f"    {name}: {why}" for name, why in self.missing)
        found = (f"the cached entry is unusable ({problem})" if problem
                 else f"no entry for it under {where}")
        super().__init__(
            variant, where, command,
            f"JIT variant {variant} is not in the cache ({found}) and cannot be compiled here: no compiler was "
            f"found ({what} missing{'; FLASHCOMPRESS_OFFLINE=1 is set as well' if offline else ''}):\n{details}\n"
            f"Either prewarm the cache on a machine with {kit} (same cache_dir, then ship "
            f"or mount it here):",
        )


class CaptureBuildError(JitError):
    """A build or first load was requested while a CUDA graph is being captured."""

    def __init__(self, variant: str, command: str) -> None:
        self.command = command
        super().__init__(
            f"JIT variant {variant} would be compiled/loaded for the first time during CUDA-graph capture, "
            f"which is not allowed. Load every variant before capturing (prewarm with `{command}` and call "
            f"the op once before capture).", variant
        )


class CacheNotWritable(JitError):
    """The cache directory (or a parent) cannot be written, and a build is needed."""

    def __init__(self, variant: str, path: Path, reason: str, hint: str) -> None:
        self.path = path
        super().__init__(
            f"cannot build JIT variant {variant}: the cache directory {path} is not writable ({reason}). "
            f"To use another directory, {hint}; or prewarm this cache where it is writable.", variant
        )


class LockTimeout(JitError):
    """Another process held a variant's build lock for longer than ``lock_timeout_s``."""

    def __init__(self, variant: str, lock_path: Path, seconds: float) -> None:
        self.lock_path = lock_path
        super().__init__(
            f"timed out after {seconds:.0f} s waiting for the build lock {lock_path} of JIT variant {variant}; "
            f"another process is building it (or hung while doing so). Raise FLASHCOMPRESS_LOCK_TIMEOUT_S or "
            f"stop that process.", variant
        )


class BuildError(JitError):
    """A compiler or linker command failed; the full log is kept on disk."""

    def __init__(self, variant: str, command: str, first_errors: Sequence[str], log_path: Path,
                 returncode: int | None = None) -> None:
        self.command = command
        self.first_errors = list(first_errors)
        self.log_path = log_path
        self.returncode = returncode
        excerpt = "\n".join(f"    {line}" for line in self.first_errors) or "    (no output)"
        super().__init__(
            f"failed to build JIT variant {variant}\n  command: {command}\n  first errors:\n{excerpt}\n"
            f"  full log: {log_path}", variant
        )


class CacheCorruptionWarning(RuntimeWarning):
    """A cached library failed to load or did not match its manifest (size, sha256, exports);
    it is removed and rebuilt (or, where nothing can be built, removed and reported)."""


class HostPlannerFallbackWarning(UserWarning):
    """The native host planner (``plan_host``) could not be loaded or built, so prefill stage 0 from
    host lengths runs in PyTorch: the same bytes, more host time.  Issued once per variant and
    process; ``FLASHCOMPRESS_BACKEND=torch`` chooses the PyTorch stage 0 without it."""
