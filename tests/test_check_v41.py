"""``flashcompress check --model deepseek-v4.1-flash``: the V4.1 source-layer kinds.

On the CPU the check is a self-test (PyTorch backend on both sides), so it must pass; a
checked side with one kind of damage (a ring value, a latent bit, a main-cache or an
index-K byte) must fail in exactly the column that sees it.  The ``gpu`` tests run the
check through the kernels (``pytest -m gpu tests/test_check_v41.py``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from flashcompress.testing import check as C
from flashcompress.testing import check_v41 as V

MODEL = "deepseek-v4.1-flash"
C2, C1 = "V4.1 C2 H512 v4 + index-K", "V4.1 C1 H512 v4 + index-K"


@pytest.fixture(autouse=True)
def _one_thread():
    """Small tensors: one thread is fastest, and far faster than several on a busy box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cpu_report() -> C.CheckReport:
    return C.run_check(MODEL, "cpu")


def test_cpu_self_test_passes(cpu_report: C.CheckReport) -> None:
    assert cpu_report.ok, cpu_report.table()
    assert [k.kind.name for k in cpu_report.kinds] == [C2, C1]
    steps = len(V._script())
    for k in cpu_report.kinds:
        assert k.entries > 0 and k.compared["output"] == k.compared["cache"] == steps, k.kind.name
        assert k.compared["plans"] == k.compared["fused"] == 0 and k.status("plans") == "-"
    c2, c1 = cpu_report.kinds
    assert c2.compared["state"] == steps and c1.compared["state"] == 0 and c1.status("state") == "-"
    table = cpu_report.table()
    assert "FAIL" not in table and table.rstrip().splitlines()[-1].startswith("PASS")


def test_v4_models_have_no_v41_kinds() -> None:
    assert not any(isinstance(k, V.V41LayerKind) for k in C.layer_kinds("deepseek-v4-flash"))
    assert not any(isinstance(k, C.LayerKind) for k in C.layer_kinds(MODEL))


def test_sm100_layouts_run_on_the_cpu() -> None:
    """The kinds an SM100 check runs (V41_FP4, V41_FP4_NEW), self-tested here."""
    kinds = C.layer_kinds(MODEL, ("v41_fp4", "v41_fp4_new"))
    assert [(k.ratio, k.layout.value) for k in kinds] == [(2, "v41_fp4"), (2, "v41_fp4_new"), (1, "v41_fp4"),
                                                          (1, "v41_fp4_new")]
    for i, kind in enumerate(kinds):
        res = V.V41KindRun(kind, C.ApiBackend("cpu"), C.ApiBackend("cpu"), i).run()
        assert res.ok and res.entries > 0, (kind.name, res.error, res.mismatches)
    assert V.v41_layouts_for(torch.device("cpu")) == ("v4",)


class _Corrupt(C.ApiBackend):
    """The checked side with one kind of damage, on the first V4.1 call that can show it."""

    def __init__(self, what: str, ratio: int = 2):
        super().__init__("cpu")
        self.what, self.ratio, self.done = what, ratio, False

    def v41_compress(self, kind, mode, x, ring, norm_weight, eps, freqs_cis, cache, meta, ring_size, draft_len):
        lat = super().v41_compress(kind, mode, x, ring, norm_weight, eps, freqs_cis, cache, meta, ring_size, draft_len)
        if kind.ratio != self.ratio or self.done:
            return lat
        if self.what == "ring":
            ring[ring_size + 1, 5] += 1.0  # request slot 1's parked row
        elif self.what == "latent":
            lat.view(torch.int16)[1, 7] ^= 1
        elif self.what == "cache":
            cache.view(-1)[(cache.view(-1) != C.POISON_BYTE).nonzero()[0]] ^= 0x10
        else:
            return lat
        self.done = True
        return lat

    def v41_index_k(self, kind, k_in, k_norm_weight, eps, freqs_cis, positions, loc, cache):
        super().v41_index_k(kind, k_in, k_norm_weight, eps, freqs_cis, positions, loc, cache)
        if self.what == "index" and kind.ratio == self.ratio and not self.done:
            cache.view(-1)[(cache.view(-1) != C.POISON_BYTE).nonzero()[-1]] ^= 0x01
            self.done = True


@pytest.mark.parametrize("what,column,ratio", [("ring", "state", 2), ("latent", "output", 2), ("latent", "output", 1),
                                               ("cache", "cache", 2), ("cache", "cache", 1), ("index", "cache", 1)])
def test_corrupted_backend_fails(what: str, column: str, ratio: int) -> None:
    report = C.run_check(MODEL, "cpu", subject=_Corrupt(what, ratio))
    assert not report.ok
    name = C2 if ratio == 2 else C1
    bad = {(k.kind.name, c) for k in report.kinds for c in C.CHECKS if k.status(c) == "FAIL"}
    assert (name, column) in bad and all(n == name for n, _ in bad), report.table()
    table = report.table()
    assert f"{name} / {column}:" in table and table.rstrip().splitlines()[-1].startswith("FAIL")
    if what == "index":
        assert "index-K cache" in table


def test_an_op_error_fails_the_kind() -> None:
    class Raises(C.ApiBackend):
        def v41_index_k(self, *args, **kwargs):
            raise RuntimeError("boom")

    report = C.run_check(MODEL, "cpu", subject=Raises("cpu"))
    assert not report.ok and all(k.error and "boom" in k.error for k in report.kinds)
    assert "stopped: step 1 (prefill): RuntimeError: boom" in report.table()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcompress", *args], capture_output=True, text=True, timeout=300)


def test_cli_check_v41_model() -> None:
    res = _cli("check", "--model", MODEL, "--device", "cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    assert C2 in res.stdout and C1 in res.stdout and res.stdout.rstrip().splitlines()[-1].startswith("PASS")
    assert MODEL in _cli("check", "--help").stdout



@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_check_v41_passes() -> None:
    report = C.run_check(MODEL, "cuda")
    print(report.table())
    assert report.build is not None and report.build.variants > 0 and report.build.ok, report.table()
    assert report.backend == "jit", report.table()
    layouts = V.v41_layouts_for(torch.device("cuda"))
    assert len(report.kinds) == 2 * len(layouts)
    for k in report.kinds:
        assert k.entries > 0 and k.compared["output"] > 0 and k.compared["cache"] > 0, k.kind.name
    assert report.ok, report.table()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cli_check_v41_exit_status() -> None:
    res = subprocess.run([sys.executable, "-m", "flashcompress", "check", "--model", MODEL], capture_output=True,
                         text=True, timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.rstrip().splitlines()[-1].startswith("PASS")
