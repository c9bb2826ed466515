"""Programmatic dependent launch: no global-memory access before the wait, and where each kernel
triggers its dependents (CPU, needs nvcc).

On SM90 the decode kernel, prefill pass 1 and the standalone store kernel are launched as
programmatic dependents of the stream's previous kernel (jit_kernel/ptx.cuh, launch.h): they may run
while that kernel still writes, so each must execute ``griddepcontrol.wait`` before its first
global-memory access, and may let its own dependents launch (``griddepcontrol.launch_dependents``)
only after that wait (a dependent may read, before its own wait, what the kernel two back wrote).
This test compiles variants to PTX for sm_90a and checks that order in each kernel's text (every
device function is inlined, so a kernel's PTX follows its program order). The two write passes of
prefill (``write_kernel``, the online write list) read their input before their wait by design:
they are dependents of pass 1, which triggers them only at its end, after its own wait.
A second test checks each kernel's trigger position: right after the wait (before any global
access) in the standalone store and C4 decode, after the block's first global access elsewhere.
A third checks the write passes of every tiling: input loads before the wait, every state store
after the last wait, no trigger.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _jit_helpers import ptxas_report, requires_nvcc_only, variant_ptx
from flashcompress.cuda_ops.compress import TILINGS

pytestmark = requires_nvcc_only

F32 = {"in_dtype": "f32", "state_dtype": "f32", "out_dtype": "f32"}
VARIANTS = [
    ("store", {"head_dim": 512, "fmt": "v4", "dtype": "f32"}),
    ("store", {"head_dim": 128, "fmt": "idx_fp8", "dtype": "bf16"}),
    ("compress", {"ratio": 4, "online": False, "head_dim": 512, "store": "v4", **F32}),
    ("compress", {"ratio": 4, "online": False, "head_dim": 128, "store": "idx_fp8", **F32}),
    ("compress", {"ratio": 128, "online": False, "head_dim": 512, "store": "v4", **F32}),
    ("compress", {"ratio": 128, "online": True, "head_dim": 512, "store": "none", **F32}),
]
# Any access to global memory (loads, stores, atomics, async copies from global, prefetches);
# parameter, shared-memory and mbarrier instructions do not count.
_GLOBAL = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld\.global|st\.global|red\.global|atom\.global|cp\.async(?!\.(?:commit|wait))"
                     r"|cp\.reduce\.async|prefetch\.global|prefetchu|ld\.volatile\.global|st\.async|ld\.(?:weak|relaxed|acquire)\.\w+\.global)",
                     re.M)
_WAIT = "griddepcontrol.wait"
_TRIGGER = "griddepcontrol.launch_dependents"


def _ptx(family: str, params: dict, tmp: Path) -> str:
    return variant_ptx(family, params, tmp)


def _entries(ptx: str) -> dict[str, str]:
    """Kernel (mangled name) -> its PTX body."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^\.visible \.entry (\S+?)\(", ptx, re.M)]
    bodies = {}
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(ptx)
        bodies[name] = ptx[pos:end]
    return bodies


def _is_dependent(demangled: str) -> bool:
    """Kernels launched as programmatic dependents of an arbitrary previous kernel."""
    if "store_kernel" in demangled or re.search(r"compress::(?:c4_)?decode_kernel", demangled):
        return True
    return "prefill_kernel" in demangled and "::Pass)1>" in demangled


@pytest.mark.parametrize("family,params", VARIANTS, ids=[f"{f}-{'-'.join(str(v) for v in p.values())}" for f, p in VARIANTS])
def test_no_global_access_before_the_wait(tmp_path, family, params) -> None:
    ptx = _ptx(family, params, tmp_path)
    bodies = _entries(ptx)
    names = ptxas_report().demangle(list(bodies))
    checked = 0
    for mangled, body in bodies.items():
        if not _is_dependent(names[mangled]):
            continue
        checked += 1
        wait = body.find(_WAIT)
        assert wait >= 0, f"{names[mangled]}: no {_WAIT}"
        first = _GLOBAL.search(body)
        assert first is not None, f"{names[mangled]}: no global-memory access found (pattern out of date?)"
        assert first.start() > wait, (f"{names[mangled]}: '{first.group(0).strip()}' before {_WAIT}:\n"
                                      f"{body[max(0, first.start() - 400):first.start() + 80]}")
        trigger = body.find(_TRIGGER)
        assert trigger < 0 or trigger > wait, f"{names[mangled]}: {_TRIGGER} before {_WAIT}"
    assert checked >= (1 if family == "store" else 2), f"dependent kernels checked: {checked}"


def _triggers_early(demangled: str) -> bool:
    """The kernels that let their dependents launch right after their wait (ptx.cuh,
    pdl_enter<true>): grids that fill every block slot, the store and C4 decode."""
    return "store_kernel" in demangled or bool(re.search(r"decode_kernel<(?:flashcompress::)?(?:compress::)?Cfg<4,", demangled))


@pytest.mark.parametrize("family,params", VARIANTS, ids=[f"{f}-{'-'.join(str(v) for v in p.values())}" for f, p in VARIANTS])
def test_trigger_position_per_kernel(tmp_path, family, params) -> None:
    """Early kernels trigger before their first global-memory access; the others only after it
    (once a block's work is done)."""
    ptx = _ptx(family, params, tmp_path)
    bodies = _entries(ptx)
    names = ptxas_report().demangle(list(bodies))
    seen = set()
    for mangled, body in bodies.items():
        name = names[mangled]
        if not _is_dependent(name):
            continue
        trigger = body.find(_TRIGGER)
        assert trigger >= 0, f"{name}: no {_TRIGGER}"
        first = _GLOBAL.search(body, body.find(_WAIT))
        assert first is not None, f"{name}: no global-memory access after the wait"
        early = _triggers_early(name)
        seen.add(early)
        if early:
            assert trigger < first.start(), f"{name}: expected {_TRIGGER} right after the wait"
        else:
            assert trigger > first.start(), f"{name}: expected {_TRIGGER} after the block's work"
    expected = {True} if family == "store" else {params["ratio"] == 4, False}
    assert seen == expected, f"kernels checked (early?): {seen}"


