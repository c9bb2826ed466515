"""Load a variant: in-process memo -> lock-free cache lookup -> locked build -> atomic publish.

``acquire(key)`` is the whole algorithm; ``load`` and ``get_module`` are its
memoised front doors (``flashcompress.jit`` re-exports them)::

    memo hit            one dict lookup
    cache hit (no lock) digests + manifest + library size + dlopen + export check
    miss                offline or no compiler? -> error naming the prewarm command
                        -> capturing? -> writable? -> per-variant file lock
                        -> look again (another process may have built it)
                        -> compile into .staging-* -> load + export check -> manifest
                        -> os.rename(staging, entry) -> size cap

Entries and which of them load without a compiler: cache.py.  A miss that cannot
be built raises ``ToolchainMissing`` (no compiler) or ``OfflineCacheMiss``.

A damaged entry (manifest missing or not matching, library truncated, dlopen
failure, missing export) is warned about (``CacheCorruptionWarning``), removed
under the lock and rebuilt.  Same-size corruption that still loads is left to
``flashcompress cache verify`` (sha256), as other JIT caches do.  A killed
build leaves only a ``.staging-*`` directory, which no reader looks at.
"""

from __future__ import annotations

import functools

import json
import logging
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .cache import (ENGINE_RECIPE, Layout, digest, ensure_root, enforce_size_cap, file_sha256, package_version, read_manifest,
                    remove_tree, touch)
from .errors import (BuildError, CacheCorruptionWarning, CacheNotWritable, CaptureBuildError, LockTimeout,
                     OfflineCacheMiss, ToolchainMissing)
from .family import Family, clear_module_memos, get_family, make_key
from .flags import logical_flags
from .render import kernel_include_dir, render_sources, sources_digest
from .settings import Settings, get_settings, on_reload
from .toolchain import Toolchain, ToolchainUnavailable, get_toolchain, tvm_ffi_info
from .variant import VariantKey, target_arch, target_tag

__all__ = ["Acquired", "Resolved", "acquire", "clear_memo", "get_module", "load", "lookup", "prewarm_command",
           "resolve"]

log = logging.getLogger("flashcompress.jit")

