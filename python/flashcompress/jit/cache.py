"""The on-disk cache: layout, content keys, manifests, scanning, eviction.

Layout (``<root>`` = the ``cache_dir`` setting)::

    <root>/CACHEDIR.TAG                        marks the tree as a cache (backup tools skip it; `clean` requires it)
    <root>/.toolchain/<id>.txt                 memoised `--version` outputs (see toolchain.py)
    <root>/<pkg-version>/<target-tag>/<module_name>/
        <key>/                                 a published entry (complete or absent: renamed into place)
            <module_name>.so  kernel.cu  binding.cpp  variant.json  build.log
            <module_name>.so.verified          sidecar: the (inode, size, mtime, ctime) whose sha256 was checked
        current-<input-digest>                 pointer: names the <key> last published for these inputs
        <key>.lock                             per-variant build lock (builders only; never deleted while in use)
        .staging-<key>-<rand>/                 a build in progress (or killed: swept by the next builder)
        <key>.failed/                          sources + build.log of the last failed build of <key>
        .trash-<rand>/                         an entry being removed

The key is a sha256 prefix over the rendering inputs (family template files and
what they include, parameters, target), the content of the headers under
``jit_kernel/`` those sources include (``render.headers_digest``), all flags, the
device and host compiler ``--version`` outputs, the tvm-ffi version, the package
version and the engine's recipe version.  No absolute path and no mtime enters
it.  Version and target appear in the path for humans and ``du``; the key alone
decides.

The *input digest* covers the same inputs except the compiler versions.  Each
publish writes ``current-<input-digest>`` naming the key just built, so a machine
that cannot probe the compilers (a runtime image without the CUDA toolkit), or an
offline process whose compilers differ from the build machine's, can still find
the entry built for exactly these sources, flags and target; the engine then checks
the entry's manifest against the inputs before loading it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from .family import Family
    from .toolchain import Toolchain
    from .variant import VariantKey

__all__ = [
    "CACHEDIR_TAG",
    "ENGINE_RECIPE",
    "Layout",
    "POINTER_PREFIX",
    "available_memory_bytes",
    "compute_key",
    "content_key",
    "default_jobs",
    "ensure_root",
    "file_identity",
    "file_sha256",
    "input_digest",
    "jobs_for",
    "key_inputs",
    "memory_job_cap",
    "package_version",
    "pointer_path",
    "read_manifest",
    "read_pointer",
    "remove_tree",
    "touch",
    "write_atomic",
]

# Bump when the build procedure changes in a way the hashed inputs do not capture.
# 2: header closure instead of the whole jit_kernel/ tree; input-digest pointers; .so sidecars.
ENGINE_RECIPE = 2
KEY_LENGTH = 20
CACHEDIR_TAG = "CACHEDIR.TAG"
_TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
             "# This file is a cache directory tag created by flashcompress (JIT kernel cache).\n"
             "# For information about cache directory tags see https://bford.info/cachedir/\n")

_PACKAGE_VERSION: str | None = None


def package_version() -> str:
    """flashcompress's version (``flashcompress.__version__``, else the installed metadata)."""
    global _PACKAGE_VERSION
    if _PACKAGE_VERSION is None:
        try:
            import flashcompress

            _PACKAGE_VERSION = str(flashcompress.__version__)
        except (ImportError, AttributeError):
            from importlib import metadata

            try:
                _PACKAGE_VERSION = metadata.version("flashcompress")
            except metadata.PackageNotFoundError:
                _PACKAGE_VERSION = "0+unknown"
    return _PACKAGE_VERSION


GIB = 1024 ** 3
BYTES_PER_JOB = 2 * GIB  # peak resident memory of one nvcc / g++ process on a plan-builder TU, rounded up


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (None when unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_job_cap() -> int | None:
    """How many compiler processes fit in the available memory (~2 GiB each; at least 1), None if unknown."""
    available = available_memory_bytes()
    return None if available is None else max(1, available // BYTES_PER_JOB)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def jobs_for(requested: int, settings: Settings | None = None) -> tuple[int, str | None]:
    """The number of parallel compiler processes, and a note when memory capped it.

    ``requested`` > 0 (``prewarm -j N``) is honoured up to the memory cap (it may exceed
    the core count); 0 falls back to the ``jobs`` setting, capped by cores and memory
    (``default_jobs``).  The note says what was asked for and why it was lowered.
    """
    if requested <= 0:
        if settings is None:
            from .settings import get_settings

            settings = get_settings()
        jobs = default_jobs(settings)
        asked = settings.jobs
        if asked and jobs < min(asked, _cores()):
            return jobs, (f"jobs = {asked} (setting) capped to {jobs} by available memory "
                          f"({_gib(available_memory_bytes())} available, ~2 GiB per compiler process)")
        return jobs, None
    cap = memory_job_cap()
    if cap is not None and requested > cap:
        return cap, (f"-j {requested} capped to {cap} by available memory "
                     f"({_gib(available_memory_bytes())} available, ~2 GiB per compiler process)")
    return requested, None


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.1f} GiB"


def default_jobs(settings: Settings | None = None) -> int:
    """``jobs`` setting (0 = cores), capped by cores and available memory / 2 GiB, at least 1."""
    if settings is None:
        from .settings import get_settings

        settings = get_settings()
    cores = _cores()
    cap = cores
    memory_cap = memory_job_cap()
    if memory_cap is not None:
        cap = min(cap, memory_cap)
    wanted = settings.jobs or cores
    return max(1, min(wanted, cap))


def key_inputs(
    key: "VariantKey",
    family: "Family",
    tvm_ffi_version: str,
    flags: dict[str, list[str]],
    template_digest: str,
    headers_digest: str,
) -> dict[str, Any]:
    """Everything the content key hashes except the compiler versions (JSON-able)."""
    return {
        "recipe": ENGINE_RECIPE,
        "package": package_version(),
        "family": family.name,
        "sources": [list(pair) for pair in family.sources],
        "exports": list(family.exports),
        "params": [[name, value] for name, value in key.params],
        "target": key.target,
        "templates": template_digest,
        "headers": headers_digest,
        "flags": flags,
        "tvm_ffi": tvm_ffi_version,
    }


def _digest(inputs: dict[str, Any]) -> str:
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:KEY_LENGTH]


