"""Load a variant: in-process memo -> lock-free cache lookup -> locked build -> atomic publish.

``acquire(key)`` is the whole algorithm; ``load`` and ``get_module`` are its
memoised front doors (``flashcompress.jit`` re-exports them)::

    memo hit                   dict lookup, nothing else
    cache hit (no lock)        digests + manifest + size (+ sha256 unless the .verified sidecar
                               vouches for this exact file) + dlopen + export check
    miss                       offline or no compiler? -> error naming the prewarm command
                               -> capturing? -> writable? -> per-variant file lock
                               -> look again (another process may have built it)
                               -> render into .staging-*, compile, link, dlopen, check exports
                               -> write variant.json + sidecar -> os.rename(staging, leaf)
                               -> write the current-<input digest> pointer -> size cap

Keys: the content key hashes the compiler versions, so it can only be computed
where the compilers can be probed.  Where they cannot (a runtime image without
the CUDA toolkit), ``resolve`` finds the entry through the ``current-<input
digest>`` pointer written at publish time (the input digest covers everything but
the compilers) and the entry's manifest is checked against those inputs before
loading.  An offline process whose compilers differ from the builder's does the
same after a miss; a normal process rebuilds instead.  A miss that cannot be
built raises ``ToolchainMissing`` (no compiler) or ``OfflineCacheMiss``.

A corrupt entry (manifest mismatch, size or sha256 mismatch, dlopen failure,
missing export) is warned about (``CacheCorruptionWarning``), removed under the
lock and rebuilt.  The sha256 of a library is checked on its first load and the
verified ``(inode, size, mtime, ctime)`` recorded in ``<module>.so.verified``
(written at publish time too), so later loads of the same file skip the hash.
A killed build leaves only a ``.staging-*`` directory, which no reader ever looks at.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from .cache import (Layout, content_key, ensure_root, file_identity, file_sha256, input_digest, key_inputs,
                    package_version, pointer_path, read_manifest, read_pointer, remove_tree, touch, write_atomic)
from .errors import (BuildError, CacheCorruptionWarning, CacheNotWritable, CaptureBuildError, LockTimeout,
                     OfflineCacheMiss, ToolchainMissing)
from .family import FAMILY_PACKAGES, Family, get_family, on_reregister, provider_module
from .render import header_closure, headers_digest, kernel_include_dir, render_sources, template_digest
from .settings import Settings, get_settings, on_reload
from .toolchain import Toolchain, ToolchainUnavailable, get_toolchain, tvm_ffi_info
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
    """Everything needed to decide hit or miss for one variant, computed without compiling.

    ``toolchain`` is None when a compiler cannot be probed (``toolchain_error`` says which);
    then ``inputs`` lack the compiler versions and ``layout`` is the entry the
    ``current-<input digest>`` pointer names, or None when there is none.
    """

    key: VariantKey
    family: Family
    settings: Settings
    toolchain: Toolchain | None
    tvm_version: str
    flags: dict[str, list[str]]
    inputs: dict[str, Any]
    input_digest: str
    module_dir: Path
    layout: Layout | None
    toolchain_error: ToolchainUnavailable | None = None

    @property
    def pointer(self) -> Path:
        """``<module_dir>/current-<input digest>``."""
        return pointer_path(self.module_dir, self.input_digest)

    def pointed_layout(self) -> Layout | None:
        """The entry the pointer names (None when there is no readable pointer)."""
        pointed = read_pointer(self.pointer)
        return Layout.of(self.settings.cache_dir, self.key, pointed) if pointed else None


def _header_inputs(family: Family, flags: dict[str, list[str]]) -> tuple[str, tuple[str, ...]]:
    all_flags = tuple(flags["device"]) + tuple(flags["host"])
    return headers_digest(family.sources, all_flags), all_flags


def resolve(key: VariantKey) -> Resolved:
    """Compute the content key and the cache paths of ``key`` (no compiler is run; their
    ``--version`` outputs come from the on-disk memo)."""
    family = get_family(key.family)
    family.check_params(dict(key.params))
    settings = get_settings()
    import tvm_ffi

    tvm_version = str(tvm_ffi.__version__)
    flags = _flags.logical_flags(family, key)
    inputs = key_inputs(key, family, tvm_version, flags, template_digest(family.sources),
                        _header_inputs(family, flags)[0])
    digest = input_digest(inputs)
    module_dir = Layout.module_dir_of(settings.cache_dir, key)
    try:
        toolchain = get_toolchain(key.backend, settings.cache_dir)
    except ToolchainUnavailable as exc:
        res = Resolved(key, family, settings, None, tvm_version, flags, inputs, digest, module_dir, None, exc)
        return dataclasses.replace(res, layout=res.pointed_layout())
    content, full_inputs = content_key(inputs, toolchain.fingerprint())
    return Resolved(key, family, settings, toolchain, tvm_version, flags, full_inputs, digest, module_dir,
                    Layout.of(settings.cache_dir, key, content))


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
        layout = res.layout
        corrupt: list[tuple[Layout, str]] = []
        if not force:
            module, problem = _try_load(res)
            if problem is not None:
                corrupt.append((layout, problem))  # type: ignore[arg-type]
            if module is None and res.toolchain is not None and res.settings.offline:
                # Offline and not built by these compilers: an entry built from the same inputs by
                # other compilers (the build machine's) is the best there is, and compiling is forbidden.
                other = res.pointed_layout()
                if other is not None and layout is not None and other.key != layout.key:
                    module, problem = _try_load(res, other)
                    if module is not None:
                        log.info("offline: %s built by other compilers (key %s, these compilers: %s)",
                                 key.describe(), other.key, layout.key)
                        layout = other
                    elif problem is not None:
                        corrupt.append((other, problem))
            if module is not None:
                assert layout is not None
                log.info("hit %s at %s", key.describe(), layout.leaf)
                touch(layout.leaf)
                if res.toolchain is not None and layout == res.layout:
                    _ensure_pointer(res, layout)
        if module is None:
            if res.toolchain is None or res.settings.offline:
                module, layout = _recover_without_build(res, corrupt)
            else:
                module, status = _build_locked(res, force=bool(force), known_problem=corrupt[0][1] if corrupt else None)
                layout = res.layout
            if force:
                _FORCED.add(key)
        assert layout is not None
        _PATHS[key] = layout.leaf
        _MEMO[key] = module
        return Acquired(key, module, status, time.perf_counter() - start, layout.leaf)


def _ensure_pointer(res: Resolved, layout: Layout) -> None:
    """Make ``current-<input digest>`` name ``layout`` (best effort; a read-only cache keeps its pointer)."""
    if read_pointer(res.pointer) != layout.key:
        write_atomic(res.pointer, layout.key + "\n")


def _cannot_build_error(res: Resolved, problem: str | None) -> OfflineCacheMiss:
    key = res.key
    if res.toolchain is None:
        error = res.toolchain_error
        return ToolchainMissing(key.describe(), res.module_dir, prewarm_command(key),
                                error.missing if error is not None else [], key.backend,
                                offline=res.settings.offline, problem=problem)
    assert res.layout is not None
    return OfflineCacheMiss(key.describe(), res.layout.leaf, prewarm_command(key))


def _recover_without_build(res: Resolved, corrupt: list[tuple[Layout, str]]) -> tuple[Any, Layout]:
    """A miss where nothing may be compiled (offline, or no compiler): warn about and remove corrupt
    entries (under their build lock, when the cache is writable), then raise the error naming the
    prewarm command.  Returns a module only if another process repaired an entry meanwhile."""
    for layout, problem in corrupt:
        module, removed = _discard_corrupt(res, layout, problem)
        if module is not None:
            return module, layout
        warnings.warn(f"flashcompress: cached JIT variant {res.key.describe()} at {layout.leaf} is corrupt "
                      f"({problem}); {'removed it' if removed else 'could not remove it (read-only cache?)'}; "
                      f"it cannot be rebuilt here", CacheCorruptionWarning, stacklevel=4)
    raise _cannot_build_error(res, corrupt[0][1] if corrupt else None)


def _discard_corrupt(res: Resolved, layout: Layout, problem: str) -> tuple[Any | None, bool]:
    """Remove a corrupt entry under its lock, unless it was repaired meanwhile. ``(module, removed)``."""
    try:
        import filelock

        with filelock.FileLock(str(layout.lock), timeout=min(30, res.settings.lock_timeout_s)):
            module, again = _try_load(res, layout)
            if module is not None:
                return module, False
            if again is None:
                return None, True  # gone already
            remove_tree(layout.leaf)
            return None, not layout.leaf.exists()
    except Exception:  # noqa: BLE001 - read-only cache, lock timeout: leave it, the error says what to do
        return None, False


def _manifest_problem(manifest: dict[str, Any], layout: Layout, res: Resolved) -> str | None:
    """Why ``manifest`` does not describe the entry ``res`` wants (None when it does)."""
    inputs = manifest.get("key_inputs")
    if not isinstance(inputs, dict) or manifest.get("key") != layout.key:
        return f"variant.json does not belong to key {layout.key}"
    if input_digest(inputs) != res.input_digest or manifest.get("input_digest") != res.input_digest:
        return "variant.json was built from other sources, flags or target than this installation's"
    if "toolchain" in inputs and content_key({k: v for k, v in inputs.items() if k != "toolchain"},
                                             inputs["toolchain"])[0] != layout.key:
        return f"variant.json's inputs do not hash to key {layout.key}"
    return None


def _sidecar_matches(layout: Layout, identity: dict[str, int], sha256: str) -> bool:
    try:
        with open(layout.sidecar, encoding="utf-8") as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and recorded == dict(identity, sha256=sha256)


def _write_sidecar(path: Path, identity: dict[str, int], sha256: str) -> None:
    """Record that the file with ``identity`` hashed to ``sha256`` (best effort: read-only caches skip it)."""
    write_atomic(path, json.dumps(dict(identity, sha256=sha256), sort_keys=True))


def _check_library(layout: Layout, lib_info: dict[str, Any]) -> str | None:
    """Size, then sha256 unless the sidecar vouches for this exact file. None when the library is intact."""
    expected_sha = lib_info.get("sha256")
    try:
        with open(layout.library, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size != lib_info.get("size"):
                return (f"{layout.library.name} has {st.st_size} bytes, the manifest says {lib_info.get('size')} "
                        f"(truncated?)")
            identity = file_identity(st)
            if isinstance(expected_sha, str) and _sidecar_matches(layout, identity, expected_sha):
                return None
            actual_sha = _hash_file(f)
    except FileNotFoundError:
        return ""  # evicted meanwhile: a plain miss
    except OSError as exc:
        return f"{layout.library.name} cannot be read: {exc}"
    if actual_sha != expected_sha:
        return f"{layout.library.name} does not match the sha256 in variant.json (same size: corrupt)"
    _write_sidecar(layout.sidecar, identity, actual_sha)
    return None


def _hash_file(f: Any) -> str:
    """Hex sha256 of an open binary file, read from its current position."""
    digest = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _try_load(res: Resolved, layout: Layout | None = None) -> tuple[Any | None, str | None]:
    """Load the published entry ``layout`` (default: ``res.layout``). Returns ``(module, None)``,
    ``(None, None)`` on a miss, or ``(None, problem)`` when the entry exists but is unusable.

    Checks, in order: the manifest belongs to these inputs; the library's size (a truncated
    copy); its sha256 unless the ``.verified`` sidecar records this exact file (inode, size,
    mtime, ctime) as verified; dlopen; the exports.  The hash costs ~1.5 ms per MB once per
    file; afterwards a load costs a ``stat`` and a small read more than without the check."""
    layout = res.layout if layout is None else layout
    if layout is None or not layout.leaf.is_dir():
        return None, None
    manifest = read_manifest(layout.leaf)
    if manifest is None:
        return (None, "variant.json is missing or unreadable") if layout.leaf.is_dir() else (None, None)
    problem = _manifest_problem(manifest, layout, res)
    if problem is not None:
        return None, problem
    lib_info = manifest.get("library", {})
    problem = _check_library(layout, lib_info if isinstance(lib_info, dict) else {})
    if problem == "":
        return (None, f"{layout.library.name} is missing") if layout.leaf.is_dir() else (None, None)
    if problem is not None:
        return None, problem
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
    assert layout is not None
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
    if settings.offline or res.toolchain is None or layout is None:
        raise _cannot_build_error(res, known_problem)
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

    key, family, layout, settings, toolchain = res.key, res.family, res.layout, res.settings, res.toolchain
    assert layout is not None and toolchain is not None
    log.info("building %s into %s", key.describe(), layout.leaf)
    started = time.perf_counter()
    sources = render_sources(key, family)
    staging = layout.new_staging()
    staging.mkdir()
    try:
        for name, text in sources.items():
            (staging / name).write_text(text, encoding="utf-8")
        stages = _build.plan_steps(key, family, toolchain, tvm_ffi_info(), list(sources), kernel_include_dir(),
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
        closure, why_whole_tree = header_closure(family.sources, _header_inputs(family, res.flags)[1])
        library_sha = file_sha256(library)
        manifest = {
            "family": key.family,
            "params": dict(key.params),
            "target": key.target,
            "target_arch": target_arch(key.target),
            "module_name": key.module_name,
            "key": layout.key,
            "package_version": package_version(),
            "exports": list(family.exports),
            "library": {"name": library.name, "size": library.stat().st_size, "sha256": library_sha},
            "key_inputs": res.inputs,
            "input_digest": res.input_digest,
            "headers": list(closure) if closure is not None else f"every file under jit_kernel/ ({why_whole_tree})",
            "build": {"seconds": round(seconds, 3), "steps": [[label, round(t, 3)] for label, t in timings],
                      "finished": _now(), "host": os.uname().nodename, "pid": os.getpid()},
        }
        for obj in staging.glob("*.o"):
            obj.unlink()  # objects are not needed once linked
        tmp = staging / ".variant.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, staging / "variant.json")
        # The hash was just computed: later first loads of this exact file skip it.
        _write_sidecar(staging / layout.sidecar.name, file_identity(library.stat()), library_sha)
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
        _ensure_pointer(res, layout)  # toolchain-less and offline lookups find the entry through it
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
    """The entry directory of ``key`` and whether a published entry exists there (no loading).

    Without a compiler (or offline, after a miss) this is the entry the ``current-*`` pointer
    names; without one either, the variant's module directory and False."""
    res = resolve(key)
    layouts = [res.layout]
    if res.toolchain is not None and res.settings.offline:
        layouts.append(res.pointed_layout())
    for layout in layouts:
        if layout is not None and layout.manifest.is_file() and layout.library.is_file():
            return layout.leaf, True
    return (res.layout.leaf if res.layout is not None else res.module_dir), False


