"""Compile one variant: command lines, parallel execution, build log, error excerpts.

The engine writes its own commands instead of calling ``tvm_ffi.cpp.build``: every
flag is visible and hashed, no arch environment variable is needed (builds for
several targets can run in one process), and ninja is not a dependency.  Per
variant:

  kernel TUs  (``*.cu``)   nvcc/hipcc, no tvm-ffi headers (they cost ~9 s in nvcc)
  binding TUs (``*.cpp``)  host compiler with tvm-ffi + CUDA/HIP runtime headers
  link                     host compiler, ``-shared``, ``-ltvm_ffi -lcudart``

Host-only families (target ``host:<machine>``) have binding TUs only and link against tvm-ffi
alone: no device compiler, GPU headers or runtime library (the same as ``tvm_ffi.cpp.build``
with ``cpp_files`` only).

The translation units compile in parallel, each holding one slot of a
process-wide semaphore (``set_parallelism``), so a prewarm of many variants
never runs more than ``jobs`` compiler processes.  Compilers run with the
staging directory as working directory and ``./<file>`` as input, and the host
compiler maps ``./`` to the published directory in ``__FILE__``, so messages
and C++ tracebacks name files that still exist after publishing.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from . import flags as _flags
from .toolchain import Toolchain, TvmFfiInfo

if TYPE_CHECKING:  # pragma: no cover
    from .family import Family
    from .variant import VariantKey

__all__ = ["Step", "StepFailed", "build_counter", "first_error_lines", "parallelism", "plan_steps", "run_steps",
           "set_parallelism"]

_KERNEL_SUFFIXES = (".cu",)
_HOST_SUFFIXES = (".cpp", ".cc", ".cxx")


@dataclass(frozen=True)
class Step:
    """One compiler or linker invocation."""

    label: str  # "compile kernel.cu", "link"
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def command(self) -> str:
        """Shell-quoted command line (environment overrides first)."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        line = " ".join(shlex.quote(a) for a in self.argv)
        return f"{prefix} {line}" if prefix else line


def plan_steps(
    key: "VariantKey",
    family: "Family",
    toolchain: Toolchain,
    tvm: TvmFfiInfo,
    source_names: Sequence[str],
    include_dir: Path,
    module_file: str,
    publish_dir: Path,
) -> list[list[Step]]:
    """Stages of steps: all compiles (parallel), then the link."""
    flags = _flags.logical_flags(family, key)
    gpu = key.backend != "host"  # host-only modules: no GPU runtime headers or library
    includes = [f"-I{include_dir}"]
    runtime_inc = [f"-I{toolchain.include_dir}"] if gpu else []
    tvm_inc = [f"-I{d}" for d in tvm.include_dirs]
    device_env = {"HIP_PLATFORM": "amd"} if key.backend == "hip" else {}
    compiles: list[Step] = []
    objects: list[str] = []
    for name in source_names:
        stem = name.rsplit(".", 1)[0]
        if name.endswith(_KERNEL_SUFFIXES):
            assert gpu, f"{family.name}: a host-only family cannot compile {name}"
            obj = f"{stem}.cu.o"
            lang = ["-x", "hip"] if key.backend == "hip" else []
            argv = [str(toolchain.device_compiler), *flags["device"], *includes, *runtime_inc,
                    "-c", *lang, f"./{name}", "-o", obj]
            compiles.append(Step(f"compile {name}", tuple(argv), device_env))
        elif name.endswith(_HOST_SUFFIXES):
            obj = f"{stem}.o"
            argv = [str(toolchain.host_compiler), *flags["host"], *includes, *tvm_inc, *runtime_inc,
                    f"-fmacro-prefix-map=./={publish_dir}/", "-c", f"./{name}", "-o", obj]
            if key.backend == "hip":
                argv.insert(1, "-D__HIP_PLATFORM_AMD__=1")
            compiles.append(Step(f"compile {name}", tuple(argv)))
        else:
            continue  # rendered headers are included, not compiled
        objects.append(obj)
    link = [str(toolchain.host_compiler), *objects, "-o", module_file, *flags["link"],
            f"-L{tvm.lib_dir}", f"-l{tvm.lib_name}"]
    if gpu:
        link += [f"-L{toolchain.lib_dir}", f"-l{toolchain.runtime_lib}", f"-Wl,-rpath,{toolchain.lib_dir}"]
    return [compiles, [Step("link", tuple(link))]]