def test_the_check_catches_an_early_access() -> None:
    """The order check itself: a load before the wait, and a trigger before it, are found."""
    bad = "ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1];\ngriddepcontrol.wait;\n"
    first = _GLOBAL.search(bad)
    assert first is not None and first.start() < bad.find(_WAIT)
    good = "ld.param.u64 %rd1, [p];\nst.shared.u32 [%r2], %r1;\ngriddepcontrol.wait;\n@%p1 ld.global.nc.v4.f32 {%f1}, [%rd1];\n"
    assert _GLOBAL.search(good).start() > good.find(_WAIT)


_STORE = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:st\.global|red\.global|atom\.global|st\.async"
                    r"|cp\.async\.bulk\.global)", re.M)
_LOAD = re.compile(r"^\s*(?:@!?%p\d+\s+)?ld\.global", re.M)


def _is_write_pass(demangled: str) -> bool:
    return "write_kernel" in demangled or ("prefill_kernel" in demangled and "::Pass)2>" in demangled)


def _check_write_pass(name: str, body: str) -> None:
    """A write pass reads its input before its wait and writes the state only after one: each
    global store has a wait before it in the text with no ``ret`` between them and no label
    between them that a branch before that wait jumps to (so every path to the store passes the
    wait); and it never triggers dependents of its own."""
    waits = [m.start() for m in re.finditer(re.escape(_WAIT), body)]
    assert waits, f"{name}: no {_WAIT}"
    stores = [m.start() for m in _STORE.finditer(body)]
    loads = [m.start() for m in _LOAD.finditer(body)]
    assert stores and loads, f"{name}: no global stores / loads found (pattern out of date?)"
    rets = [m.start() for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?ret;", body, re.M)]
    labels = {m.group(1): m.start() for m in re.finditer(r"^(\$\w+):", body, re.M)}
    branches = [(m.start(), m.group(1)) for m in re.finditer(r"\bbra(?:\.uni)?\s+(\$\w+);", body)]
    for st in stores:
        before = [w for w in waits if w < st]
        assert before, f"{name}: a global store before any {_WAIT}"
        w = before[-1]
        assert not any(w < r < st for r in rets), f"{name}: a global store after a ret, with no {_WAIT} between"
        for pos, label in branches:
            assert not (pos < w < labels.get(label, -1) < st), \
                f"{name}: a global store reached by a branch ({label}) past the {_WAIT}"
    assert min(loads) < min(waits), f"{name}: its input is read only after {_WAIT}"
    assert _TRIGGER not in body, f"{name}: a write pass triggers dependents"


@pytest.mark.parametrize("params", [
    {"ratio": 128, "online": True, "head_dim": 512, "store": "none", **F32},
    {"ratio": 128, "online": True, "head_dim": 512, "store": "v4", **F32},
    {"ratio": 128, "online": False, "head_dim": 512, "store": "none", **F32},
], ids=["online-none", "online-v4", "c128-none"])
@pytest.mark.parametrize("tiling", TILINGS)
def test_write_pass_loads_before_its_wait_and_stores_after(tmp_path, params: dict, tiling: str) -> None:
    """Every tiling's prefill write pass (ring rows alias: pass 1's reads precede its writes):
    the window / input loads fly before the wait, every state store follows it."""
    ptx = _ptx("compress", {**params, "tiling": tiling}, tmp_path)
    bodies = _entries(ptx)
    names = ptxas_report().demangle(list(bodies))
    checked = [names[m] for m in bodies if _is_write_pass(names[m])]
    assert len(checked) == 1, f"write passes found: {checked}"
    for mangled, body in bodies.items():
        if _is_write_pass(names[mangled]):
            _check_write_pass(names[mangled], body)


def test_the_write_pass_check_catches_an_early_store() -> None:
    good = ("ld.global.u32 %r1, [%rd1];\ngriddepcontrol.wait;\nbar.sync 0;\ngriddepcontrol.wait;\n"
            "st.global.f32 [%rd2], %f1;\n")
    _check_write_pass("good", good)
    bad = "ld.global.u32 %r1, [%rd1];\n@%p1 st.global.f32 [%rd2], %f1;\ngriddepcontrol.wait;\n"
    with pytest.raises(AssertionError, match="store before"):
        _check_write_pass("bad", bad)
    after_ret = "ld.global.u32 %r1, [%rd1];\ngriddepcontrol.wait;\nret;\n$L1:\nst.global.f32 [%rd2], %f1;\n"
    with pytest.raises(AssertionError, match="after a ret"):
        _check_write_pass("after_ret", after_ret)
    jumped = ("ld.global.u32 %r1, [%rd1];\n@%p1 bra $L1;\ngriddepcontrol.wait;\n$L1:\n"
              "st.global.f32 [%rd2], %f1;\n")
    with pytest.raises(AssertionError, match="branch"):
        _check_write_pass("jumped", jumped)
    late = "griddepcontrol.wait;\nld.global.u32 %r1, [%rd1];\nst.global.f32 [%rd2], %f1;\n"
    with pytest.raises(AssertionError, match="read only after"):
        _check_write_pass("late", late)
