"""``flashcompress check`` on a GPU (``pytest -m gpu``): every variant of the default preset is
built or loaded, and every layer kind's kernels agree with the PyTorch backend; the table is
printed (``-s``) so that it can be copied into ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from flashcompress.testing.check import CHECKS, run_check

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("model", ["deepseek-v4-flash"])
def test_check_passes_on_this_gpu(model: str) -> None:
    report = run_check(model, "cuda")
    print(report.table())
    assert report.build is not None and report.build.variants > 0 and report.build.ok, report.table()
    assert report.backend == "jit", report.table()
    for k in report.kinds:
        assert k.entries > 0 and all(k.compared[c] > 0 for c in CHECKS), k.kind.name
    assert report.ok, report.table()


def test_cli_check_exit_status() -> None:
    res = subprocess.run([sys.executable, "-m", "flashcompress", "check"], capture_output=True, text=True,
                         timeout=600)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.rstrip().splitlines()[-1].startswith("PASS")
