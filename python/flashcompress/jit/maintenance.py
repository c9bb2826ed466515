"""Cache maintenance behind ``flashcompress cache info|list|verify|clean``.

Classification of what ``scan`` (below) finds under the cache root:

  current        an entry whose content key is what this installation would build today
  stale          an entry of this package version that is no longer current (a header,
                 template, flag or compiler changed), or whose params the family now rejects
  other-version  an entry built by another flashcompress version
  unknown        an entry of this version whose family is not registered, or (no compiler to
                 compute the full key) that the variant's current-* pointer does not name
  failed         the kept sources and log of a failed build
  staging        a build in progress, or debris of a killed one (older than an hour)
  trash          a removal interrupted half-way

``clean --stale`` removes stale, other-version, failed, trash and old staging
directories (never current or unknown entries) and ``current-*`` pointers whose
entry is gone; ``clean`` removes everything below a root that carries
flashcompress's ``CACHEDIR.TAG``.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .cache import CACHEDIR_TAG, POINTER_PREFIX, package_version, read_manifest, read_pointer, remove_tree

__all__ = ["Classified", "Entry", "classify", "clean", "describe_manifest", "enforce_size_cap", "scan", "verify"]

STALE_STAGING_SECONDS = 3600.0


@dataclass(frozen=True)
class Classified:
    """A scanned item and its status."""

    entry: Entry
    status: str
    variant: str  # human description (from the manifest) or the module name


def describe_manifest(entry: Entry) -> str:
    """``family(k=v, ...) @ target`` from an entry's manifest, else its module name.

    Parameters come in the family's declared order, as ``prewarm`` prints them
    (``plan(ratio=4, online=False)``), when the family can be found; else sorted by name.
    """
    manifest = entry.manifest
    if not manifest:
        return entry.module_name
    from .errors import UnknownFamily
    from .family import get_family
    from .variant import VariantKey

    name = str(manifest.get("family", "?"))
    params = manifest.get("params", {})
    params = params if isinstance(params, dict) else {}
    try:
        get_family(name)  # registers it (imports its module), so describe() knows the declared order
    except (UnknownFamily, ValueError, ImportError):
        pass
    return VariantKey(name, tuple(sorted(params.items())), str(manifest.get("target", "?"))).describe()


def _current_key(manifest: dict) -> str | None:
    """The content key this installation computes for the manifest's variant; None if unknown."""
    from .engine import resolve
    from .errors import UnknownFamily
    from .variant import VariantKey

    try:
        key = VariantKey(manifest["family"], tuple(sorted(manifest["params"].items())), manifest["target"])
        res = resolve(key)
    except (KeyError, UnknownFamily, FileNotFoundError, RuntimeError):
        return None
    except ValueError:
        return ""  # the family rejects these params now: stale
    if res.toolchain is None:
        # No compiler, so no full key: the entry the pointer names is current; others are unknown.
        return res.layout.key if res.layout is not None and res.layout.key == manifest.get("key") else None
    return res.layout.key if res.layout is not None else None


def classify(root: Path, *, check_current: bool = True) -> list[Classified]:
    """Scan ``root`` and classify every item (locks excluded)."""
    now = time.time()
    version = package_version()
    out: list[Classified] = []
    for entry in scan(root):
        if entry.kind == "lock":
            continue
        variant = describe_manifest(entry)
        if entry.kind == "entry":
            if entry.version != version:
                status = "other-version"
            elif entry.manifest is None:
                status = "stale"  # no manifest: never loadable
            elif not check_current:
                status = "current"
            else:
                current = _current_key(entry.manifest)
                status = "unknown" if current is None else ("current" if current == entry.key else "stale")
        elif entry.kind == "staging":
            status = "staging" if now - entry.mtime > STALE_STAGING_SECONDS else "building"
        else:
            status = entry.kind
        out.append(Classified(entry, status, variant))
    return out


REMOVABLE_WHEN_STALE = frozenset({"stale", "other-version", "failed", "staging", "trash"})


def clean(root: Path, *, stale_only: bool) -> tuple[list[Path], int]:
    """Remove stale items (``stale_only``) or the whole cache content. Returns (removed paths, bytes)."""
    if not root.is_dir():
        return [], 0
    if not (root / CACHEDIR_TAG).is_file():
        raise RuntimeError(f"{root} has no {CACHEDIR_TAG}; refusing to delete a directory flashcompress "
                           f"did not create (check FLASHCOMPRESS_CACHE_DIR)")
    removed: list[Path] = []
    freed = 0
    if stale_only:
        stale_keys: set[tuple[Path, str]] = set()
        for item in classify(root):
            if item.status in REMOVABLE_WHEN_STALE:
                remove_tree(item.entry.path)
                removed.append(item.entry.path)
                freed += item.entry.size
                if item.status in ("stale", "other-version"):
                    stale_keys.add((item.entry.path.parent, item.entry.key))
        for entry in scan(root, sizes=False):
            if entry.kind == "lock" and (entry.path.parent, entry.key) in stale_keys:
                entry.path.unlink(missing_ok=True)
        _prune_pointers(root)  # bookkeeping files, not counted as items
        for version_dir in [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]:
            _prune_empty(version_dir)
        return removed, freed
    for child in sorted(root.iterdir()):
        if child.name == CACHEDIR_TAG:
            continue
        size = sum(e.stat().st_size for e in child.rglob("*") if e.is_file()) if child.is_dir() else child.stat().st_size
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
        removed.append(child)
        freed += size
    return removed, freed


