"""Importing flashcompress is free for an engine: no tvm-ffi, no CUDA init, no compile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = r"""
import sys
import flashcompress
assert "torch" not in sys.modules, "import flashcompress must not import torch"
import torch
from flashcompress import CompressorDecodePlan, compress_forward, compress_norm_rope_store  # the API modules
rpi = torch.tensor([1]); r2t = torch.zeros(2, 16, dtype=torch.int32); f2s = torch.zeros(300, dtype=torch.int64)
CompressorDecodePlan.generate(4, rpi, r2t, f2s, torch.tensor([4]), 256, 8)   # a CPU call
print("tvm_ffi" in sys.modules, torch.cuda.is_initialized())
"""


def test_import_and_cpu_calls_load_no_tvm_ffi_and_no_cuda(tmp_path: Path) -> None:
    env = dict(os.environ, FLASHCOMPRESS_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]
    assert not (tmp_path / "cache").exists(), "a CPU call must not touch the kernel cache"
