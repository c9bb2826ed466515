"""The op benchmarks' CPU smoke mode runs and prints its tables (the scripts themselves run on a GPU).

Each script runs once, in one subprocess, with ``--device cpu`` (tiny sizes, the
PyTorch backend); the test checks the exit status, the header columns and one row per
expected (case, layer), and the markdown table that ``--md`` appends.  The op scripts run
a second time with ``--peer`` on one case: on the CPU the peer (SGLang's CUDA kernels)
is unavailable, so its columns read ``-`` with the reason once, and the flashcompress
columns still print.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

OP_COLUMNS = ["case", "layer", "cold us", "graph us", "min MB", "GB/s", "% copy", "peer", "target", "ok"]
CASES = ["decode-B2-rand", "decode-B2-bnd", "prefill-300"]

SCRIPTS = {
    "compress": (["--md", "{md}"], ["c4-512", "c4-128", "c128-512", "c128-online"]),
    "store": (["--md", "{md}"], ["c4-512 v4@64", "c4-128 fp8@64", "c4-128 fp4@64", "c128-512 v4@2"]),
    "pipeline": (["--md", "{md}"], ["c4-512 v4@64", "c4-128 fp8@64", "c128-512 v4@2", "c128-online v4@2"]),
    "host_overhead": (["--iters", "5", "--batch", "8"], []),
    "plans": (["--iters", "3"], []),
}


PEER_COLUMNS = ["cold us", "clean us", "graph us", "peer cold", "peer clean", "peer graph", "fc/peer cold",
                "fc/peer clean", "fc/peer graph", "min MB", "GB/s", "% copy", "peer % copy", "% copy clean",
                "peer % copy clean", "vs peer"]
PEER_CASE = "decode-B2-rand"

# One subprocess runs every script as ``python benchmarks/bench_X.py ...`` would (``runpy`` with
# ``__main__``), one after the other: a single torch import keeps the test fast on a busy machine.
_DRIVER = r"""
import contextlib, io, json, runpy, sys, traceback
bench, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, bench)
results = {}
for name, argv in jobs:
    path = f"{bench}/bench_{name.split(':')[-1]}.py"
    sys.argv = [path, *argv]
    out, err, rc = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc(file=err)
            rc = 1
    results[name] = [rc, out.getvalue(), err.getvalue()]
sys.__stdout__.write("\n@@RESULTS@@" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    tmp = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.pop("FLASHCOMPRESS_DEBUG", None)
    jobs, mds = [], {}
    for name, (extra, _) in SCRIPTS.items():
        mds[name] = tmp / f"{name}.md"
        jobs.append([name, ["--device", "cpu", *[a.format(md=mds[name]) for a in extra]]])
    for name in ("compress", "store", "pipeline"):
        mds[f"peer:{name}"] = tmp / f"peer-{name}.md"
        jobs.append([f"peer:{name}", ["--device", "cpu", "--peer", "--cases", PEER_CASE,
                                      "--md", str(mds[f"peer:{name}"])]])
    for name in ("compress", "pipeline"):
        mds[f"bf16:{name}"] = tmp / f"bf16-{name}.md"
        jobs.append([f"bf16:{name}", ["--device", "cpu", "--in-dtype", "bf16", "--cases", "prefill-300",
                                      "--md", str(mds[f"bf16:{name}"])]])
    for name, extra in (("v41", []), ("peer:v41", ["--peer"])):  # bench_v41.py: its own four CPU cases
        mds[name] = tmp / f"{name.replace(':', '-')}.md"
        jobs.append([name, ["--device", "cpu", *extra, "--md", str(mds[name])]])
    cmd = [sys.executable, "-c", _DRIVER, str(BENCH), json.dumps(jobs)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "@@RESULTS@@" in proc.stdout, f"driver failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout.split("@@RESULTS@@", 1)[1])
    return {name: (subprocess.CompletedProcess(name, rc, out, err), mds[name])
            for name, (rc, out, err) in results.items()}


def _table(stdout: str, first_column: str) -> tuple[list[str], list[list[str]]]:
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:1] == [first_column] and i + 1 < len(lines) and set(lines[i + 1].replace(" ", "")) == {"-"}:
            return line, [ln for ln in lines[i + 2:] if ln.strip()]
    raise AssertionError(f"no table starting with column {first_column!r} in:\n{stdout}")


@pytest.mark.parametrize("name", ["compress", "store", "pipeline"])
def test_op_benchmark_prints_its_table(runs, name):
    proc, md = runs[name]
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout, "case")
    for col in OP_COLUMNS:
        assert col in head, f"column {col!r} missing from {head!r}"
    if name == "pipeline":
        assert "path" in head and "fused x" in head
    layers = SCRIPTS[name][1]
    for case in CASES:
        for layer in layers:
            hits = [r for r in rows if r.startswith(case + " ") and f" {layer} " in r]
            want = 2 if name == "pipeline" else 1
            assert len(hits) == want, f"{name}: expected {want} row(s) for {case} / {layer}, got {hits}"
    # every row has a finite cold time and a positive byte count
    for r in rows[: len(CASES) * len(layers)]:
        cells = r.split()
        assert any(c.replace(".", "", 1).isdigit() for c in cells), r
    text = md.read_text()
    assert text.startswith("### bench_"), text[:200]
    assert "| " + " | ".join(OP_COLUMNS[:2]) in text
    assert text.count("\n| decode-B2-rand |") >= len(layers)