def _prune_pointers(root: Path) -> list[Path]:
    """Remove ``current-*`` pointers whose entry no longer exists."""
    removed = []
    for pointer in root.glob(f"*/*/*/{POINTER_PREFIX}*"):
        key = read_pointer(pointer)
        if key is None or not (pointer.parent / key).is_dir():
            pointer.unlink(missing_ok=True)
            removed.append(pointer)
    return removed


def _prune_empty(directory: Path) -> None:
    for dirpath, _, _ in sorted(os.walk(directory), key=lambda item: -len(item[0])):
        try:
            os.rmdir(dirpath)  # only succeeds when empty
        except OSError:
            pass


def verify(root: Path) -> list[tuple[Classified, bool, str]]:
    """Load every published entry (all versions): manifest, size, sha256, dlopen, exports."""
    from .engine import verify_entry

    results = []
    for item in classify(root, check_current=False):
        if item.entry.kind != "entry":
            continue
        ok, message = verify_entry(item.entry.path)
        results.append((item, ok, message))
    return results


# --------------------------------------------------------------------------- scanning and the size cap


def _tree_size(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


@dataclass(frozen=True)
class Entry:
    """Something found under the cache root."""

    kind: str  # "entry" | "staging" | "failed" | "trash" | "lock"
    path: Path
    version: str
    target_tag: str
    module_name: str
    key: str
    size: int
    mtime: float
    manifest: dict[str, Any] | None

    @property
    def current_version(self) -> bool:
        """Built by this package version."""
        return self.version == package_version()


def scan(root: Path, *, sizes: bool = True) -> Iterator[Entry]:
    """Every entry, staging/failed/trash directory and lock under ``root``."""
    if not root.is_dir():
        return
    for version_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for tag_dir in sorted(p for p in version_dir.iterdir() if p.is_dir()):
            for module_dir in sorted(p for p in tag_dir.iterdir() if p.is_dir()):
                for child in sorted(module_dir.iterdir()):
                    name = child.name
                    if name.endswith(".lock") and child.is_file():
                        kind, key = "lock", name[: -len(".lock")]
                    elif not child.is_dir():
                        continue
                    elif name.startswith(".staging-"):
                        kind, key = "staging", name[len(".staging-"):].rsplit("-", 1)[0]
                    elif name.startswith(".trash-"):
                        kind, key = "trash", ""
                    elif name.endswith(".failed"):
                        kind, key = "failed", name[: -len(".failed")]
                    else:
                        kind, key = "entry", name
                    try:
                        mtime = child.stat().st_mtime
                    except OSError:
                        continue
                    size = (_tree_size(child) if child.is_dir() else child.stat().st_size) if sizes else 0
                    yield Entry(kind, child, version_dir.name, tag_dir.name, module_dir.name, key, size, mtime,
                                read_manifest(child) if kind == "entry" else None)


def enforce_size_cap(root: Path, cap_bytes: int, keep: Path | None = None) -> list[Path]:
    """Evict until the cache is under ``cap_bytes``: debris, other versions, then LRU entries.

    Returns the removed paths.  ``keep`` (the entry just built) is never removed.
    """
    if cap_bytes <= 0:
        return []
    items = [e for e in scan(root) if e.kind != "lock"]
    total = sum(e.size for e in items)
    if total <= cap_bytes:
        return []
    now = time.time()

    def rank(e: Entry) -> tuple[int, float]:
        if e.kind in ("trash", "failed") or (e.kind == "staging" and now - e.mtime > 3600):
            return (0, e.mtime)
        if e.kind == "entry" and not e.current_version:
            return (1, e.mtime)
        if e.kind == "entry":
            return (2, e.mtime)
        return (9, e.mtime)  # a live staging dir

    removed = []
    for entry in sorted(items, key=rank):
        if total <= cap_bytes:
            break
        if rank(entry)[0] == 9 or (keep is not None and entry.path == keep):
            continue
        remove_tree(entry.path)
        removed.append(entry.path)
        total -= entry.size
    return removed
