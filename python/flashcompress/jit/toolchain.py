"""Toolchain discovery and fingerprinting: device compiler, host compiler, tvm-ffi.

Backends: ``cuda`` and ``hip`` need their device compiler and the host compiler;
``host`` (host-only families, e.g. the native prefill planner) needs the host
compiler alone and works on a machine without any GPU toolkit.

The cache key includes the ``--version`` output of the device compiler (nvcc or
hipcc) and of the host compiler.  When either cannot be found or probed,
``get_toolchain`` raises ``ToolchainUnavailable`` (a ``FileNotFoundError``) naming
every missing compiler (``engine.resolve`` then loads entries built by any compiler).
Running them costs ~10 ms, too much for a cache hit in a fresh process, so their
output is memoised on disk under
``<cache root>/.toolchain/`` keyed by the resolved binary's path, size, inode
and mtime: a reinstalled compiler is a different file and is probed again.

Resolution (never guessed from a wrapper script's location):
  CUDA root  ``$CUDA_HOME`` / ``$CUDA_PATH``, else ``nvcc`` on PATH if its
             grandparent holds ``include/cuda_runtime.h``, else ``/usr/local/cuda``
  ROCm root  ``$ROCM_HOME`` / ``$ROCM_PATH``, else ``/opt/rocm``
  host       ``$CXX``, else ``c++``
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .cache import write_atomic

__all__ = ["Toolchain", "ToolchainUnavailable", "TvmFfiInfo", "clear_toolchain_memo", "get_toolchain", "tvm_ffi_info"]


class ToolchainUnavailable(FileNotFoundError):
    """A compiler needed to build variants of a backend is missing or broken.

    ``missing`` lists ``(compiler, why)`` pairs, e.g. ``("nvcc", "not found at /x/bin/nvcc; set CUDA_HOME ...")``.
    """

    def __init__(self, backend: str, missing: list[tuple[str, str]]) -> None:
        self.backend = backend
        self.missing = list(missing)
        super().__init__("; ".join(f"{name}: {why}" for name, why in self.missing))

    @property
    def compilers(self) -> list[str]:
        """Names of the missing compilers (``nvcc``, ``c++``, ...)."""
        return [name for name, _ in self.missing]


@dataclass(frozen=True)
class TvmFfiInfo:
    """Where tvm-ffi's headers and library are, and its version."""

    version: str
    include_dirs: tuple[Path, ...]
    lib_dir: Path
    lib_name: str  # "tvm_ffi" (linked as -ltvm_ffi)


@lru_cache(maxsize=None)
def tvm_ffi_info() -> TvmFfiInfo:
    """Locate tvm-ffi (imports it)."""
    import tvm_ffi
    from tvm_ffi import libinfo

    includes = []
    for path in (libinfo.find_include_path(), libinfo.find_dlpack_include_path()):
        if path and Path(path) not in includes:
            includes.append(Path(path))
    lib = Path(libinfo.find_libtvm_ffi())
    stem = lib.name.split(".", 1)[0]
    return TvmFfiInfo(
        version=str(tvm_ffi.__version__),
        include_dirs=tuple(includes),
        lib_dir=lib.parent,
        lib_name=stem[3:] if stem.startswith("lib") else stem,
    )


@dataclass(frozen=True)
class Toolchain:
    """Compilers and library roots used to build variants of one backend."""

    backend: str  # "cuda" | "hip" | "host"
    root: Path | None  # CUDA_HOME or ROCm root (as configured, symlinks kept for rpaths); None for "host"
    device_compiler: Path | None  # nvcc / hipcc; None for "host"
    host_compiler: Path  # c++
    device_version: str
    host_version: str

    @property
    def include_dir(self) -> Path:
        """Runtime headers (``cuda_runtime.h`` / ``hip/hip_runtime.h``); GPU backends only."""
        assert self.root is not None, "the host backend has no GPU runtime"
        return self.root / "include"

    @property
    def lib_dir(self) -> Path:
        """Directory of the GPU runtime library; GPU backends only."""
        assert self.root is not None, "the host backend has no GPU runtime"
        return self.root / ("lib64" if self.backend == "cuda" else "lib")

    @property
    def runtime_lib(self) -> str:
        """The GPU runtime linked into each module (``cudart`` / ``amdhip64``)."""
        return "cudart" if self.backend == "cuda" else "amdhip64"

    def fingerprint(self) -> dict[str, str]:
        """What the cache key records about the compilers."""
        return {"backend": self.backend, "device": self.device_version, "host": self.host_version}


