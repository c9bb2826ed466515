"""The ``flashcompress`` command line (also ``python -m flashcompress``).

    flashcompress prewarm [SPEC ...] [--model M] [--all] [--arch A] [-j N] [--list | --dry-run]
    flashcompress cache info | list | verify [--delete-bad] | clean [--stale] [--yes]
    flashcompress config [--markdown]
    flashcompress check [--model M] [--device cuda|cuda:N|cpu]
    flashcompress demo [ARGS ...]
    flashcompress --version

A SPEC is ``family[:name=value,...]``, e.g. ``plan:ratio=128,online=true``; params
left out expand over the family's declared space (``plan`` = every plan variant).
``prewarm`` shows a progress bar on a terminal (one updating line) and one line per
finished variant otherwise, then a summary table.
This module only parses arguments and formats output; the work is done by
``flashcompress.jit.prewarm`` and ``flashcompress.jit.maintenance``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from typing import Any, Callable, Sequence, TextIO

__all__ = ["main"]


def _human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str], out: TextIO) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in rows:
        print(fmt.format(*row).rstrip(), file=out)


# --------------------------------------------------------------------------- prewarm


class Progress:
    """Prewarm progress.

    On a terminal: one line, redrawn in place (and every ``tick`` seconds, so the clock
    moves during long builds) with a bar, done/total, elapsed seconds and the variants in
    flight.  Otherwise (a log file, CI): one plain line per finished variant.
    """

    BAR = 24

    def __init__(self, total: int, out: TextIO, *, tty: bool | None = None, tick: float = 0.5,
                 clock: Callable[[], float] = time.perf_counter, columns: int | None = None) -> None:
        self.total = total
        self.out = out
        self.tty = _isatty(out) if tty is None else tty
        self.clock = clock
        self.started_at = clock()
        self.done = 0
        self.active: dict[Any, None] = {}  # keys in flight, in start order
        self.columns = columns
        self._lock = threading.Lock()
        self._width = len(str(total))
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.tty and tick > 0:
            self._ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True, name="fc-progress")
            self._ticker.start()

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self._lock:
                self._draw()

    def line(self) -> str:
        """The status line (without terminal control characters)."""
        filled = self.BAR * self.done // self.total if self.total else self.BAR
        text = (f"[{'#' * filled}{'.' * (self.BAR - filled)}] {self.done:>{self._width}}/{self.total} "
                f"{self.clock() - self.started_at:5.1f}s")
        if self.active:
            text += "  " + ", ".join(key.describe() for key in self.active)
        columns = self.columns or shutil.get_terminal_size((100, 24)).columns
        return text if len(text) < columns else text[: max(columns - 2, 10)] + "…"

    def _draw(self) -> None:
        self.out.write("\r\x1b[K" + self.line())
        self.out.flush()

    def started(self, key: Any) -> None:
        """Work on ``key`` began (called from a worker thread)."""
        with self._lock:
            self.active[key] = None
            if self.tty:
                self._draw()

    def finished(self, done: int, total: int, result: Any) -> None:
        """``result`` is final (called from a worker thread)."""
        with self._lock:
            self.active.pop(result.key, None)
            self.done = done
            if self.tty:
                self._draw()
            else:
                print(f"[{done:>{self._width}}/{total}] {result.status:<7} {result.seconds:6.2f}s  "
                      f"{result.key.describe()}", file=self.out, flush=True)

    def close(self) -> None:
        """Stop redrawing; on a terminal, leave the final state of the line."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self.tty:
                self.active.clear()
                self._draw()
                self.out.write("\n")
                self.out.flush()