# One memo: VariantKey -> Acquired (load/acquire), (family, params items) -> module (get_module).
_MEMO: dict[Any, Any] = {}
_KEY_LOCKS: dict[VariantKey, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
_FORCED: set[VariantKey] = set()


def clear_memo(family: str | None = None) -> None:
    """Forget loaded modules (all, or one family's; the op modules' memos always); the next call
    looks in the cache again."""
    clear_module_memos()
    for k in list(_MEMO):
        if family is None or (k.family if isinstance(k, VariantKey) else k[0]) == family:
            _MEMO.pop(k, None)
    if family is None:
        _FORCED.clear()


on_reload(clear_memo)


def get_module(family: str, **params: Any) -> Any:
    """``load(make_key(family, **params))``, memoised on ``(family, params)``: one tuple, one dict lookup."""
    memo_key = (family, tuple(params.items()))
    try:
        return _MEMO[memo_key]
    except KeyError:
        module = _MEMO[memo_key] = load(make_key(family, **params))
        return module


def load(key: VariantKey) -> Any:
    """The loaded ``tvm_ffi.Module`` of ``key``, building it on a cache miss."""
    hit = _MEMO.get(key)
    return hit.module if hit is not None else acquire(key).module


@dataclass(frozen=True)
class Resolved:
    """Everything needed to decide hit or miss for one variant, computed without compiling.

    ``toolchain`` is None when a compiler cannot be probed (``toolchain_error`` says which);
    then ``layout`` is None and any entry under ``input_dir`` may be loaded.
    """

    key: VariantKey
    family: Family
    settings: Settings
    inputs: dict[str, Any]
    input_digest: str
    input_dir: Path
    toolchain: Toolchain | None
    layout: Layout | None
    toolchain_error: ToolchainUnavailable | None = None

    def candidates(self) -> list[Layout]:
        """The entries a lookup may load: these compilers' entry, and without a compiler (or
        offline) every other entry under the input digest too."""
        own = [self.layout] if self.layout is not None else []
        return own + self.siblings() if self.toolchain is None or self.settings.offline else own

    def siblings(self) -> list[Layout]:
        """Published entries under the input digest other than ``layout``, newest first."""
        try:
            dirs = [p for p in self.input_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                    and not p.name.endswith(".failed") and (self.layout is None or p != self.layout.leaf)]
        except OSError:
            return []
        dirs.sort(key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)
        return [Layout(self.settings.cache_dir, self.key.module_name, self.input_dir, p.name) for p in dirs]


@functools.lru_cache(maxsize=None)
def _tvm_ffi_version() -> str:
    """The installed apache-tvm-ffi version, from its metadata (no import: ``cache info`` stays light)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("apache-tvm-ffi")
    except PackageNotFoundError:  # a source checkout of tvm-ffi without dist metadata
        import tvm_ffi

        return str(tvm_ffi.__version__)


def resolve(key: VariantKey) -> Resolved:
    """The digests and cache paths of ``key`` (no compiler runs; ``--version`` outputs are memoised)."""
    family = get_family(key.family)
    settings = get_settings()
    inputs = {"recipe": ENGINE_RECIPE, "package": package_version(), "family": family.name,
              "sources": [list(pair) for pair in family.sources], "exports": list(family.exports),
              "params": [list(item) for item in key.params], "target": key.target, "files": sources_digest(),
              "flags": logical_flags(family, key), "tvm_ffi": _tvm_ffi_version()}
    input_digest = digest(inputs)
    input_dir = settings.cache_dir / package_version() / target_tag(key.target) / key.module_name / input_digest
    try:
        toolchain = get_toolchain(key.backend, settings.cache_dir)
    except ToolchainUnavailable as exc:
        return Resolved(key, family, settings, inputs, input_digest, input_dir, None, None, exc)
    layout = Layout(settings.cache_dir, key.module_name, input_dir, digest(toolchain.fingerprint()))
    return Resolved(key, family, settings, inputs, input_digest, input_dir, toolchain, layout)


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
    return f"flashcompress prewarm --arch {key.target} '{key.spec()}'"


def _key_lock(key: VariantKey) -> threading.Lock:
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def acquire(key: VariantKey, *, force: bool | None = None) -> Acquired:
    """Load ``key`` from the memo or the cache, or build and publish it.

    ``force=True`` rebuilds even if a valid entry exists (``force_rebuild`` setting:
    once per variant per process).
    """
    start = time.perf_counter()
    hit = _MEMO.get(key)
    if hit is not None and not force:
        return Acquired(key, hit.module, "memo", 0.0, hit.path)
    with _key_lock(key):
        hit = _MEMO.get(key)
        if hit is not None and not force:
            return Acquired(key, hit.module, "memo", 0.0, hit.path)
        res = resolve(key)
        if res.settings.verbose and not log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("[flashcompress.jit] %(message)s"))
            log.addHandler(handler)
            log.setLevel(logging.INFO)
        if force is None:
            force = res.settings.force_rebuild and key not in _FORCED
        module, layout, corrupt = (None, None, []) if force else _find(res)
        status = "hit"
        if module is None:
            if res.toolchain is None or res.settings.offline:
                module, layout = _recover_without_build(res, corrupt)
            else:
                module, status = _build_locked(res, force=bool(force), known_problem=bool(corrupt))
                layout = res.layout
            if force:
                _FORCED.add(key)
        assert layout is not None
        result = _MEMO[key] = Acquired(key, module, status, time.perf_counter() - start, layout.leaf)
        return result


def _find(res: Resolved) -> tuple[Any, Layout | None, list[tuple[Layout, str]]]:
    """The entry these compilers build, else (no compiler, or offline) any entry of the same inputs.
    Returns ``(module, layout, [(corrupt entry, problem)])``."""
    corrupt = []
    for layout in res.candidates():
        module, problem = _try_load(res, layout)
        if module is not None:
            log.info("hit %s at %s", res.key.describe(), layout.leaf)
            touch(layout.leaf)
            return module, layout, corrupt
        if problem is not None:
            corrupt.append((layout, problem))
    return None, None, corrupt


def _cannot_build_error(res: Resolved, problem: str | None) -> OfflineCacheMiss:
    key = res.key
    if res.toolchain is None:
        error = res.toolchain_error
        return ToolchainMissing(key.describe(), res.input_dir, prewarm_command(key),
                                error.missing if error is not None else [], key.backend,
                                offline=res.settings.offline, problem=problem)
    assert res.layout is not None
    return OfflineCacheMiss(key.describe(), res.layout.leaf, prewarm_command(key))


def _recover_without_build(res: Resolved, corrupt: list[tuple[Layout, str]]) -> tuple[Any, Layout]:
    """A miss where nothing may be compiled (offline, or no compiler): warn about and remove corrupt
    entries (under their build lock, when the cache is writable), then raise the error naming the
    prewarm command.  Returns a module only if another process repaired an entry meanwhile."""
    for layout, problem in corrupt:
        module, removed = _discard_corrupt(res, layout)
        if module is not None:
            return module, layout
        warnings.warn(f"flashcompress: cached JIT variant {res.key.describe()} at {layout.leaf} is corrupt "
                      f"({problem}); {'removed it' if removed else 'could not remove it (read-only cache?)'}; "
                      f"it cannot be rebuilt here", CacheCorruptionWarning, stacklevel=4)
    raise _cannot_build_error(res, corrupt[0][1] if corrupt else None)


def _discard_corrupt(res: Resolved, layout: Layout) -> tuple[Any | None, bool]:
    """Remove a corrupt entry under its lock, unless it was repaired meanwhile. ``(module, removed)``."""
    try:
        import filelock

        with filelock.FileLock(str(layout.lock), timeout=min(30, res.settings.lock_timeout_s)):
            module, again = _try_load(res, layout)
            if module is not None or again is None:
                return module, module is None  # repaired, or gone already
            remove_tree(layout.leaf)
            return None, not layout.leaf.exists()
    except Exception:  # noqa: BLE001 - read-only cache, lock timeout: leave it, the error says what to do
        return None, False


def _try_load(res: Resolved, layout: Layout) -> tuple[Any | None, str | None]:
    """Load the published entry ``layout``: ``(module, None)``, ``(None, None)`` on a miss, or
    ``(None, problem)`` when the entry exists but is unusable (manifest, size, dlopen, exports)."""
    if not layout.leaf.is_dir():
        return None, None
    manifest = read_manifest(layout.leaf)
    if manifest is None:
        return (None, "variant.json is missing or unreadable") if layout.leaf.is_dir() else (None, None)
    if manifest.get("input_digest") != res.input_digest or manifest.get("toolchain_digest") != layout.toolchain_digest:
        return None, "variant.json was built from other sources, flags, target or compilers than its directory names"
    expected = manifest.get("library", {}).get("size") if isinstance(manifest.get("library"), dict) else None
    try:
        size = layout.library.stat().st_size
    except FileNotFoundError:
        return (None, f"{layout.library.name} is missing") if layout.leaf.is_dir() else (None, None)
    if size != expected:
        return None, f"{layout.library.name} has {size} bytes, the manifest says {expected} (truncated?)"
    module, problem = load_checked(layout.library, res.family.exports)
    return (None, None) if problem and not layout.library.exists() else (module, problem)


def load_checked(library: Path, exports: Sequence[str]) -> tuple[Any | None, str | None]:
    """dlopen ``library`` and check that it exports ``exports``: ``(module, None)`` or ``(None, problem)``."""
    import tvm_ffi

    try:
        module = tvm_ffi.load_module(str(library))
    except Exception as exc:  # noqa: BLE001 - any loader failure means "unusable"
        return None, f"failed to load: {exc}"
    missing = [name for name in exports if not module.implements_function(name)]
    return (None, f"exports {missing} are missing") if missing else (module, None)


def _is_capturing() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA runtime
        return False


def _ensure_writable(res: Resolved) -> None:
    try:
        ensure_root(res.settings.cache_dir)
        res.input_dir.mkdir(parents=True, exist_ok=True)
        probe = res.input_dir / f".probe-{os.getpid()}-{threading.get_ident()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        where = Path(exc.filename) if exc.filename else res.input_dir
        if where.name.startswith("."):  # our probe or temp file: name the directory instead
            where = where.parent
        raise CacheNotWritable(res.key.describe(), where, exc.strerror or str(exc),
                               res.settings.how_to_set("cache_dir")) from None


def _build_locked(res: Resolved, *, force: bool, known_problem: bool) -> tuple[Any, str]:
    settings, key, layout = res.settings, res.key, res.layout
    assert layout is not None
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
        problem = None
        if not force:
            module, problem = _try_load(res, layout)
            if module is not None:
                log.info("hit after waiting %s", key.describe())
                return module, "waited"
            if problem is not None:
                warnings.warn(f"flashcompress: cached JIT variant {key.describe()} at {layout.leaf} is corrupt "
                              f"({problem}); removing and rebuilding it", CacheCorruptionWarning, stacklevel=4)
        for stale in layout.stale_stagings():
            remove_tree(stale)  # a killed build of this key; we hold its lock
        module = _build(res, replace_existing=force or problem is not None)
        return module, ("rebuilt" if (force or known_problem or problem) else "built")
    finally:
        lock.release()


def _build(res: Resolved, *, replace_existing: bool) -> Any:
    """Compile into a staging directory, load it, write the manifest, publish; then the size cap."""
    layout = res.layout
    assert layout is not None
    log.info("building %s into %s", res.key.describe(), layout.leaf)
    started = time.perf_counter()
    staging = layout.new_staging()
    staging.mkdir()
    try:
        timings = _compile(res, staging)
        module = _load_built(res, staging)
        _write_manifest(res, staging, timings, time.perf_counter() - started)
        _publish(res, staging, replace_existing)
    finally:
        if staging.exists():
            remove_tree(staging)
    cap = res.settings.size_cap_mb * 1024 * 1024
    for path in enforce_size_cap(res.settings.cache_dir, cap, keep=layout.leaf) if cap else ():
        log.info("size cap: evicted %s", path)
    return module


def _fail(res: Resolved, staging: Path, command: str, errors: list[str], note: str,
          returncode: int | None = None) -> BuildError:
    """Keep the failed build's sources and log as ``<toolchain digest>.failed`` and make the error."""
    layout = res.layout
    assert layout is not None
    _append(staging / "build.log", note)
    remove_tree(layout.failed_dir)
    try:
        os.rename(staging, layout.failed_dir)
    except OSError:
        pass
    return BuildError(res.key.describe(), command, errors, layout.failed_dir / "build.log", returncode)


def _compile(res: Resolved, staging: Path) -> list[tuple[str, float]]:
    """Render the sources into ``staging`` and run the compile and link steps; ``[(step, seconds)]``."""
    from . import build  # the build machinery is imported only when something is built

    key, layout = res.key, res.layout
    assert layout is not None and res.toolchain is not None
    sources = render_sources(key, res.family)
    for name, text in sources.items():
        (staging / name).write_text(text, encoding="utf-8")
    stages = build.plan_steps(key, res.family, res.toolchain, tvm_ffi_info(), list(sources), kernel_include_dir(),
                              layout.library.name, layout.leaf)
    (staging / "build.log").write_text(f"# {key.describe()}  entry {layout.key}\n# started {_now()}\n\n",
                                       encoding="utf-8")
    (staging / "build.sh").write_text(
        "#!/bin/sh\n# Reproduce this build (run inside this directory)\nset -ex\n"
        + "".join(" & \\\n".join(s.command for s in stage) + ("\nwait\n" if len(stage) > 1 else "\n")
                  for stage in stages), encoding="utf-8")
    try:
        return build.run_steps(stages, staging, staging / "build.log", verbose=res.settings.verbose)
    except build.StepFailed as failure:
        raise _fail(res, staging, failure.step.command, build.first_error_lines(failure.output), "",
                    failure.returncode) from None


def _load_built(res: Resolved, staging: Path) -> Any:
    """dlopen the freshly linked library and check its exports."""
    assert res.layout is not None
    library = staging / res.layout.library.name
    module, problem = load_checked(library, res.family.exports)
    if problem is not None:
        hint = " (declared in Family.exports; use TVM_FFI_DLL_EXPORT_TYPED_FUNC)" if "exports" in problem else ""
        raise _fail(res, staging, f"tvm_ffi.load_module({library.name!r})", [problem + hint],
                    f"# loading {library.name}: {problem}\n") from None
    return module


def _write_manifest(res: Resolved, staging: Path, timings: list[tuple[str, float]], seconds: float) -> None:
    key, layout, toolchain = res.key, res.layout, res.toolchain
    assert layout is not None and toolchain is not None
    library = staging / layout.library.name
    manifest = {
        "family": key.family, "params": dict(key.params), "target": key.target,
        "target_arch": target_arch(key.target), "module_name": key.module_name, "key": layout.key,
        "package_version": package_version(), "exports": list(res.family.exports),
        "library": {"name": library.name, "size": library.stat().st_size, "sha256": file_sha256(library)},
        "key_inputs": res.inputs, "input_digest": res.input_digest,
        "toolchain": toolchain.fingerprint(), "toolchain_digest": layout.toolchain_digest,
        "build": {"seconds": round(seconds, 3), "steps": [[label, round(t, 3)] for label, t in timings],
                  "finished": _now(), "host": os.uname().nodename, "pid": os.getpid()},
    }
    for obj in staging.glob("*.o"):
        obj.unlink()  # objects are not needed once linked
    tmp = staging / ".variant.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, staging / "variant.json")
    _append(staging / "build.log", f"# finished {_now()} in {seconds:.2f} s\n")


def _publish(res: Resolved, staging: Path, replace_existing: bool) -> None:
    """Rename ``staging`` into place (atomic); a concurrent identical publish wins harmlessly."""
    layout = res.layout
    assert layout is not None
    if replace_existing and layout.leaf.exists():
        remove_tree(layout.leaf)
    try:
        os.rename(staging, layout.leaf)
    except OSError as exc:
        if not layout.manifest.is_file():
            raise CacheNotWritable(res.key.describe(), layout.input_dir, f"publishing failed: {exc}",
                                   res.settings.how_to_set("cache_dir")) from None
        # Another builder published the same entry first (locks are only best effort, e.g. on NFS):
        # keep theirs; our module is already loaded and identical in content.
        log.info("entry %s appeared during the build; keeping the existing one", layout.leaf)
    remove_tree(layout.failed_dir)
    log.info("built %s", res.key.describe())


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def lookup(key: VariantKey) -> tuple[Path, bool]:
    """The entry directory of ``key`` and whether a published entry exists there (no loading).

    Without a compiler (or offline) any entry of the same inputs counts; with no entry at all,
    the expected entry directory (the input directory without a compiler) and False."""
    res = resolve(key)
    for layout in res.candidates():
        if layout.manifest.is_file() and layout.library.is_file():
            return layout.leaf, True
    return (res.layout.leaf if res.layout is not None else res.input_dir), False
