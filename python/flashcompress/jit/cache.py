"""The on-disk cache: layout, digests, manifests, scanning, the size cap, ``jobs()``.

Layout (``<root>`` = the ``cache_dir`` setting)::

    <root>/CACHEDIR.TAG                        marks the tree as a cache (backup tools skip it; `clean` requires it)
    <root>/.toolchain/<id>.txt                 memoised `--version` outputs (see toolchain.py)
    <root>/<pkg-version>/<target-tag>/<module_name>/<input digest>/
        <toolchain digest>/                    a published entry (complete or absent: renamed into place)
            <module_name>.so  kernel.cu  binding.cpp  variant.json  build.log  build.sh
        <toolchain digest>.lock                per-variant build lock (builders only)
        .staging-<toolchain digest>-<rand>/    a build in progress (or killed: swept by the next builder)
        <toolchain digest>.failed/             sources + build.log of the last failed build
        .trash-<rand>/                         an entry being removed

The *input digest* hashes everything that shapes the binary except the
compilers: the family's sources, exports and parameters, the target, every file
under ``templates/`` and ``jit_kernel/`` (an edit anywhere rebuilds every
variant), all flags, the tvm-ffi version, the package version and the engine
recipe.  The *toolchain digest* hashes the device and host compiler
``--version`` outputs.  No absolute path and no mtime enters either.  A machine
that cannot probe the compilers (a runtime image without the CUDA toolkit), or
an offline process whose compilers differ from the builder's, loads any entry
under its input digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

__all__ = ["CACHEDIR_TAG", "Entry", "Layout", "digest", "enforce_size_cap", "ensure_root", "file_sha256", "jobs",
           "package_version", "read_manifest", "remove_tree", "scan", "touch", "write_atomic"]

# Bump when the build procedure changes in a way the hashed inputs do not capture.
# 3: two-level entries <input digest>/<toolchain digest>; all of templates/ and jit_kernel/ hashed.
ENGINE_RECIPE = 3
DIGEST_LENGTH = 16
CACHEDIR_TAG = "CACHEDIR.TAG"
_TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
             "# This file is a cache directory tag created by flashcompress (JIT kernel cache).\n"
             "# For information about cache directory tags see https://bford.info/cachedir/\n")
STALE_STAGING_SECONDS = 3600.0
GIB = 1024 ** 3
BYTES_PER_JOB = 2 * GIB  # peak resident memory of one nvcc / g++ process on a plan-builder TU, rounded up


def package_version() -> str:
    """flashcompress's version."""
    import flashcompress

    return str(flashcompress.__version__)


def digest(inputs: Any) -> str:
    """sha256 prefix of a JSON-able value."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:DIGEST_LENGTH]


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (None when unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def jobs(requested: int = 0) -> tuple[int, str | None]:
    """Parallel compiler processes, and a note when available memory capped them.

    ``requested`` > 0 (``prewarm -j N``) is honoured up to the memory cap (~2 GiB per compiler);
    0 uses the ``jobs`` setting (0: the cores), capped by cores and memory.
    """
    from .settings import get_settings

    cores = cpu_cores()
    available = available_memory_bytes()
    memory_cap = None if available is None else max(1, available // BYTES_PER_JOB)
    asked, what = (requested, f"-j {requested}") if requested > 0 else (get_settings().jobs, None)
    wanted = asked if requested > 0 else min(asked or cores, cores)
    result = max(1, min(wanted, memory_cap or wanted))
    if asked and result < min(asked, wanted):
        gib = "unknown" if available is None else f"{available / GIB:.1f} GiB"
        return result, (f"{what or f'jobs = {asked} (setting)'} capped to {result} by available memory "
                        f"({gib} available, ~2 GiB per compiler process)")
    return result, None


@dataclass(frozen=True)
class Layout:
    """Paths of one variant entry in the cache."""

    root: Path
    module_name: str
    input_dir: Path  # <root>/<version>/<tag>/<module>/<input digest>
    toolchain_digest: str

    @property
    def leaf(self) -> Path:
        """The published entry directory."""
        return self.input_dir / self.toolchain_digest

    @property
    def key(self) -> str:
        """``<input digest>/<toolchain digest>``: names the entry."""
        return f"{self.input_dir.name}/{self.toolchain_digest}"

    @property
    def library(self) -> Path:
        return self.leaf / f"{self.module_name}.so"

    @property
    def manifest(self) -> Path:
        return self.leaf / "variant.json"

    @property
    def lock(self) -> Path:
        return self.input_dir / f"{self.toolchain_digest}.lock"

    @property
    def failed_dir(self) -> Path:
        return self.input_dir / f"{self.toolchain_digest}.failed"

    def new_staging(self) -> Path:
        """A fresh private staging directory name (not created)."""
        return self.input_dir / f".staging-{self.toolchain_digest}-{os.urandom(6).hex()}"

    def stale_stagings(self) -> list[Path]:
        """Staging directories of this entry (left by killed builds; call under the lock)."""
        return sorted(self.input_dir.glob(f".staging-{self.toolchain_digest}-*"))


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` through a unique temporary file and a rename; False on failure (read-only cache)."""
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
    return True


