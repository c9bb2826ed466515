"""``flashcompress check`` and ``flashcompress.testing.check.run_check``.

On the CPU the check is a self-test: both sides run the PyTorch backend, so it must pass,
and a deliberately corrupted checked side (a flipped cache byte, a perturbed compressed
row, a changed state row, a wrong plan byte) must fail in exactly the column that sees
it.  Without a GPU, ``check`` on CUDA says so and exits non-zero.  The GPU run is in
``tests/test_gpu_check.py`` (``pytest -m gpu``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from flashcompress.testing import check as C


@pytest.fixture(scope="module")
def cpu_report() -> C.CheckReport:
    return C.run_check(device="cpu")


def test_cpu_self_test_passes_and_compares_every_cell(cpu_report: C.CheckReport) -> None:
    assert cpu_report.ok, cpu_report.table()
    assert [k.kind.name for k in cpu_report.kinds] == [
        "C4 main H512 V4", "C4 indexer H128 FP8", "C4 indexer H128 FP4", "C128 main H512 V4", "online C128 H512 V4"]
    for k in cpu_report.kinds:
        assert k.entries > 0, k.kind.name  # the script closes windows, so the cache checks see entries
        for c in C.CHECKS:
            assert k.compared[c] > 0 and k.status(c) == "PASS", (k.kind.name, c)
    table = cpu_report.table()
    assert "FAIL" not in table and table.rstrip().splitlines()[-1].startswith("PASS")


class _Corrupt(C.ApiBackend):
    """The checked side with one kind of damage, on the first call of the C128 layer kind."""

    def __init__(self, what: str):
        super().__init__("cpu")
        self.what = what

    def _hit(self, kind: C.LayerKind) -> bool:
        return kind.ratio == 128 and not kind.online

    def decode_plan(self, kind, world, rids, seq, slot_offset=0):
        plan = super().decode_plan(kind, world, rids, seq, slot_offset)
        if self.what == "plan" and self._hit(kind):
            plan[1][0, 1] ^= 1  # seq_len of the first request
        return plan

    def compress_forward(self, kind, state, x, ape, plan):
        kv = super().compress_forward(kind, state, x, ape, plan)
        if self._hit(kind):
            if self.what == "output":
                rows = (kv != 0).any(dim=1).nonzero()
                if rows.numel():
                    kv[int(rows[0]), 3] += 1e-3 * kv[int(rows[0])].abs().max()
            elif self.what == "state":  # one written (finite) state value
                flat = state.view(-1, state.shape[-1])
                flat[int(torch.isfinite(flat[:, 0]).nonzero()[0]), 0] += 1.0
        return kv

    def store(self, kind, kv, plan, consts, out_loc, cache):
        super().store(kind, kv, plan, consts, out_loc, cache)
        if self.what == "cache" and self._hit(kind):
            written = (cache != C.POISON_BYTE).nonzero()
            if written.numel():  # one scale byte of a stored entry
                page = int(written[0, 0])
                P, D = kind.page_size, kind.fmt.data_bytes
                cache[page, P * D] ^= 0x01


@pytest.mark.parametrize("what,column", [("cache", "cache"), ("output", "output"), ("state", "state"),
                                         ("plan", "plans")])
def test_corrupted_backend_fails(what: str, column: str) -> None:
    report = C.run_check(device="cpu", subject=_Corrupt(what))
    assert not report.ok
    bad = {(k.kind.name, c) for k in report.kinds for c in C.CHECKS if k.status(c) == "FAIL"}
    assert ("C128 main H512 V4", column) in bad, report.table()
    assert all(name == "C128 main H512 V4" for name, _ in bad), report.table()  # other kinds untouched
    table = report.table()
    assert f"C128 main H512 V4 / {column}:" in table and table.rstrip().splitlines()[-1].startswith("FAIL")


def test_cache_corruption_also_fails_the_fused_comparison() -> None:
    report = C.run_check(device="cpu", subject=_Corrupt("cache"))
    c128 = next(k for k in report.kinds if k.kind.name == "C128 main H512 V4")
    assert c128.status("fused") == "FAIL" and "two-step path" in c128.mismatches["fused"]


def test_compare_cache_allows_one_code_step_only() -> None:
    kind = C.layer_kinds("deepseek-v4-flash")[0]  # C4 main, V4
    P, D = kind.page_size, kind.fmt.data_bytes
    want = torch.full((2, kind.fmt.page_bytes(P)), C.POISON_BYTE, dtype=torch.uint8)
    want[1, 3 * D : 3 * D + 448] = 0x31
    tie = want.clone()
    tie[1, 3 * D + 10] = 0x32  # one e4m3 step: a rounding tie
    assert C.compare_cache(tie, want, kind) is None
    far = want.clone()
    far[1, 3 * D + 10] = 0x33
    assert "page 1 slot 3" in C.compare_cache(far, want, kind)
    rope = want.clone()
    rope[1, 3 * D + 500] ^= 1
    assert "RoPE" in C.compare_cache(rope, want, kind)


def test_no_gpu_is_named() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(C.NoGpuError, match="--device cpu"):
        C.run_check(device="cuda")
    with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
        C.check_device("tpu")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcompress", *args], capture_output=True, text=True, timeout=300)


def test_cli_check() -> None:
    if not torch.cuda.is_available():
        res = _cli("check")
        assert res.returncode == 1 and "no CUDA GPU" in res.stderr and "Traceback" not in res.stderr
    res = _cli("check", "--device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "layer kind" in res.stdout and res.stdout.rstrip().splitlines()[-1].startswith("PASS")
    res = _cli("check", "--model", "nosuch", "--device", "cpu")
    assert res.returncode == 2 and "invalid choice" in res.stderr
    assert "layer kind" in _cli("check", "--help").stdout