@pytest.mark.parametrize("name", ["compress", "pipeline"])
def test_bf16_input_rows(runs, name):
    """``--in-dtype bf16``: every fp32-capable layer gets a row marked ``bf16`` (the online layer,
    fp32 only, none), with half the fp32 run's input bytes in its byte model."""
    proc, _ = runs[f"bf16:{name}"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = _table(proc.stdout, "case")
    for layer in SCRIPTS[name][1]:
        hits = [r for r in rows if r.startswith("prefill-300 ") and f" {layer} bf16 " in r]
        want = 0 if "online" in layer else (2 if name == "pipeline" else 1)
        assert len(hits) == want, f"{name}: expected {want} bf16 row(s) for {layer}, got {hits}"
    fp32 = {r["layer"]: float(r["min MB"]) for r in _records(runs[name][0].stdout) if r["case"] == "prefill-300"}
    bf16 = {r["layer"].removesuffix(" bf16"): float(r["min MB"]) for r in _records(proc.stdout)}
    for layer, mb in bf16.items():
        assert 0.4 * fp32[layer] < mb < 0.75 * fp32[layer], (layer, mb, fp32[layer])


def _records(stdout: str) -> list[dict[str, str]]:
    """The printed table as one dict per row, cut at the column spans of the dashed rule."""
    lines = stdout.splitlines()
    for i in range(1, len(lines)):
        if lines[i].strip() and set(lines[i].replace(" ", "")) == {"-"} and lines[i - 1].startswith("case"):
            spans, pos = [], 0
            for dash in lines[i].split("  "):
                if dash:
                    spans.append((pos, pos + len(dash)))
                    pos += len(dash)
                pos += 2
            names = [lines[i - 1][a:b].strip() for a, b in spans]
            rows = [ln for ln in lines[i + 1:] if ln.strip()]
            rows = rows[: next((k for k, ln in enumerate(rows) if ":" in ln[: spans[0][1]]), len(rows))]
            return [{n: r[a:b].strip() for n, (a, b) in zip(names, spans)} for r in rows]
    raise AssertionError(f"no table in:\n{stdout}")


@pytest.mark.parametrize("name", ["compress", "store", "pipeline"])
def test_peer_columns_degrade_on_cpu(runs, name):
    """``--peer`` on the CPU: the peer columns are ``-``, the reason is printed once, fc rows are complete."""
    proc, md = runs[f"peer:{name}"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout, "case")
    for col in PEER_COLUMNS:
        assert col in head, f"column {col!r} missing from {head!r}"
    layers = SCRIPTS[name][1]
    assert len(rows) == len(layers) * (2 if name == "pipeline" else 1), rows
    for by in _records(proc.stdout):  # the flashcompress side measured, the peer side absent
        assert by["case"] == PEER_CASE
        assert float(by["cold us"]) > 0 and float(by["min MB"]) > 0, by
        assert by["peer cold"] == by["fc/peer cold"] == by["peer graph"] == by["vs peer"] == "-", by
    # one reason, in the header: no wheel installed, or (with one) CUDA-only kernels
    assert proc.stdout.count("peer: - (") == 1, proc.stdout
    reason = proc.stdout.split("peer: - (", 1)[1].splitlines()[0]
    assert "no SGLang wheel" in reason or "CUDA-only" in reason, reason
    assert reason in md.read_text()


V41_ROWS = [("c1-decode-8", "v4"), ("c2-decode-8", "v4"), ("c2-prefill-2x16", "v4"), ("index-k-8", "index-k")]


@pytest.mark.parametrize("peer", [False, True])
def test_v41_benchmark_prints_its_table(runs, peer):
    """``bench_v41.py --device cpu [--peer]``: one row per V4.1 op case; with ``--peer`` the peer
    columns read ``-`` (reason once, in the header) and the flashcompress side is measured."""
    proc, md = runs["peer:v41" if peer else "v41"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout, "case")
    for col in (PEER_COLUMNS if peer else OP_COLUMNS[2:]):
        assert col in head, f"column {col!r} missing from {head!r}"
    recs = _records(proc.stdout)
    assert [(r["case"], r["layer"]) for r in recs] == V41_ROWS, recs
    for by in recs:
        assert float(by["cold us"]) > 0 and float(by["min MB"]) > 0, by
        if peer:
            assert by["peer cold"] == by["fc/peer cold"] == by["peer graph"] == by["vs peer"] == "-", by
    text = md.read_text()
    assert text.startswith("### bench_v41.py") and text.count("\n| c") == len(V41_ROWS), text[:400]
    if peer:
        assert proc.stdout.count("peer: - (") == 1, proc.stdout
        reason = proc.stdout.split("peer: - (", 1)[1].splitlines()[0]
        assert "no SGLang wheel" in reason or "CUDA-only" in reason, reason
        assert reason in text


def test_peer_module_finds_no_wheel_cleanly(tmp_path):
    """Without a wheel the peer is unavailable with a one-line reason (no exception)."""
    sys.path.insert(0, str(BENCH))
    try:
        import _peer
    finally:
        sys.path.remove(str(BENCH))
    old = os.environ.get("FC_PEER_SGLANG")
    os.environ["FC_PEER_SGLANG"] = str(tmp_path)
    try:
        root, version = _peer.find_wheel()
        if root is None:  # no sglang on sys.path / in /tmp/sgl either
            assert "no SGLang wheel" in version
            peer = _peer.Peer("cpu")
            assert not peer.available and "no SGLang wheel" in peer.reason
            with pytest.raises(_peer.PeerUnavailable):
                peer.module(peer.plan_spec())
    finally:
        if old is None:
            os.environ.pop("FC_PEER_SGLANG")
        else:
            os.environ["FC_PEER_SGLANG"] = old


def test_peer_module_specs_name_the_peer_entry_points():
    """The generated wrapper exports the peer's class templates with the getters' template arguments."""
    sys.path.insert(0, str(BENCH))
    try:
        import _peer
    finally:
        sys.path.remove(str(BENCH))
    peer = _peer.Peer("cpu", mode="build", arch="9.0a")
    peer.root = peer.root or Path("/nonexistent")
    c4 = peer.compress_spec(4, 512, False)
    assert dict(c4.exports)["decode"] == "FlashCompress4Kernel<512, fp32_t, fp32_t, fp32_t, true>::run_decode"
    assert c4.fast_math and c4.header == "deepseek_v4/c4_v2.cuh"
    on = peer.compress_spec(128, 512, True)
    assert dict(on.exports)["prefill"] == "FlashCompress128OnlineKernel<512, fp32_t, true>::run_prefill"
    st = peer.store_spec(__import__("torch").float32, 128, 64)
    want = "FusedNormRopeKernel<fp32_t, 128, 64, 64, 0, false, V4, true>::forward_fp4"
    assert dict(st.exports)["forward_fp4"] == want
    src = peer._wrapper_source(c4)
    assert "namespace sglang {" in src and "TVM_FFI_DLL_EXPORT_TYPED_FUNC(decode, (FlashCompress4Kernel<" in src
    with pytest.raises(_peer.PeerUnavailable):
        peer.compress_spec(128, 128, True)
    # V4.1 (bench_v41.py --peer): the getters' template arguments, the layout as its C++ enumerator
    c1, c2, ik = _peer.v41_specs(peer, "v41_fp4")
    assert dict(c1.exports) == {"decode_fusion": "FlashCompress1Kernel<512, 64, 256, V41_FP4, true>::run_decode_fusion"}
    k2 = "FlashCompress2Kernel<512, 64, 128, V41_FP4, true>::run_"
    assert dict(c2.exports) == {"decode_fusion": k2 + "decode_fusion", "prefill_fusion": k2 + "prefill_fusion"}
    assert dict(ik.exports) == {"index_k": "IndexKKernel<128, 64, 64, 1, true>::run_index_k"}
    assert (c1.header, c2.header, ik.header) == ("deepseek_v4/c1.cuh", "deepseek_v4/c2.cuh",
                                                 "deepseek_v4/fp4_indexer_rope.cuh")


def test_v41_peer_calls_follow_the_peer_signatures():
    """Each bench_v41 case hands the peer's module entry point the arguments its host checks expect
    (``c1.cuh`` / ``c2.cuh`` / ``fp4_indexer_rope.cuh`` TensorMatchers), on the case's own buffers."""
    import torch

    sys.path.insert(0, str(BENCH))
    try:
        import _peer
        import bench_v41
    finally:
        sys.path.remove(str(BENCH))
    from flashcompress.v41.layouts import KVLayout

    seen: dict[str, tuple] = {}

    class Stub:
        def __getattr__(self, entry):
            return lambda *a: seen.__setitem__(entry, a)

    peer = _peer.Peer("cpu", mode="build", arch="9.0a")
    peer.reason, peer.module = "", lambda spec: Stub()  # no build: record the launch arguments
    lay, f32, bf16, i64, u8 = KVLayout.V4, torch.float32, torch.bfloat16, torch.int64, torch.uint8

    def sig(a):
        return [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t for t in a]

    for op, n, entry in (("c1", 8, "decode_fusion"), ("c2_decode", 8, "decode_fusion"),
                         ("c2_prefill", 32, "prefill_fusion"), ("index_k", 8, "index_k")):
        case = bench_v41.build(op, n, lay, torch.device("cpu"), torch.Generator().manual_seed(0))
        seen.clear()
        case.peer(peer)()
        a = seen[entry]
        if op == "c1":  # kv_input, out, norm_weight, freqs, positions, out_loc, cache, eps
            assert sig(a)[:4] == [((n, 512), bf16), ((n, 512), bf16), ((512,), bf16), ((65536, 64), f32)]
            assert a[1] is case.written[0] and a[6] is case.written[1] and a[6].shape[1] == lay.page_bytes(256)
        elif op.startswith("c2"):  # kv_input, kv_state, out, norm_weight, positions, req, raw_out_loc, eps, freqs,
            s = sig(a)             # cache, ring_size, draft_len | extend_start_loc, extend_seq_lens
            assert s[0] == ((n, 1024), f32) and s[1][0][1] == 1024 and s[1][1] == f32 and s[2] == ((n, 512), bf16)
            assert s[3] == ((512,), bf16) and s[5] == ((n,), i64) and s[8] == ((65536, 64), f32) and a[10] == 2
            assert a[1] is case.state[0] and a[9] is case.written[1] and a[9].shape[1] == lay.page_bytes(128)
            if op == "c2_prefill":
                assert s[11] == s[12] == ((2,), torch.int32)
        else:  # input, norm_weight, freqs, positions, loc, cache, eps
            s = sig(a)
            assert s[:3] == [((n, 128), bf16), ((128,), bf16), ((65536, 64), f32)] and s[4] == ((n,), i64)
            assert s[5][1] == u8 and s[5][0][1] == 64 * 68 and a[5] is case.written[0]


def test_host_overhead_prints_both_modes(runs):
    proc, _ = runs["host_overhead"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout, "call")
    assert "host us/call" in head
    for op in ("compress_forward", "compress_norm_rope_store", "compress_and_store"):
        modes = [r for r in rows if r.startswith(op + " ")]
        assert any("stub:" in r for r in modes) and any("full:" in r for r in modes), rows


def test_plans_prints_the_host_stage0_table(runs):
    """``bench_plans.py --device cpu``: one row per (size, mode), both stage-0 paths timed and byte-checked."""
    proc, _ = runs["plans"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout, "case")
    for col in ("torch s0 us", "native s0 us", "api torch us", "api native us"):
        assert col in head, f"column {col!r} missing from {head!r}"
    for size in ("8192 tok / 4 req", "32768 tok / 8 req"):
        modes = [r.split()[5] for r in rows if r.startswith(size)]
        assert modes == ["c4-paged-r8", "c128-r128", "c128-online"], rows
    for row in rows:
        assert all(float(x) > 0 for x in row.split()[6:]), row


def test_byte_model_matches_the_issue_sizes():
    """The byte model reproduces the issue tables' sizes (272 MB C128 bnd decode, 73 / 290 MB C4 prefill)."""
    sys.path.insert(0, str(BENCH))
    try:
        import _common as C
    finally:
        sys.path.remove(str(BENCH))
    from flashcompress import layouts as L

    def mb(kind, layer, reqs, rows, w_rows=0, total=C.compress_total, *extra):
        s = C.InputSet(reqs, None, None, None, None, None, rows, w_rows)  # type: ignore[arg-type]
        b = C.compress_bytes(C.LAYERS[layer], s, kind == "decode")
        return (total(b) if not extra else total(C.LAYERS[layer], *extra, b)) / 1e6

    bnd = [C.Request(i, 128 * 100 - 1, 128 * 100) for i in range(512)]
    assert abs(mb("decode", "c128-512", bnd, 512) - 272) < 1
    assert abs(mb("decode", "c128-512", bnd, 512, 0, C.pipeline_total, C.STORE_V4_C128) - 271) < 1
    pre = [C.Request(i, 1001 + 5000 * i, 1001 + 5000 * i + 2048) for i in range(4)]
    assert abs(mb("prefill", "c4-512", pre, 2048, 0) - 73) < 1.5
    assert abs(mb("prefill", "c128-online", pre, 64, 0) - 34) < 1
    # decode C4 at a boundary: 7 halves of 2H fp32 from the state, one 4H row written
    one = [C.Request(1, 4095, 4096)]
    s = C.InputSet(one, None, None, None, None, None, 1, 0)  # type: ignore[arg-type]
    b = C.compress_bytes(C.LAYERS["c4-512"], s, True)
    assert b.state_read == 7 * 2 * 512 * 4 and b.state_write == 4 * 512 * 4 and b.events == 1
    per_row = 512 * 4 + 256 + 8 + L.MAIN_V4.bytes_per_token  # kv, freq row, out_loc, entry
    assert C.store_total(C.LAYERS["c4-512"], C.STORE_V4_C4, b) == 16 + per_row + 512 * 4
    # bf16 input: input rows and ape at 2 bytes, out rows in the input dtype, state reads fp32
    import torch

    pre1 = [C.Request(0, 1001, 1001 + 2048)]
    f32 = C.compress_bytes(C.LAYERS["c4-512"], C.InputSet(pre1, None, None, None, None, None, 512, 0), False)
    t = torch.empty(0, dtype=torch.bfloat16)
    b16 = C.compress_bytes(C.LAYERS["c4-512"], C.InputSet(pre1, None, t, t, None, None, 512, 0), False)
    assert b16.inp * 2 == f32.inp and b16.ape * 2 == f32.ape and b16.out * 2 == f32.out
    assert b16.state_read == f32.state_read and b16.kv_bytes == 2 and f32.kv_bytes == 4


def test_decode_scenarios_have_exact_boundary_counts():
    import random

    sys.path.insert(0, str(BENCH))
    try:
        import _common as C
    finally:
        sys.path.remove(str(BENCH))
    for b in (1, 32, 128, 512):
        rand = C._decode_lengths(random.Random(b), C.CaseSpec("d", "decode", b, "rand"))
        assert len(rand) == b and all(1024 <= s <= 65536 for s in rand)
        assert sum(s % 4 == 0 for s in rand) == round(b / 4)
        assert sum(s % 128 == 0 for s in rand) == round(b / 128)
        bnd = C._decode_lengths(random.Random(b), C.CaseSpec("d", "decode", b, "bnd"))
        assert all(s % 128 == 0 and 1024 <= s <= 65536 for s in bnd)
        opened = C._decode_lengths(random.Random(b), C.CaseSpec("d", "decode", b, "open"))
        assert sum(s % 4 == 0 for s in opened) == round(b / 4) and not any(s % 128 == 0 for s in opened)
    pre = C._prefill_requests(random.Random(0), C.CaseSpec("p", "prefill", 8, tokens=32768))
    assert sum(s - p for p, s in pre) == 32768 and all(p % 4 and s <= 65536 for p, s in pre)


def test_diagnostic_cases_run_only_when_named():
    """``decode-B512-open`` joins a GPU run only when a --cases filter selects it by name."""
    import torch

    sys.path.insert(0, str(BENCH))
    try:
        import _common as C
    finally:
        sys.path.remove(str(BENCH))
    gpu, layers = torch.device("cuda"), ["c128-512"]

    def names(short: bool, filters: list[str]) -> list[str]:
        return [c.name for c in C.select_cases(gpu, short, filters, layers)]

    assert "decode-B512-open" not in names(False, []) and "decode-B512-open" not in names(True, [])
    assert names(False, ["decode-B512-open"]) == ["decode-B512-open"]
    assert "decode-B512-open" in names(False, ["decode-B512"]) and "decode-B512-rand" in names(False, ["decode-B512"])
    assert "decode-B512-open" not in [c.name for c in C.select_cases(torch.device("cpu"), False, ["open"], layers)]


def test_peer_delta_compares_from_one_snapshot():
    """``vs peer``: both sides start from the same state; float outputs by max diff, caches by bytes."""
    import torch

    sys.path.insert(0, str(BENCH))
    try:
        import _common as C
    finally:
        sys.path.remove(str(BENCH))
    state, out, cache = torch.ones(4), torch.zeros(3), torch.zeros(8, dtype=torch.uint8)

    def ours():
        state.add_(1.0)  # not idempotent: the second side must see the snapshot again
        out.copy_(state[:3] * 2)
        cache[:2] = 7

    def theirs(bump=0.5):
        state.add_(1.0)
        out.copy_(state[:3] * 2 + bump)
        cache[:3] = 7

    text = C.peer_delta(ours, theirs, [out, cache], [state])
    assert text == "d=5.0e-01 1B", text
    assert torch.equal(state, torch.ones(4))  # restored
    assert C.peer_delta(ours, lambda: theirs(0.0), [out], [state]) == "d=0.0e+00"
    assert C.peer_delta(ours, lambda: 1 / 0, [out], [state]).startswith("failed (ZeroDivisionError")


def test_store_benchmark_adds_the_layouts_of_its_env_knob(monkeypatch):
    """``FC_BENCH_STORE_LAYOUTS=v41,v41_fp4_new``: the V4 rows, then a C4 and a C128 row per layout
    (their byte model counts the layout's entry); without it the V4 rows only."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", FC_BENCH_STORE_LAYOUTS="v41,v41_fp4_new")
    env.pop("FLASHCOMPRESS_DEBUG", None)
    cmd = [sys.executable, str(BENCH / "bench_store.py"), "--device", "cpu", "--cases", PEER_CASE]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = _table(proc.stdout, "case")
    layers = [r.split()[1] + " " + r.split()[2] for r in rows]
    assert layers == ["c4-512 v4@64", "c4-128 fp8@64", "c4-128 fp4@64", "c128-512 v4@2", "c4-512 v41@64",
                      "c128-512 v41@2", "c4-512 v41_fp4_new@64", "c128-512 v41_fp4_new@2"], layers
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delenv("FC_BENCH_STORE_LAYOUTS", raising=False)
    import bench_store

    assert [k[0] for k in bench_store.layout_kinds("uniform_fp8")] == ["c4-512 uniform_fp8@64",
                                                                       "c128-512 uniform_fp8@2"]
    with pytest.raises(ValueError, match="layout"):
        bench_store.layout_kinds("v5")
