"""Shared pytest fixtures: JIT test environments with private or session-shared kernel caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from _jit_helpers import apply_environ, clean_environ, reset_engine


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache directory for the whole session."""
    path = tmp_path_factory.getbasetemp() / "jit-cache-shared"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture()
def jit_env(shared_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The test environment pointing at the shared cache; returns it (for subprocesses)."""
    env = clean_environ(shared_cache, tmp_path / "xdg")
    apply_environ(monkeypatch, env)
    yield env
    reset_engine()


@pytest.fixture()
def private_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A test environment with its own empty cache."""
    env = clean_environ(tmp_path / "cache", tmp_path / "xdg")
    apply_environ(monkeypatch, env)
    yield env
    reset_engine()


@pytest.fixture()
def debug_mode(monkeypatch: pytest.MonkeyPatch):
    """``FLASHCOMPRESS_DEBUG=1`` for one test (the settings are read again on both sides)."""
    from flashcompress.jit import settings

    monkeypatch.setenv("FLASHCOMPRESS_DEBUG", "1")
    settings.reload_settings()
    yield
    monkeypatch.delenv("FLASHCOMPRESS_DEBUG")
    settings.reload_settings()


@pytest.fixture()
def use_tiling():
    """``use_tiling(t)``: the public ops (the eager fast path included) run the CUDA compress
    kernels of tiling ``t`` (``cuda_ops.compress.set_tiling``, undone after the test)."""
    from flashcompress.cuda_ops import compress as cc

    saved = cc.current_tiling()
    yield cc.set_tiling
    cc.set_tiling(saved)