def ensure_root(root: Path) -> None:
    """Create ``root`` with its ``CACHEDIR.TAG`` (raises ``OSError`` when not writable)."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / CACHEDIR_TAG).exists():
        tmp = root / f".{CACHEDIR_TAG}.{os.urandom(8).hex()}.tmp"  # unique per thread and process
        tmp.write_text(_TAG_TEXT, encoding="ascii")
        os.replace(tmp, root / CACHEDIR_TAG)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


# --------------------------------------------------------------------------- scanning and the size cap


@dataclass(frozen=True)
class Entry:
    """Something found under the cache root."""

    kind: str  # "entry" | "staging" | "failed" | "trash" | "lock"
    path: Path
    version: str
    target_tag: str
    module_name: str
    key: str  # "<input digest>/<toolchain digest>" ("" for trash)
    size: int
    mtime: float
    manifest: dict[str, Any] | None


def tree_size(path: Path) -> int:
    """Bytes of every file below ``path``."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def _kind(child: Path) -> tuple[str, str] | None:
    name = child.name
    if name.endswith(".lock"):
        return "lock", name[:-5]
    if not child.is_dir():
        return None
    if name.startswith(".staging-"):
        return "staging", name[9:].rsplit("-", 1)[0]
    if name.startswith(".trash-"):
        return "trash", ""
    if name.endswith(".failed"):
        return "failed", name[:-7]
    return "entry", name


def scan(root: Path, *, sizes: bool = True) -> Iterator[Entry]:
    """Every entry, staging/failed/trash directory and lock under ``root``."""
    def dirs(path: Path) -> list[Path]:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))

    if not root.is_dir():
        return
    for version_dir in dirs(root):
        for tag_dir in dirs(version_dir):
            for module_dir in dirs(tag_dir):
                for parent in [module_dir, *dirs(module_dir)]:  # trash may sit at either level
                    for child in sorted(parent.iterdir()):
                        found = _kind(child)
                        if found is None or (parent is module_dir and found[0] not in ("trash",)):
                            continue
                        kind, tc = found
                        try:
                            mtime = child.stat().st_mtime
                            size = (tree_size(child) if child.is_dir() else child.stat().st_size) if sizes else 0
                        except OSError:
                            continue
                        yield Entry(kind, child, version_dir.name, tag_dir.name, module_dir.name,
                                    f"{parent.name}/{tc}" if tc else "", size, mtime,
                                    read_manifest(child) if kind == "entry" else None)


def enforce_size_cap(root: Path, cap_bytes: int, keep: Path | None = None) -> list[Path]:
    """Evict until the cache is under ``cap_bytes``: debris, other versions, then LRU entries.

    Returns the removed paths.  ``keep`` (the entry just built) is never removed.
    """
    if cap_bytes <= 0:
        return []
    items = [e for e in scan(root) if e.kind != "lock"]
    total = sum(e.size for e in items)
    now, version = time.time(), package_version()

    def rank(e: Entry) -> tuple[int, float]:
        if e.kind in ("trash", "failed") or (e.kind == "staging" and now - e.mtime > STALE_STAGING_SECONDS):
            return (0, e.mtime)
        if e.kind == "entry":
            return (1 if e.version != version else 2, e.mtime)
        return (9, e.mtime)  # a live staging dir

    removed = []
    for entry in sorted(items, key=rank):
        if total <= cap_bytes:
            break
        if rank(entry)[0] == 9 or entry.path == keep:
            continue
        remove_tree(entry.path)
        removed.append(entry.path)
        total -= entry.size
    return removed