def _env_root(*variables: str) -> Path | None:
    """The first of these environment variables that is set, as a path."""
    value = next((os.environ[v] for v in variables if os.environ.get(v)), None)
    return Path(value) if value else None


def _cuda_root() -> Path:
    root = _env_root("CUDA_HOME", "CUDA_PATH")
    if root is not None:
        return root
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidate = Path(os.path.realpath(nvcc)).parent.parent
        if (candidate / "include" / "cuda_runtime.h").is_file():
            return candidate
    return Path("/usr/local/cuda")


def _rocm_root() -> Path:
    return _env_root("ROCM_HOME", "ROCM_PATH") or Path("/opt/rocm")


def _host_compiler_name() -> str:
    return os.environ.get("CXX") or "c++"


def _host_compiler() -> Path:
    name = _host_compiler_name()
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"host C++ compiler {name!r} not found on PATH (set CXX)")
    return Path(found)


def _probe_version(binary: Path, cache_dir: Path | None, extra_env: dict[str, str] | None = None) -> str:
    """``binary --version``, memoised on disk by the resolved file's identity."""
    real = Path(os.path.realpath(binary))
    st = real.stat()
    ident = f"{real}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{sorted((extra_env or {}).items())}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:24]
    memo = cache_dir / f"{digest}.txt" if cache_dir is not None else None
    if memo is not None:
        try:
            return memo.read_text(encoding="utf-8")
        except OSError:
            pass
    env = dict(os.environ, **(extra_env or {}))
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env=env, check=False)
    except OSError as exc:  # not executable, wrong architecture, ...
        raise RuntimeError(f"`{binary} --version` could not run: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"`{binary} --version` failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    text = proc.stdout.strip()
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return text  # read-only cache: probe again next process
        write_atomic(memo, text)
    return text


# One memo: (backend, cache root, toolchain-relevant environment) -> Toolchain or the failure.
_TOOLCHAINS: dict[tuple[str, ...], Toolchain | ToolchainUnavailable] = {}


def _device_compiler(backend: str) -> tuple[Path, Path, dict[str, str] | None]:
    """(toolkit root, device compiler path, extra env for probing it)."""
    if backend == "cuda":
        root = _cuda_root()
        return root, root / "bin" / "nvcc", None
    if backend == "hip":
        root = _rocm_root()
        device = root / "bin" / "hipcc"
        if not device.exists() and shutil.which("hipcc"):
            device = Path(shutil.which("hipcc"))  # type: ignore[arg-type]
        return root, device, {"HIP_PLATFORM": "amd"}
    raise ValueError(f"unknown GPU backend {backend!r}")


def get_toolchain(backend: str, cache_root: Path | None) -> Toolchain:
    """The toolchain for ``backend`` (memoised per process and cache root).

    Raises ``ToolchainUnavailable`` naming every compiler that is missing or whose
    ``--version`` fails (also memoised; ``clear_toolchain_memo`` forgets it).
    """
    env = os.environ
    memo_key = (backend, str(cache_root), *(env.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH", "ROCM_HOME",
                                                                      "ROCM_PATH", "CXX", "PATH")))
    cached = _TOOLCHAINS.get(memo_key)
    if isinstance(cached, ToolchainUnavailable):
        raise cached
    if cached is not None:
        return cached
    probe_dir = cache_root / ".toolchain" if cache_root is not None else None
    root, device, probe_env = (None, None, None) if backend == "host" else _device_compiler(backend)
    missing: list[tuple[str, str]] = []
    device_version = host_version = ""
    if device is None:  # the host backend: the host compiler is all it needs
        pass
    elif not device.exists():
        var = "CUDA_HOME" if backend == "cuda" else "ROCM_PATH"
        missing.append((device.name, f"not found at {device}; set {var} to the toolkit root"))
    else:
        try:
            device_version = _probe_version(device, probe_dir, probe_env)
        except (OSError, RuntimeError) as exc:
            missing.append((device.name, str(exc)))
    host: Path | None = None
    try:
        host = _host_compiler()
        host_version = _probe_version(host, probe_dir)
    except (OSError, RuntimeError) as exc:
        missing.append((_host_compiler_name(), str(exc)))
    if missing or host is None:
        error = _TOOLCHAINS[memo_key] = ToolchainUnavailable(backend, missing)
        raise error
    toolchain = _TOOLCHAINS[memo_key] = Toolchain(backend, root, device, host, device_version, host_version)
    return toolchain


def clear_toolchain_memo() -> None:
    """Forget probed toolchains and failed probes (tests that switch compilers)."""
    _TOOLCHAINS.clear()
