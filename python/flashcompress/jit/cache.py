"""The on-disk cache: layout, content keys, manifests, scanning, eviction.

Layout (``<root>`` = the ``cache_dir`` setting)::

    <root>/CACHEDIR.TAG                        marks the tree as a cache (backup tools skip it; `clean` requires it)
    <root>/.toolchain/<id>.txt                 memoised `--version` outputs (see toolchain.py)
    <root>/<pkg-version>/<target-tag>/<module_name>/
        <key>/                                 a published entry (complete or absent: renamed into place)
            <module_name>.so  kernel.cu  binding.cpp  variant.json  build.log
        <key>.lock                             per-variant build lock (builders only; never deleted while in use)
        .staging-<key>-<rand>/                 a build in progress (or killed: swept by the next builder)
        <key>.failed/                          sources + build.log of the last failed build of <key>
        .trash-<rand>/                         an entry being removed

The key is a sha256 prefix over the rendering inputs (family template files and
what they include, parameters, target), the content of every header under
``jit_kernel/``, all flags, the device and host compiler ``--version`` outputs,
the tvm-ffi version, the package version and the engine's recipe version.  No
absolute path and no mtime enters it.  Version and target appear in the path
for humans and ``du``; the key alone decides.
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
    "compute_key",
    "default_jobs",
    "ensure_root",
    "file_sha256",
    "package_version",
    "read_manifest",
    "remove_tree",
    "touch",
]

# Bump when the build procedure changes in a way the hashed inputs do not capture.
ENGINE_RECIPE = 1
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


def default_jobs(settings: Settings | None = None) -> int:
    """``jobs`` setting (0 = cores), capped by cores and available memory / 2 GiB, at least 1."""
    if settings is None:
        from .settings import get_settings

        settings = get_settings()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    cap = cores
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    cap = min(cap, int(line.split()[1]) // (2 * 1024 * 1024))
                    break
    except OSError:
        pass
    wanted = settings.jobs or cores
    return max(1, min(wanted, cap))


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
    inputs: dict[str, Any] = {
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
        "toolchain": toolchain.fingerprint(),
        "tvm_ffi": tvm_ffi_version,
    }
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:KEY_LENGTH], inputs


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
    def of(root: Path, variant: "VariantKey", content_key: str) -> "Layout":
        """Where ``variant`` with content key ``content_key`` lives under ``root``."""
        from .variant import target_tag

        version_dir = root / package_version()
        module_dir = version_dir / target_tag(variant.target) / variant.module_name
        return Layout(root, version_dir, module_dir, module_dir / content_key, variant.module_name, content_key)

    @property
    def library(self) -> Path:
        """The published shared library."""
        return self.leaf / f"{self.module_name}.so"

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
