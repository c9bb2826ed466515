"""Cache maintenance behind ``flashcompress cache info|list|verify|clean``.

Classification of what ``cache.scan`` finds under the cache root:

  current        an entry this installation loads today (its input digest is current and,
                 where the compilers can be probed, so is its toolchain digest)
  stale          an entry of this package version that is no longer current (a header,
                 template, flag or compiler changed), or whose params the family now rejects
  other-version  an entry built by another flashcompress version
  unknown        an entry of this version whose family is not registered
  failed         the kept sources and log of a failed build
  staging        debris of a killed build (older than an hour); ``building``: younger
  trash          a removal interrupted half-way

``clean --stale`` removes stale, other-version, failed, trash and old staging
directories (never current or unknown entries); ``clean`` removes everything
below a root that carries flashcompress's ``CACHEDIR.TAG``.  Imports the engine
(never the reverse).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from .cache import (CACHEDIR_TAG, STALE_STAGING_SECONDS, Entry, file_sha256, package_version, read_manifest,
                    remove_tree, scan, tree_size)
from .engine import load_checked, resolve
from .errors import UnknownFamily
from .family import get_family
from .variant import VariantKey

__all__ = ["Classified", "classify", "clean", "verify", "verify_entry"]

REMOVABLE_WHEN_STALE = frozenset({"stale", "other-version", "failed", "staging", "trash"})


@dataclass(frozen=True)
class Classified:
    """A scanned item and its status."""

    entry: Entry
    status: str
    variant: str  # ``family(k=v, ...) @ target`` (from the manifest) or the module name


def _variant(manifest: dict | None) -> tuple[VariantKey | None, str, bool]:
    """``(key or None, description, rejected)`` of an entry's manifest; ``rejected`` when the family
    rejects its params now.  Params come in the family's declared order, as ``prewarm`` prints them."""
    if not manifest:
        return None, "", False
    name, target = str(manifest.get("family", "?")), str(manifest.get("target", "?"))
    params = manifest.get("params") if isinstance(manifest.get("params"), dict) else {}
    raw = VariantKey(name, tuple(sorted(params.items())), target)
    try:
        key = get_family(name).key(target, **params)
    except (UnknownFamily, ImportError):
        return None, raw.describe(), False
    except ValueError:
        return raw, raw.describe(), True
    return key, key.describe(), False


def _status(entry: Entry, check_current: bool) -> str:
    if entry.version != package_version():
        return "other-version"
    if entry.manifest is None:
        return "stale"  # no manifest: never loadable
    key, _, rejected = _variant(entry.manifest)
    if not check_current:
        return "current"
    if key is None:
        return "unknown"
    if rejected:
        return "stale"
    try:
        res = resolve(key)
    except (UnknownFamily, FileNotFoundError, RuntimeError):
        return "unknown"
    if entry.path.parent != res.input_dir:
        return "stale"
    return "current" if res.layout is None or res.layout.leaf == entry.path else "stale"


def classify(root: Path, *, check_current: bool = True) -> list[Classified]:
    """Scan ``root`` and classify every item (locks excluded)."""
    now = time.time()
    out = []
    for entry in scan(root):
        if entry.kind == "lock":
            continue
        variant = _variant(entry.manifest)[1] or entry.module_name
        if entry.kind == "entry":
            status = _status(entry, check_current)
        elif entry.kind == "staging":
            status = "staging" if now - entry.mtime > STALE_STAGING_SECONDS else "building"
        else:
            status = entry.kind
        out.append(Classified(entry, status, variant))
    return out


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
        for item in classify(root):
            if item.status in REMOVABLE_WHEN_STALE:
                remove_tree(item.entry.path)
                removed.append(item.entry.path)
                freed += item.entry.size
                if item.status in ("stale", "other-version"):
                    item.entry.path.with_name(item.entry.path.name + ".lock").unlink(missing_ok=True)
        for version_dir in [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]:
            for dirpath, _, _ in sorted(os.walk(version_dir), key=lambda item: -len(item[0])):
                try:
                    os.rmdir(dirpath)  # only succeeds when empty
                except OSError:
                    pass
        return removed, freed
    for child in sorted(root.iterdir()):
        if child.name == CACHEDIR_TAG:
            continue
        if child.is_dir():
            size = tree_size(child)
            remove_tree(child)
        else:
            size = child.stat().st_size
            child.unlink(missing_ok=True)
        removed.append(child)
        freed += size
    return removed, freed


def verify_entry(leaf: Path) -> tuple[bool, str]:
    """Check a published entry: manifest, size, sha256, dlopen and exports. ``(ok, message)``."""
    manifest = read_manifest(leaf)
    if manifest is None:
        return False, "variant.json missing or unreadable"
    info = manifest.get("library", {})
    lib = leaf / info.get("name", "")
    if not lib.is_file():
        return False, f"{lib.name} missing"
    size = lib.stat().st_size
    if size != info.get("size"):
        return False, f"{lib.name}: size {size} != manifest {info.get('size')}"
    if file_sha256(lib) != info.get("sha256"):
        return False, f"{lib.name}: sha256 mismatch"
    _, problem = load_checked(lib, manifest.get("exports", []))
    return (False, problem) if problem else (True, "ok")


def verify(root: Path) -> list[tuple[Classified, bool, str]]:
    """Hash and load every published entry (all versions)."""
    return [(item, *verify_entry(item.entry.path)) for item in classify(root, check_current=False)
            if item.entry.kind == "entry"]
