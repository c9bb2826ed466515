"""Prewarm: expand a variant set (specs, model presets, --all) and build it in parallel.

Used by ``flashcompress prewarm``; usable from Python too::

    keys = variant_set(models=["deepseek-v4-flash"])
    results = run_prewarm(keys, jobs=4)

Targets: explicit ``archs``, else the configured/visible GPU, else every arch in
``default_cuda_archs`` (``default_hip_archs`` for HIP) — a GPU-less build box
prewarms everything a deployment may need.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .family import discover_families, get_family, parse_spec
from .settings import get_settings
from .variant import VariantKey, detect_backend, detect_target, normalize_target

__all__ = ["PrewarmResult", "prewarm_jobs", "prewarm_targets", "run_prewarm", "variant_set", "warm_launch",
           "warm_launch_skipped"]

FAILED = "failed"


@dataclass
class PrewarmResult:
    """What happened to one variant during a prewarm."""

    key: VariantKey
    status: str  # "hit" | "waited" | "built" | "rebuilt" | "failed"
    seconds: float
    path: Path | None
    error: BaseException | None = None
    warmup: str | None = None  # None (not run), "ok", or "failed: ..."

    @property
    def ok(self) -> bool:
        """Built or found, and (if run) warm-launched without error."""
        return self.status != FAILED and not (self.warmup or "").startswith("failed")


def prewarm_targets(archs: Sequence[str] | None = None) -> list[str]:
    """Targets to build: explicit ``archs``, else the process target if a GPU or an override exists,
    else every configured default arch of the backend."""
    if archs:
        return list(dict.fromkeys(normalize_target(a) for a in archs))
    settings = get_settings()
    backend = detect_backend()
    override = settings.cuda_arch if backend == "cuda" else settings.hip_arch
    import torch

    if override or torch.cuda.is_available():
        return [detect_target()]
    defaults = settings.default_cuda_archs if backend == "cuda" else settings.default_hip_archs
    if not defaults:
        return [detect_target()]
    return list(dict.fromkeys(normalize_target(f"{backend}:{a.split(':')[-1]}") for a in defaults))


def variant_set(
    specs: Sequence[str] = (),
    *,
    models: Sequence[str] = (),
    all_variants: bool = False,
    archs: Sequence[str] | None = None,
) -> list[VariantKey]:
    """The de-duplicated, ordered list of keys selected by specs, model presets and ``--all``.

    ``specs`` are ``family[:name=value,...]``; missing params expand over the family's space.
    """
    targets = prewarm_targets(archs)
    families = discover_families() if all_variants or models else {}
    everything: list[tuple[str, dict]] = []
    if all_variants:
        for fam in families.values():
            if fam.space is None:
                continue  # no declared space: nothing to enumerate
            everything += [(fam.name, p) for p in fam.expand()]
    explicit: list[tuple[str, dict]] = []
    for spec in specs:
        name, partial = parse_spec(spec)
        explicit += [(name, p) for p in get_family(name).expand(partial)]
    keys: dict[VariantKey, None] = {}
    for target in targets:
        # Model presets may depend on the target (e.g. the V4.1 cache layouts of Hopper vs SM100).
        presets = [(fam.name, p) for model in models for fam in families.values()
                   for p in fam.preset_params(model, target)]
        for name, params in everything + presets + explicit:
            keys[get_family(name).key(target, **params)] = None
    return list(keys)


def prewarm_jobs(requested: int | None = None) -> tuple[int, str | None]:
    """Compiler processes for a prewarm, and a note when a cap applied.

    ``requested`` (``-j N``, N >= 1) or, when None, the ``jobs`` setting; either is capped by
    available memory (~2 GiB per compiler, ``cache.jobs``) and by the CPU cores.
    """
    from .cache import cpu_cores, jobs

    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
        raise ValueError(f"jobs: expected an int >= 1, got {requested!r}")
    n, note = jobs(requested or 0)
    cores = cpu_cores()
    if requested and n > cores:
        return cores, f"-j {requested} capped to {cores} by CPU cores"
    return n, note


def run_prewarm(
    keys: Iterable[VariantKey],
    *,
    jobs: int,
    force: bool = False,
    progress: Callable[[int, int, PrewarmResult], None] | None = None,
    started: Callable[[VariantKey], None] | None = None,
) -> list[PrewarmResult]:
    """Build or load every key with at most ``jobs`` compiler processes; results in input order.

    ``started(key)`` is called when work on a key begins and ``progress(done, total, result)``
    when it ends (both from worker threads).  Failures are captured in the results, never raised.
    """
    from . import build
    from .engine import acquire

    key_list = list(keys)
    build.set_parallelism(jobs)
    results: list[PrewarmResult | None] = [None] * len(key_list)
    done = 0
    done_lock = threading.Lock()

    def one(index: int, key: VariantKey) -> None:
        nonlocal done
        start = time.perf_counter()
        if started is not None:
            started(key)
        try:
            acquired = acquire(key, force=force or None)
            result = PrewarmResult(key, "hit" if acquired.status == "memo" else acquired.status,
                                   acquired.seconds, acquired.path)
        except Exception as exc:  # noqa: BLE001 - reported per variant
            result = PrewarmResult(key, FAILED, time.perf_counter() - start, None, exc)
        results[index] = result
        with done_lock:
            done += 1
            if progress is not None:
                progress(done, len(key_list), result)

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="fc-prewarm") as pool:
        for future in [pool.submit(one, i, k) for i, k in enumerate(key_list)]:
            future.result()
    return [r for r in results if r is not None]


def warm_launch_skipped(results: Sequence[PrewarmResult]) -> str | None:
    """Why ``warm_launch`` would launch nothing (no GPU, no variant of its target), or None."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU visible (torch.cuda.is_available() is False): the first process that uses a variant loads it"
    current = detect_target()
    if not any(r.status != FAILED and r.key.target == current for r in results):
        return f"no variant was built for this GPU's target {current}"
    return None


def warm_launch(results: Sequence[PrewarmResult]) -> int:
    """Launch each built variant of the current GPU's target once via its family's ``warmup`` hook
    (it only launches; byte comparisons live in the tests).

    Returns how many were launched; a no-op without a GPU.  Errors are recorded in ``result.warmup``.
    """
    if warm_launch_skipped(results) is not None:
        return 0
    current = detect_target()
    launched = 0
    for result in results:
        if result.status == FAILED or result.key.target != current:
            continue
        family = get_family(result.key.family)
        if family.warmup is None:
            continue
        try:
            family.warmup(result.key)
            result.warmup = "ok"
        except Exception as exc:  # noqa: BLE001
            result.warmup = f"failed: {type(exc).__name__}: {exc}"
        launched += 1
    return launched
