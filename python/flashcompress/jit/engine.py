"""Load a variant: in-process memo -> lock-free cache lookup -> locked build -> atomic publish.

``acquire(key)`` is the whole algorithm; ``load`` and ``get_module`` are its
memoised front doors (``flashcompress.jit`` re-exports them)::

    memo hit                   dict lookup, nothing else
    cache hit (no lock)        digests + manifest + size check of the .so + dlopen + export check
    miss                       offline? -> capturing? -> writable? -> per-variant file lock
                               -> look again (another process may have built it)
                               -> render into .staging-*, compile, link, dlopen, check exports
                               -> write variant.json -> os.rename(staging, leaf) -> size cap

A corrupt entry (manifest mismatch, dlopen failure, missing export) is warned
about (``CacheCorruptionWarning``), removed under the lock and rebuilt.  A killed
build leaves only a ``.staging-*`` directory, which no reader ever looks at.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import flags as _flags
from .cache import Layout, compute_key, ensure_root, file_sha256, package_version, read_manifest, remove_tree, touch
from .errors import (BuildError, CacheCorruptionWarning, CacheNotWritable, CaptureBuildError, LockTimeout,
                     OfflineCacheMiss)
from .family import Family, get_family, on_reregister, provider_module, FAMILY_PACKAGES
from .render import kernel_include_dir, render_sources, template_digest, tree_digest
from .settings import Settings, get_settings, on_reload
from .toolchain import Toolchain, get_toolchain, tvm_ffi_info
from .variant import VariantKey, target_arch

__all__ = ["Acquired", "Resolved", "acquire", "clear_memo", "get_module", "load", "loaded", "lookup",
           "prewarm_command", "resolve", "verify_entry"]

log = logging.getLogger("flashcompress.jit")

_MEMO: dict[VariantKey, Any] = {}
_GET_MEMO: dict[tuple[Any, ...], Any] = {}
_KEY_LOCKS: dict[VariantKey, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
_FORCED: set[VariantKey] = set()
_PATHS: dict[VariantKey, Path] = {}  # published entry of each loaded key


def clear_memo(family: str | None = None) -> None:
    """Forget loaded modules (all, or one family's); the next call looks in the cache again."""
    if family is None:
        _MEMO.clear()
        _GET_MEMO.clear()
        _FORCED.clear()
        _PATHS.clear()
        return
    for key in [k for k in _MEMO if k.family == family]:
        _MEMO.pop(key, None)
        _PATHS.pop(key, None)
    for memo_key in [k for k in _GET_MEMO if k[0] == family]:
        _GET_MEMO.pop(memo_key, None)


on_reregister(clear_memo)
on_reload(clear_memo)


def loaded() -> dict[VariantKey, Any]:
    """The modules this process has loaded, by key."""
    return dict(_MEMO)


def get_module(family: str, **params: Any) -> Any:
    """``load(VariantKey.make(family, **params))``, memoised on ``(family, params)``.

    The cached path is one tuple build and one dict lookup.
    """
    memo_key = (family, tuple(params.items()))
    try:
        return _GET_MEMO[memo_key]
    except KeyError:
        pass
    module = load(VariantKey.make(family, **params))
    _GET_MEMO[memo_key] = module
    return module


def load(key: VariantKey) -> Any:
    """The loaded ``tvm_ffi.Module`` of ``key``, building it on a cache miss."""
    module = _MEMO.get(key)
    if module is not None:
        return module
    return acquire(key).module


@dataclass(frozen=True)
class Resolved:
    """Everything needed to decide hit or miss for one variant, computed without compiling."""

    key: VariantKey
    family: Family
    settings: Settings
    toolchain: Toolchain
    tvm_version: str
    flags: dict[str, list[str]]
    inputs: dict[str, Any]
    layout: Layout


def resolve(key: VariantKey) -> Resolved:
    """Compute the content key and the cache paths of ``key``."""
    family = get_family(key.family)
    family.check_params(dict(key.params))
    settings = get_settings()
    toolchain = get_toolchain(key.backend, settings.cache_dir)
    import tvm_ffi

    tvm_version = str(tvm_ffi.__version__)
    flags = _flags.logical_flags(family, key)
    content_key, inputs = compute_key(key, family, toolchain, tvm_version, flags,
                                      template_digest(family.sources), tree_digest())
    return Resolved(key, family, settings, toolchain, tvm_version, flags, inputs,
                    Layout.of(settings.cache_dir, key, content_key))


@dataclass(frozen=True)
class Acquired:
    """The outcome of ``acquire``: the module and how it was obtained."""

    key: VariantKey
    module: Any
    status: str  # "memo" | "hit" | "waited" (hit after another process built it) | "built" | "rebuilt"
    seconds: float
    path: Path  # the published entry directory


def prewarm_command(key: VariantKey) -> str:
    """The shell command that builds ``key`` ahead of time."""
    parts = ["flashcompress", "prewarm"]
    provider = provider_module(key.family)
    if provider and not any(provider.startswith(p + ".") for p in FAMILY_PACKAGES):
        parts += ["--import", provider]
    parts += ["--arch", key.target, f"'{key.spec()}'"]
    return " ".join(parts)


def _key_lock(key: VariantKey) -> threading.Lock:
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.get(key)
        if lock is None:
            lock = _KEY_LOCKS[key] = threading.Lock()
        return lock


def _configure_logging(settings: Settings) -> None:
    if settings.verbose and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[flashcompress.jit] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def acquire(key: VariantKey, *, force: bool | None = None) -> Acquired:
    """Load ``key`` from the memo or the cache, or build and publish it.

    ``force=True`` rebuilds even if a valid entry exists (``force_rebuild`` setting:
    once per variant per process).
    """
    start = time.perf_counter()
    module = _MEMO.get(key)
    if module is not None and not force:
        return Acquired(key, module, "memo", 0.0, _PATHS.get(key, Path()))
    with _key_lock(key):
        module = _MEMO.get(key)
        if module is not None and not force:
            return Acquired(key, module, "memo", 0.0, _PATHS.get(key, Path()))
        res = resolve(key)
        _configure_logging(res.settings)
        if force is None:
            force = res.settings.force_rebuild and key not in _FORCED
        status = "hit"
        problem = None
        if not force:
            module, problem = _try_load(res)
            if module is not None:
                log.info("hit %s at %s", key.describe(), res.layout.leaf)
                touch(res.layout.leaf)
        if module is None:
            module, status = _build_locked(res, force=bool(force), known_problem=problem)
            if force:
                _FORCED.add(key)
        _PATHS[key] = res.layout.leaf
        _MEMO[key] = module
        return Acquired(key, module, status, time.perf_counter() - start, res.layout.leaf)


def _try_load(res: Resolved, *, verify_sha: bool = False) -> tuple[Any | None, str | None]:
    """Load the published entry. Returns ``(module, None)``, ``(None, None)`` on a miss,
    or ``(None, problem)`` when the entry exists but is unusable.

    The hit path checks the manifest, the library's size (a truncated copy), dlopen and the
    exports; hashing the whole library (``verify_sha``, done by ``cache verify``) would cost
    milliseconds per first load for a 2 MB module."""
    layout = res.layout
    if not layout.leaf.is_dir():
        return None, None
    manifest = read_manifest(layout.leaf)
    if manifest is None:
        return (None, "variant.json is missing or unreadable") if layout.leaf.is_dir() else (None, None)
    lib_info = manifest.get("library", {})
    try:
        size = layout.library.stat().st_size
    except FileNotFoundError:
        return (None, f"{layout.library.name} is missing") if layout.leaf.is_dir() else (None, None)
    if size != lib_info.get("size"):
        return None, f"{layout.library.name} has {size} bytes, the manifest says {lib_info.get('size')} (truncated?)"
    if verify_sha and file_sha256(layout.library) != lib_info.get("sha256"):
        return None, f"{layout.library.name} does not match the sha256 in variant.json"
    import tvm_ffi

    try:
        module = tvm_ffi.load_module(str(layout.library))
    except Exception as exc:  # noqa: BLE001 - any loader failure means "unusable"
        if not layout.library.exists():
            return None, None  # evicted between the check and the load: a plain miss
        return None, f"failed to load: {exc}"
    missing = [name for name in res.family.exports if not module.implements_function(name)]
    if missing:
        return None, f"exports {missing} are missing"
    return module, None


def _is_capturing() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA runtime
        return False


def _ensure_writable(res: Resolved) -> None:
    layout = res.layout
    try:
        ensure_root(layout.root)
        layout.module_dir.mkdir(parents=True, exist_ok=True)
        probe = layout.module_dir / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        where = Path(exc.filename) if exc.filename else layout.module_dir
        if where.name.startswith("."):  # our probe or temp file: name the directory instead
            where = where.parent
        raise CacheNotWritable(res.key.describe(), where, exc.strerror or str(exc),
                               res.settings.how_to_set("cache_dir")) from None


def _build_locked(res: Resolved, *, force: bool, known_problem: str | None) -> tuple[Any, str]:
    settings, key, layout = res.settings, res.key, res.layout
    if settings.offline:
        raise OfflineCacheMiss(key.describe(), layout.leaf, prewarm_command(key))
    if _is_capturing():
        raise CaptureBuildError(key.describe(), prewarm_command(key))
    _ensure_writable(res)
    import filelock

    lock = filelock.FileLock(str(layout.lock), timeout=settings.lock_timeout_s)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise LockTimeout(key.describe(), layout.lock, settings.lock_timeout_s) from None
    try:
        corrupt = False
        if not force:
            module, problem = _try_load(res)
            if module is not None:
                log.info("hit after waiting %s", key.describe())
                return module, "waited"
            if problem is not None:
                warnings.warn(f"flashcompress: cached JIT variant {key.describe()} at {layout.leaf} is corrupt "
                              f"({problem}); removing and rebuilding it", CacheCorruptionWarning, stacklevel=4)
            corrupt = problem is not None
        for stale in layout.stale_stagings():
            remove_tree(stale)  # a killed build of this key; we hold its lock
        module = _build_and_publish(res, replace_existing=force or corrupt)
        return module, ("rebuilt" if (force or known_problem or corrupt) else "built")
    finally:
        lock.release()


def _build_and_publish(res: Resolved, *, replace_existing: bool) -> Any:
    from . import build as _build  # the build machinery is imported only when something is built

    key, family, layout, settings = res.key, res.family, res.layout, res.settings
    log.info("building %s into %s", key.describe(), layout.leaf)
    started = time.perf_counter()
    sources = render_sources(key, family)
    staging = layout.new_staging()
    staging.mkdir()
    try:
        for name, text in sources.items():
            (staging / name).write_text(text, encoding="utf-8")
        stages = _build.plan_steps(key, family, res.toolchain, tvm_ffi_info(), list(sources), kernel_include_dir(),
                                   layout.library.name, layout.leaf)
        log_path = staging / "build.log"
        log_path.write_text(f"# {key.describe()}  key {layout.key}\n# started {_now()}\n\n", encoding="utf-8")
        (staging / "build.sh").write_text(
            "#!/bin/sh\n# Reproduce this build (run inside this directory)\nset -ex\n"
            + "".join(" & \\\n".join(s.command for s in stage) + ("\nwait\n" if len(stage) > 1 else "\n")
                      for stage in stages), encoding="utf-8")
        try:
            timings = _build.run_steps(stages, staging, log_path, verbose=settings.verbose)
        except _build.StepFailed as failure:
            _keep_failed(staging, layout)
            raise BuildError(key.describe(), failure.step.command, _build.first_error_lines(failure.output),
                             layout.failed_dir / "build.log", failure.returncode) from None
        import tvm_ffi

        library = staging / layout.library.name
        try:
            module = tvm_ffi.load_module(str(library))
        except Exception as exc:  # noqa: BLE001
            _append(log_path, f"# loading {library.name} failed: {exc}\n")
            _keep_failed(staging, layout)
            raise BuildError(key.describe(), f"tvm_ffi.load_module({library.name!r})", [str(exc)],
                             layout.failed_dir / "build.log") from None
        missing = [name for name in family.exports if not module.implements_function(name)]
        if missing:
            _append(log_path, f"# missing exports: {missing}\n")
            _keep_failed(staging, layout)
            raise BuildError(key.describe(), "export check", [f"module does not export {missing} "
                             f"(declared in Family.exports; use TVM_FFI_DLL_EXPORT_TYPED_FUNC)"],
                             layout.failed_dir / "build.log")
        seconds = time.perf_counter() - started
        manifest = {
            "family": key.family,
            "params": dict(key.params),
            "target": key.target,
            "target_arch": target_arch(key.target),
            "module_name": key.module_name,
            "key": layout.key,
            "package_version": package_version(),
            "exports": list(family.exports),
            "library": {"name": library.name, "size": library.stat().st_size, "sha256": file_sha256(library)},
            "key_inputs": res.inputs,
            "build": {"seconds": round(seconds, 3), "steps": [[label, round(t, 3)] for label, t in timings],
                      "finished": _now(), "host": os.uname().nodename, "pid": os.getpid()},
        }
        for obj in staging.glob("*.o"):
            obj.unlink()  # objects are not needed once linked
        tmp = staging / ".variant.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, staging / "variant.json")
        _append(log_path, f"# finished {_now()} in {seconds:.2f} s\n")
        if replace_existing and layout.leaf.exists():
            remove_tree(layout.leaf)
        try:
            os.rename(staging, layout.leaf)
        except OSError as exc:
            if not layout.manifest.is_file():
                raise CacheNotWritable(key.describe(), layout.module_dir, f"publishing failed: {exc}",
                                       settings.how_to_set("cache_dir")) from None
            # Another builder published the same key first (locks are only best effort, e.g. on NFS):
            # keep theirs; our module is already loaded and identical in content.
            log.info("entry %s appeared during the build; keeping the existing one", layout.leaf)
        if layout.failed_dir.exists():
            remove_tree(layout.failed_dir)
        log.info("built %s in %.2f s", key.describe(), seconds)
    finally:
        if staging.exists():
            remove_tree(staging)
    cap = settings.size_cap_mb * 1024 * 1024
    if cap:
        from .maintenance import enforce_size_cap

        for path in enforce_size_cap(layout.root, cap, keep=layout.leaf):
            log.info("size cap: evicted %s", path)
    return module


def _keep_failed(staging: Path, layout: Layout) -> None:
    remove_tree(layout.failed_dir)
    try:
        os.rename(staging, layout.failed_dir)
    except OSError:
        pass


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def lookup(key: VariantKey) -> tuple[Path, bool]:
    """The entry directory of ``key`` and whether a published entry exists there (no loading)."""
    res = resolve(key)
    return res.layout.leaf, res.layout.manifest.is_file() and res.layout.library.is_file()


def verify_entry(leaf: Path) -> tuple[bool, str]:
    """Check a published entry: manifest, size, sha256, dlopen and exports. ``(ok, message)``."""
    manifest = read_manifest(leaf)
    if manifest is None:
        return False, "variant.json missing or unreadable"
    lib = leaf / manifest.get("library", {}).get("name", "")
    if not lib.is_file():
        return False, f"{lib.name} missing"
    if lib.stat().st_size != manifest["library"].get("size"):
        return False, f"{lib.name}: size {lib.stat().st_size} != manifest {manifest['library'].get('size')}"
    if file_sha256(lib) != manifest["library"].get("sha256"):
        return False, f"{lib.name}: sha256 mismatch"
    import tvm_ffi

    try:
        module = tvm_ffi.load_module(str(lib))
    except Exception as exc:  # noqa: BLE001
        return False, f"load failed: {exc}"
    missing = [name for name in manifest.get("exports", []) if not module.implements_function(name)]
    if missing:
        return False, f"missing exports {missing}"
    return True, "ok"