def verify_entry(leaf: Path) -> tuple[bool, str]:
    """Check a published entry: manifest, size, sha256, dlopen and exports. ``(ok, message)``.

    Always hashes the library; a verified file's identity is recorded in its ``.verified``
    sidecar (best effort), so the engine's next first load skips the hash."""
    manifest = read_manifest(leaf)
    if manifest is None:
        return False, "variant.json missing or unreadable"
    lib = leaf / manifest.get("library", {}).get("name", "")
    if not lib.is_file():
        return False, f"{lib.name} missing"
    st = lib.stat()
    if st.st_size != manifest["library"].get("size"):
        return False, f"{lib.name}: size {st.st_size} != manifest {manifest['library'].get('size')}"
    sha = file_sha256(lib)
    if sha != manifest["library"].get("sha256"):
        return False, f"{lib.name}: sha256 mismatch"
    import tvm_ffi

    try:
        module = tvm_ffi.load_module(str(lib))
    except Exception as exc:  # noqa: BLE001
        return False, f"load failed: {exc}"
    missing = [name for name in manifest.get("exports", []) if not module.implements_function(name)]
    if missing:
        return False, f"missing exports {missing}"
    _write_sidecar(lib.with_name(lib.name + ".verified"), file_identity(st), sha)
    return True, "ok"