def _isatty(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def _cmd_prewarm(args: argparse.Namespace, out: TextIO) -> int:
    from .jit import errors
    from .jit.prewarm import prewarm_jobs, run_prewarm, variant_set, warm_launch, warm_launch_skipped
    from .jit.settings import get_settings

    if not (args.specs or args.model or args.all):
        print("flashcompress prewarm: give variant specs, --model or --all (see --help)", file=sys.stderr)
        return 2
    settings = get_settings()
    if settings.offline and not (args.list or args.dry_run):
        print(f"flashcompress prewarm: prewarm compiles, so it needs offline mode off, but offline is on "
              f"(from {settings.origin('offline')}); run it with FLASHCOMPRESS_OFFLINE=0 on a machine with the "
              f"toolchain. Nothing was written.", file=sys.stderr)
        return 2
    try:
        keys = variant_set(args.specs, models=args.model or (), all_variants=args.all, archs=args.arch)
    except errors.UnknownFamily:
        from .jit.family import discover_families

        families = discover_families()
        unknown = [name for name in (spec.split(":", 1)[0].strip() for spec in args.specs) if name not in families]
        public = sorted(name for name, fam in families.items() if fam.space is not None)  # not the test family
        print(f"flashcompress prewarm: unknown JIT kernel family {unknown[0] if unknown else '?'!r}; "
              f"known: {', '.join(public)}", file=sys.stderr)
        return 2
    except (ValueError, ImportError) as exc:
        print(f"flashcompress prewarm: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for key in keys:
            print(key.describe(), file=out)
        print(f"{len(keys)} variant(s)", file=out)
        return 0
    if args.dry_run:
        from .jit.engine import lookup

        rows = []
        for key in keys:
            try:
                leaf, present = lookup(key)
                rows.append([key.describe(), "cached" if present else "to build", str(leaf)])
            except Exception as exc:  # noqa: BLE001 - e.g. no compiler on this machine
                rows.append([key.describe(), "unknown", f"({type(exc).__name__}: {exc})"])
        _table(rows, ["variant", "status", "cache path"], out)
        print(f"{len(keys)} variant(s); nothing compiled (dry run)", file=out)
        return 0

    for target in dict.fromkeys(key.target for key in keys if key.target.startswith("hip:")):
        problem = _hip_target_problem(target)
        if problem:
            print(f"flashcompress prewarm: UnsupportedTarget: {problem}. Nothing was built.", file=sys.stderr)
            return 2
    n_jobs, note = prewarm_jobs(args.jobs)
    if note:
        print(f"note: {note}", file=out)
    print(f"prewarming {len(keys)} variant(s) with {n_jobs} job(s) into {settings.cache_dir}", file=out)
    progress = Progress(len(keys), out)
    started = time.perf_counter()
    try:
        results = run_prewarm(keys, jobs=n_jobs, force=args.force, progress=progress.finished,
                              started=progress.started)
    finally:
        progress.close()
    wall = time.perf_counter() - started
    if args.no_warmup:
        print("warm launch skipped (--no-warmup)", file=out)
    else:
        skipped = warm_launch_skipped(results)
        if skipped:
            print(f"warm launch skipped: {skipped}", file=out)
        else:
            print(f"warm-launched {warm_launch(results)} variant(s) on the GPU", file=out)
    rows = []
    for r in results:
        status = r.status if r.warmup is None or r.warmup == "ok" else "warmup-failed"
        rows.append([r.key.describe(), status, f"{r.seconds:.2f}", str(r.path) if r.path else "-"])
    print(file=out)
    _table(rows, ["variant", "status", "seconds", "cache path"], out)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(f"\n{len(results)} variant(s) in {wall:.1f} s: {summary}", file=out)
    failures = [r for r in results if not r.ok]
    unwritable = [r for r in failures if isinstance(r.error, errors.CacheNotWritable)]
    if unwritable:  # one cause for all of them: say it once
        first = unwritable[0].error
        reason = str(first).replace(f"cannot build JIT variant {first.variant}: ", "", 1)  # type: ignore[union-attr]
        print(f"\nFAILED {len(unwritable)} variant(s): cannot build: {reason}", file=out)
    for r in failures:
        if r in unwritable:
            continue
        print(f"\nFAILED {r.key.describe()}", file=out)
        if r.error is not None:
            if isinstance(r.error, errors.BuildError):
                print(f"  command: {r.error.command}", file=out)
                for line in r.error.first_errors:
                    print(f"    {line}", file=out)
                print(f"  full log: {r.error.log_path}", file=out)
            else:
                print(f"  {type(r.error).__name__}: {r.error}", file=out)
        if r.warmup and r.warmup.startswith("failed"):
            print(f"  warm launch {r.warmup}", file=out)
    return 1 if failures else 0


def _hip_target_problem(target: str) -> str | None:
    """Why this machine's hipcc cannot compile for ``target`` (``hip:gfx942``), or None.

    One syntax-only compile of an empty file (about a second): a clang that does not know
    the GPU fails at the driver with "invalid target ID", before any of our sources.
    Without a HIP toolchain there is nothing to ask (the build reports that itself).
    """
    import os
    import subprocess

    from .jit.toolchain import ToolchainUnavailable, get_toolchain

    arch = target.split(":", 1)[1]
    try:
        compiler = get_toolchain("hip", None).device_compiler
    except (ToolchainUnavailable, RuntimeError):
        return None
    proc = subprocess.run([str(compiler), f"--offload-arch={arch}", "-x", "hip", "-fsyntax-only", os.devnull],
                          capture_output=True, text=True, env=dict(os.environ, HIP_PLATFORM="amd"), check=False)
    if proc.returncode == 0:
        return None
    errors = [line.strip() for line in proc.stderr.splitlines() if "error" in line]
    reason = errors[0] if errors else f"exit status {proc.returncode}"
    return (f"{compiler} cannot compile for {arch} ({reason[:160]}); use a ROCm release whose clang supports "
            f"{arch}, or give --arch a target this hipcc knows")


# --------------------------------------------------------------------------- cache


def _cmd_cache(args: argparse.Namespace, out: TextIO) -> int:
    from .jit.cache import package_version
    from .jit.maintenance import classify, clean, verify
    from .jit.settings import get_settings

    settings = get_settings()
    root = settings.cache_dir
    if args.action == "info":
        items = classify(root)
        by_status: dict[str, list] = {}
        for item in items:
            by_status.setdefault(item.status, []).append(item)
        total = sum(i.entry.size for i in items)
        print(f"cache dir        {root}  (from {settings.origin('cache_dir')})", file=out)
        print(f"package version  {package_version()}", file=out)
        print(f"total size       {_human_size(total)}"
              + (f" (cap {settings.size_cap_mb} MiB)" if settings.size_cap_mb else " (no cap)"), file=out)
        for status in ("current", "stale", "unknown", "other-version", "failed", "building", "staging", "trash"):
            group = by_status.get(status, [])
            if group:
                print(f"{status:<16} {len(group):>4}  {_human_size(sum(i.entry.size for i in group))}", file=out)
        if not items:
            print("(empty)", file=out)
        return 0
    if args.action == "list":
        now = time.time()
        rows = [[i.status, _human_size(i.entry.size), _age(now - i.entry.mtime), i.entry.version, i.variant,
                 str(i.entry.path)] for i in classify(root)]
        if rows:
            _table(rows, ["status", "size", "age", "version", "variant", "path"], out)
        print(f"{len(rows)} item(s) under {root}", file=out)
        return 0
    if args.action == "verify":
        from .jit.cache import remove_tree

        results = verify(root)
        rows = []
        bad_paths = []
        for item, ok, message in results:
            status = "ok" if ok else f"BAD: {message}"
            if not ok:
                bad_paths.append(item.entry.path)
                if args.delete_bad:
                    remove_tree(item.entry.path)
                    status += " (removed)"
            rows.append([item.variant, status, str(item.entry.path)])
        if rows:
            _table(rows, ["variant", "status", "path"], out)
        bad = len(bad_paths)
        print(f"{len(results)} entries verified, {bad} bad", file=out)
        return 1 if bad else 0
    if args.action == "clean":
        from .jit.maintenance import REMOVABLE_WHEN_STALE

        items = [i for i in classify(root) if not args.stale or i.status in REMOVABLE_WHEN_STALE]
        what = f"{len(items)} {'stale ' if args.stale else ''}item(s) ({_human_size(sum(i.entry.size for i in items))})"
        if items and not args.yes and not _confirm(f"remove {what} under {root}?"):
            return 1
        try:
            removed, freed = clean(root, stale_only=args.stale)
        except RuntimeError as exc:
            print(f"flashcompress cache clean: {exc}", file=sys.stderr)
            return 1
        for path in removed:
            print(f"removed {path}", file=out)
        # a full clean removes whole version directories: count the cache items they held
        count = len(removed) if args.stale else len(items)
        print(f"removed {count} item(s), {_human_size(freed)} freed", file=out)
        return 0
    raise AssertionError(args.action)  # pragma: no cover


def _confirm(question: str) -> bool:
    """Ask ``question [y/N]`` on a terminal; without one, refuse (``--yes`` skips the question)."""
    if not _isatty(sys.stdin):
        print(f"flashcompress cache clean: refusing to {question[:-1]} without confirmation: stdin is not a "
              "terminal; pass --yes to clean without asking. Nothing was removed.", file=sys.stderr)
        return False
    try:
        answer = input(f"{question[0].upper()}{question[1:]} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("flashcompress cache clean: nothing removed", file=sys.stderr)
    return False


# --------------------------------------------------------------------------- config / demo


def _cmd_config(args: argparse.Namespace, out: TextIO) -> int:
    from .jit.settings import SCHEMA, get_settings, markdown_table, user_config_path

    if args.markdown:
        out.write(markdown_table())
        return 0
    settings = get_settings()
    rows = []
    for setting in SCHEMA:
        value = getattr(settings, setting.key)
        if isinstance(value, tuple):
            value = ",".join(value)
        rows.append([setting.key, str(value), settings.origin(setting.key)])
    _table(rows, ["setting", "value", "from"], out)
    print(f"\nuser config file: {user_config_path()}"
          f" ({'present' if user_config_path().is_file() else 'absent'})", file=out)
    for label, value in _resolved_target_and_toolchain():
        print(f"{label:<17}{value}", file=out)
    return 0


def _resolved_target_and_toolchain() -> list[tuple[str, str]]:
    """``config``'s last lines: the target variants are built for and the compilers that build them."""
    from .jit.toolchain import ToolchainUnavailable, get_toolchain
    from .jit.variant import detect_backend, detect_target

    lines = []
    try:
        backend = detect_backend()
        lines.append(("target:", detect_target()))
    except Exception as exc:  # noqa: BLE001 - e.g. no GPU and no default arch
        return [("target:", f"unresolved ({exc})")]
    try:
        tc = get_toolchain(backend, None)  # no cache root: nothing is written
    except ToolchainUnavailable as exc:
        return lines + [("toolchain:", f"unavailable ({exc}); prewarmed entries still load")]
    lines.append((f"{tc.device_compiler.name}:", f"{tc.device_compiler}  ({_version_line(tc.device_version)})"))
    lines.append(("host compiler:", f"{tc.host_compiler}  ({_version_line(tc.host_version)})"))
    return lines


def _version_line(text: str) -> str:
    """The informative line of a ``--version`` output (nvcc: ``Cuda compilation tools, release ...``)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "release" in line.lower():
            return line
    return lines[0] if lines else "version unknown"


def _cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from .jit.settings import get_settings
    from .testing.check import NoGpuError, check_device, run_check

    try:
        device = check_device(args.device)
    except NoGpuError as exc:
        print(f"flashcompress check: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"flashcompress check: {exc}", file=sys.stderr)
        return 2
    settings = get_settings()
    if device.type == "cuda" and settings.backend == "torch":
        print(f"flashcompress check: the backend setting is 'torch' (from {settings.origin('backend')}), so CUDA "
              "tensors would not reach the kernels; unset FLASHCOMPRESS_BACKEND to check them", file=sys.stderr)
        return 2
    print(f"flashcompress check: {args.model} on {device}: kernels against the PyTorch backend", file=out, flush=True)
    report = run_check(args.model, device, seed=args.seed, progress=lambda line: print(line, file=out, flush=True))
    print(file=out)
    print(report.table(), file=out)
    return 0 if report.ok else 1


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    import importlib

    try:
        demo = importlib.import_module("flashcompress.testing.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "flashcompress.testing.demo":
            raise
        print("flashcompress demo: not available in this build (flashcompress.testing.demo is missing)", file=sys.stderr)
        return 2
    result = demo.main(list(args.demo_args))
    return int(result or 0)


# --------------------------------------------------------------------------- parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _version_text() -> str:
    from . import __version__

    return f"flashcompress {__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashcompress", description="flashcompress kernels: JIT cache tools.")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", required=True)

    pre = sub.add_parser("prewarm", help="compile variants ahead of time",
                         description="Compile kernel variants into the cache so that runtime never compiles.")
    pre.add_argument("specs", nargs="*", metavar="SPEC",
                     help="family[:name=value,...]; omitted params expand over the family's space")
    pre.add_argument("--model", action="append", metavar="NAME",
                     help="every variant a model needs (deepseek-v4-flash, deepseek-v4-pro); repeatable")
    pre.add_argument("--all", action="store_true", help="every variant of every family")
    pre.add_argument("--arch", action="append", metavar="ARCH",
                     help="target, e.g. 9.0a or gfx942 (repeatable); default: the GPU, else the configured defaults")
    pre.add_argument("-j", "--jobs", type=_positive_int, default=None, metavar="N",
                     help="parallel compiler processes, N >= 1 (default: setting `jobs`); capped by CPU cores "
                          "and available memory (~2 GiB per process), with a note")
    pre.add_argument("--list", action="store_true", help="print the variant set and exit")
    pre.add_argument("--dry-run", action="store_true", help="print the set with cache status; compile nothing")
    pre.add_argument("--force", action="store_true", help="rebuild even if cached")
    pre.add_argument("--no-warmup", action="store_true", help="skip the warm launch on the GPU")
    pre.set_defaults(func=_cmd_prewarm)

    cache = sub.add_parser(
        "cache", help="inspect or clean the kernel cache",
        description="Inspect or clean the compiled-kernel cache (FLASHCOMPRESS_CACHE_DIR).")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("info", help="cache directory, package version, size and item counts by status",
                       description="Print the cache directory, the package version, the total size and the "
                                   "number of items by status (current, stale, other-version, failed, ...).")
    actions.add_parser("list", help="one line per cache item: status, size, age, version, variant, path",
                       description="List every cache item with its status, size, age, package version, "
                                   "variant and path.")
    verify = actions.add_parser("verify", help="hash-check and load every entry; exit 1 if one is bad",
                                description="Check every published entry (manifest, size, sha256, dlopen, "
                                            "exports); exit status 1 if any is bad.")
    verify.add_argument("--delete-bad", action="store_true", help="remove the entries that fail")
    clean = actions.add_parser("clean", help="remove cache items (asks first unless --yes)",
                               description="Remove the whole cache content, or with --stale only stale, "
                                           "other-version and failed items and build debris. Asks for "
                                           "confirmation; without a terminal it refuses unless --yes.")
    clean.add_argument("--stale", action="store_true",
                       help="only stale / other-version / failed items and debris")
    clean.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    cache.set_defaults(func=_cmd_cache, delete_bad=False, stale=False, yes=False)

    config = sub.add_parser(
        "config", help="show effective settings",
        description="Print every setting's effective value and where it came from (shipped defaults, user "
                    "config file or FLASHCOMPRESS_* environment variable), the user config file, the target "
                    "variants are built for and the compilers that build them.")
    config.add_argument("--markdown", action="store_true", help="print the settings reference table")
    config.set_defaults(func=_cmd_config)

    from .jit.models import MODELS

    check = sub.add_parser(
        "check", help="check the kernels against the PyTorch backend on this GPU",
        description="Build (or load) every kernel variant of a model preset, run a short engine script per "
                    "layer kind (C4 main, C4 indexer FP8/FP4, C128, online C128; for V4.1 the ratio-2 and "
                    "ratio-1 source layers with their index keys) through the kernels and "
                    "through the PyTorch backend from identical inputs, compare plans, state, compressed rows "
                    "and cache bytes (the GPU test suite's tolerances; V4.1 exactly) and compress_and_store "
                    "against the two-step path, and print one table. Exit status 0 only if every check passes; "
                    "1 on a mismatch or without a GPU.")
    check.add_argument("--model", default="deepseek-v4-flash", choices=sorted(MODELS),
                       help="model preset (default deepseek-v4-flash; deepseek-v4.1-flash checks the V4.1 "
                            "ratio-2 / ratio-1 source layers)")
    check.add_argument("--device", default="cuda",
                       help="cuda, cuda:N (default cuda) or cpu: a self-test of the check itself "
                            "(PyTorch backend on both sides, nothing built)")
    check.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    check.set_defaults(func=_cmd_check)

    demo = sub.add_parser("demo", help="run the demo (flashcompress.testing.demo)", add_help=False)
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``flashcompress`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:
        print(_version_text())
        return 0
    if argv[:1] == ["demo"]:  # everything after `demo` belongs to the demo, options included
        args = argparse.Namespace(func=_cmd_demo, demo_args=argv[1:])
    else:
        args = _parser().parse_args(argv)
    import warnings

    from .jit.settings import SettingsError

    def show(message, category, filename, lineno, file=None, line=None):  # one plain line, no source line
        print(f"flashcompress: warning: {message}", file=sys.stderr)

    warnings.showwarning = show
    try:
        return int(args.func(args, sys.stdout))
    except SettingsError as exc:
        print(f"flashcompress: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("flashcompress: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