# ----------------------------------------------------------------------------- execution

_SLOTS_LOCK = threading.Lock()
_SLOTS: threading.BoundedSemaphore | None = None
_SLOT_COUNT = 0
_BUILDS = 0


def set_parallelism(jobs: int) -> None:
    """Allow at most ``jobs`` concurrent compiler processes in this process."""
    global _SLOTS, _SLOT_COUNT
    with _SLOTS_LOCK:
        _SLOT_COUNT = max(1, int(jobs))
        _SLOTS = threading.BoundedSemaphore(_SLOT_COUNT)


def parallelism() -> int:
    """The current compiler-process limit (set from the ``jobs`` setting on first build)."""
    if _SLOTS is None:
        from .cache import jobs

        set_parallelism(jobs()[0])
    return _SLOT_COUNT


def build_counter() -> int:
    """How many variant builds this process has started (tests: a hit must not change it)."""
    return _BUILDS


class StepFailed(Exception):
    """A step exited non-zero; carries its command and captured output."""

    def __init__(self, step: Step, returncode: int, output: str) -> None:
        super().__init__(f"{step.label} failed with exit status {returncode}")
        self.step = step
        self.returncode = returncode
        self.output = output


@dataclass
class _Result:
    step: Step
    returncode: int
    output: str
    seconds: float


def _run_one(step: Step, cwd: Path, timeout: float | None) -> _Result:
    assert _SLOTS is not None
    with _SLOTS:
        start = time.perf_counter()
        env = dict(os.environ, **step.env) if step.env else None
        try:
            proc = subprocess.run(step.argv, cwd=cwd, env=env, capture_output=True, text=True,
                                  errors="replace", timeout=timeout, check=False)
            code, output = proc.returncode, (proc.stdout + proc.stderr)
        except FileNotFoundError as exc:
            code, output = 127, f"{exc}"
        except subprocess.TimeoutExpired as exc:
            code, output = 124, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
        return _Result(step, code, output, time.perf_counter() - start)


def run_steps(stages: Sequence[Sequence[Step]], cwd: Path, log_path: Path, *, verbose: bool = False,
              timeout: float | None = 3600.0) -> list[tuple[str, float]]:
    """Run the stages in order (steps of a stage in parallel); append everything to ``log_path``.

    Returns ``[(label, seconds)]``; raises ``StepFailed`` for the first failing step of a stage
    after every step of that stage has finished.
    """
    global _BUILDS
    parallelism()
    with _SLOTS_LOCK:
        _BUILDS += 1
    timings: list[tuple[str, float]] = []
    with open(log_path, "a", encoding="utf-8") as log:
        for stage in stages:
            with ThreadPoolExecutor(max_workers=max(1, len(stage)), thread_name_prefix="fc-build") as pool:
                results = list(pool.map(lambda step: _run_one(step, cwd, timeout), stage))
            failed: _Result | None = None
            for res in results:
                log.write(f"$ {res.step.command}\n{res.output}")
                if res.output and not res.output.endswith("\n"):
                    log.write("\n")
                log.write(f"# {res.step.label}: exit {res.returncode}, {res.seconds:.2f} s\n\n")
                timings.append((res.step.label, res.seconds))
                if verbose:
                    logging.getLogger("flashcompress.jit").info("%s (%.2f s)\n$ %s\n%s", res.step.label,
                                                                res.seconds, res.step.command, res.output)
                if res.returncode != 0 and failed is None:
                    failed = res
            log.flush()
            if failed is not None:
                raise StepFailed(failed.step, failed.returncode, failed.output)
    return timings


_ERROR_LINE = re.compile(r"(\berror\b|fatal|undefined reference|cannot find|multiple definition|"
                         r"not found|No such file|Killed|timed out)", re.IGNORECASE)


def first_error_lines(output: str, limit: int = 12) -> list[str]:
    """The first compiler diagnostic and the lines following it (caret, notes), at most ``limit``."""
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            return lines[index:index + limit]
    return lines[-limit:]
