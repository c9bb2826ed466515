"""Shared helpers for the JIT engine and CLI tests (imported by test_jit_engine.py / test_cli.py).

``nvcc`` tests need nvcc, a host compiler and apache-tvm-ffi; they compile for
sm_90a on any machine (no GPU needed).  All tests share one session cache
directory under pytest's base temp dir, so a variant built by one test is a hit
for the next; tests that damage entries use variants of their own.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON_DIR = REPO / "python"


def _cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")


def toolchain_missing() -> str | None:
    """Why nvcc tests cannot run here, or None."""
    if not (_cuda_home() / "bin" / "nvcc").exists():
        return f"nvcc not found under {_cuda_home()} (set CUDA_HOME)"
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        return "no host C++ compiler"
    if importlib.util.find_spec("tvm_ffi") is None:
        return "apache-tvm-ffi is not installed"
    return None


requires_nvcc = pytest.mark.skipif(toolchain_missing() is not None, reason=str(toolchain_missing()))

# Environment every JIT test runs under (FLASHCOMPRESS_CACHE_DIR is added per fixture).
BASE_ENV = {
    "CUDA_HOME": str(_cuda_home()),
    "FLASHCOMPRESS_CUDA_ARCH": "9.0a",
    "FLASHCOMPRESS_SIZE_CAP_MB": "0",
}


def clean_environ(cache_dir: Path, config_home: Path, **extra: str) -> dict[str, str]:
    """``os.environ`` minus every FLASHCOMPRESS_* variable, plus the test settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCOMPRESS_")}
    env.update(BASE_ENV)
    env["FLASHCOMPRESS_CACHE_DIR"] = str(cache_dir)
    env["XDG_CONFIG_HOME"] = str(config_home)  # no user config file
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def apply_environ(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Make ``env`` the process environment for one test and reset the engine's caches."""
    for key in [k for k in os.environ if k.startswith("FLASHCOMPRESS_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reset_engine()


def reset_engine() -> None:
    """Forget settings, memoised modules, targets and digests."""
    from flashcompress.jit import engine, render, settings, toolchain

    settings.forget_settings()
    engine.clear_memo()
    render.clear_digest_memo()
    toolchain.clear_toolchain_memo()


def run_python(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env``."""
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def readme_settings_block() -> str:
    """The README's generated settings block (between its ``settings:begin``/``end`` markers)."""
    text = (REPO / "README.md").read_text()
    begin = text.index("<!-- settings:begin")
    begin = text.index("\n", begin) + 1
    return text[begin : text.index("<!-- settings:end -->")].rstrip("\n")


# ----------------------------------------------------------------------------- PTX of one variant

NVCC = shutil.which("nvcc") or str(_cuda_home() / "bin" / "nvcc")
requires_nvcc_only = pytest.mark.skipif(not Path(NVCC).exists(), reason="needs nvcc")


@functools.cache
def ptxas_report():
    """scripts/ptxas_report.py as a module: it renders a variant's kernel TU exactly as the JIT
    does (compile_tu) and demangles kernel names (demangle). Loaded on first use only."""
    spec = importlib.util.spec_from_file_location("ptxas_report", REPO / "scripts" / "ptxas_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def variant_ptx(family: str, params: dict, tmp: Path, target: str = "cuda:9.0a") -> str:
    """The PTX of one variant's kernel TU for `target` (nvcc only: no tvm-ffi, no GPU)."""
    from flashcompress.jit import family as fam

    out = tmp / "kernel.ptx"
    res = ptxas_report().compile_tu(NVCC, fam.get_family(family), params, out, ["-ptx"], target=target)
    assert res.returncode == 0, res.stderr[-3000:]
    return out.read_text()