def input_digest(inputs: dict[str, Any]) -> str:
    """Digest of ``inputs`` without the compiler versions (names the ``current-*`` pointer)."""
    return _digest({k: v for k, v in inputs.items() if k != "toolchain"})


def content_key(inputs: dict[str, Any], toolchain_fingerprint: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The content key of ``key_inputs`` plus the compiler fingerprint, and the full inputs."""
    full = dict(inputs, toolchain=toolchain_fingerprint)
    return _digest(full), full


def compute_key(
    key: "VariantKey",
    family: "Family",
    toolchain: "Toolchain",
    tvm_ffi_version: str,
    flags: dict[str, list[str]],
    template_digest: str,
    headers_digest: str,
) -> tuple[str, dict[str, Any]]:
    """The content key of ``key`` and the JSON-able inputs it was computed from."""
    return content_key(key_inputs(key, family, tvm_ffi_version, flags, template_digest, headers_digest),
                       toolchain.fingerprint())


@dataclass(frozen=True)
class Layout:
    """Paths of one variant in the cache."""

    root: Path
    version_dir: Path
    module_dir: Path
    leaf: Path
    module_name: str
    key: str

    @staticmethod
    def module_dir_of(root: Path, variant: "VariantKey") -> Path:
        """The directory holding every entry of ``variant`` under ``root``."""
        from .variant import target_tag

        return root / package_version() / target_tag(variant.target) / variant.module_name

    @staticmethod
    def of(root: Path, variant: "VariantKey", content_key: str) -> "Layout":
        """Where ``variant`` with content key ``content_key`` lives under ``root``."""
        module_dir = Layout.module_dir_of(root, variant)
        return Layout(root, module_dir.parent.parent, module_dir, module_dir / content_key, variant.module_name,
                      content_key)

    @property
    def library(self) -> Path:
        """The published shared library."""
        return self.leaf / f"{self.module_name}.so"

    @property
    def sidecar(self) -> Path:
        """Records the file identity whose sha256 was last checked (``<module>.so.verified``)."""
        return self.leaf / f"{self.module_name}.so.verified"

    @property
    def manifest(self) -> Path:
        """The published ``variant.json``."""
        return self.leaf / "variant.json"

    @property
    def lock(self) -> Path:
        """The per-variant build lock."""
        return self.module_dir / f"{self.key}.lock"

    @property
    def failed_dir(self) -> Path:
        """Where the last failed build of this key is kept."""
        return self.module_dir / f"{self.key}.failed"

    def new_staging(self) -> Path:
        """A fresh private staging directory name (not created)."""
        return self.module_dir / f".staging-{self.key}-{os.urandom(6).hex()}"

    def stale_stagings(self) -> list[Path]:
        """Staging directories of this key (left by killed builds; call under the lock)."""
        return sorted(self.module_dir.glob(f".staging-{self.key}-*"))


POINTER_PREFIX = "current-"


def pointer_path(module_dir: Path, digest: str) -> Path:
    """``<module_dir>/current-<input digest>``: names the key last published for those inputs."""
    return module_dir / f"{POINTER_PREFIX}{digest}"


def read_pointer(path: Path) -> str | None:
    """The key a pointer names, or None (absent, unreadable or malformed)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None
    return text if len(text) == KEY_LENGTH and all(c in "0123456789abcdef" for c in text) else None


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` through a unique temporary file and a rename; False on failure
    (read-only cache)."""
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
    return True


def file_identity(st: os.stat_result) -> dict[str, int]:
    """What a ``.verified`` sidecar records about a library: a rewrite in place changes mtime and ctime
    (ctime cannot be set back), a replacement changes the inode."""
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def ensure_root(root: Path) -> None:
    """Create ``root`` with its ``CACHEDIR.TAG`` (raises ``OSError`` when not writable)."""
    root.mkdir(parents=True, exist_ok=True)
    tag = root / CACHEDIR_TAG
    if not tag.exists():
        tmp = root / f".{CACHEDIR_TAG}.{os.urandom(8).hex()}.tmp"  # unique per thread and process
        tmp.write_text(_TAG_TEXT, encoding="ascii")
        os.replace(tmp, tag)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's content."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(leaf: Path) -> dict[str, Any] | None:
    """``variant.json`` of an entry, or None when absent/unreadable."""
    try:
        with open(leaf / "variant.json", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_tree(path: Path) -> None:
    """Remove a directory by first renaming it aside (so it vanishes atomically for readers)."""
    if not path.exists():
        return
    trash = path.parent / f".trash-{os.urandom(6).hex()}"
    try:
        os.rename(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def touch(path: Path) -> None:
    """Mark an entry as recently used (best effort; read-only caches are fine)."""
    try:
        os.utime(path)
    except OSError:
        pass
