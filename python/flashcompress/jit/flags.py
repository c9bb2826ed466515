"""Compiler flags of every variant build, without machine-specific paths.

``logical_flags`` is what the cache key hashes; ``build.plan_steps`` adds the
include/library paths of this machine.  Kept apart from ``build`` so that a
cache hit does not import the build machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .family import Family
    from .variant import VariantKey

__all__ = ["BASE_CUDA_FLAGS", "BASE_CXX_FLAGS", "BASE_HIP_FLAGS", "BASE_LD_FLAGS", "HOST_ONLY_CXX_FLAGS",
           "logical_flags", "target_flags"]

# Device flags.  ptxas optimises device code at -O3 by default; -O2 is the host side.
BASE_CUDA_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O2", "--expt-relaxed-constexpr", "-lineinfo",
    "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
)
BASE_HIP_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O3", "-fPIC", "-fvisibility=hidden", "-fno-gpu-rdc", "-D__HIP_PLATFORM_AMD__=1",
)
BASE_CXX_FLAGS: tuple[str, ...] = (
    "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DTVM_FFI_DLL_EXPORT_INCLUDE_METADATA=1",
)
BASE_LD_FLAGS: tuple[str, ...] = ("-shared", "-Wl,--no-undefined")


def target_flags(target: str) -> tuple[str, ...]:
    """Arch flags for ``cuda:9.0a`` (``-gencode=arch=compute_90a,code=sm_90a``) or ``hip:gfx942``."""
    backend, arch = target.split(":", 1)
    if backend == "cuda":
        mm = arch.replace(".", "")
        return (f"-gencode=arch=compute_{mm},code=sm_{mm}",)
    return (f"--offload-arch={arch}",)


# Host-only families (``Family.host_only``, target ``host:<machine>``): no device compiler; the
# macro lets shared headers (ffi_check.h) leave out the GPU runtime.
HOST_ONLY_CXX_FLAGS: tuple[str, ...] = ("-DFC_HOST_ONLY=1",)


def logical_flags(family: "Family", key: "VariantKey") -> dict[str, list[str]]:
    """Every flag that shapes the binary, without machine-specific paths (hashed into the key)."""
    if key.backend == "host":
        return {"device": [], "host": [*BASE_CXX_FLAGS, *HOST_ONLY_CXX_FLAGS, *family.cxx_flags],
                "link": list(BASE_LD_FLAGS)}
    device = BASE_CUDA_FLAGS if key.backend == "cuda" else BASE_HIP_FLAGS
    return {
        "device": [*device, *target_flags(key.target), *family.cuda_flags],
        "host": [*BASE_CXX_FLAGS, *family.cxx_flags],
        "link": list(BASE_LD_FLAGS),
    }
