"""``flashcompress`` command-line tests: prewarm (list/dry-run/build/failures), cache, config, demo.

Builds go to the session-wide cache shared with test_jit_engine.py (same directory
name under pytest's base temp dir), so variants built there are hits here.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from _jit_helpers import readme_settings_block, requires_nvcc, reset_engine

from flashcompress import cli, jit
from flashcompress.jit import build, cache, engine, family
from flashcompress.jit.models import MODELS

# Targets whose presets differ (V4.1: V4 layouts on Hopper, V41_FP4 / V41_FP4_NEW on SM100).
PRESET_TARGETS = (None, "cuda:9.0a", "cuda:10.0a", "cuda:12.0a", "hip:gfx942")
V41_FLASH_LIST = [
    "v41(op='c1', layout='v4', design='fast3') @ cuda:9.0a",
    "v41(op='c2_decode', layout='v4', design='fast3') @ cuda:9.0a",
    "v41(op='c2_prefill', layout='v4', design='fast3') @ cuda:9.0a",
    "v41(op='index_k', layout='none', design='base') @ cuda:9.0a",
    "v41(op='c1', layout='v41_fp4', design='fast3') @ cuda:10.0a",
    "v41(op='c2_decode', layout='v41_fp4', design='fast3') @ cuda:10.0a",
    "v41(op='c2_prefill', layout='v41_fp4', design='fast3') @ cuda:10.0a",
    "v41(op='c1', layout='v41_fp4_new', design='fast3') @ cuda:10.0a",
    "v41(op='c2_decode', layout='v41_fp4_new', design='fast3') @ cuda:10.0a",
    "v41(op='c2_prefill', layout='v41_fp4_new', design='fast3') @ cuda:10.0a",
    "v41(op='index_k', layout='none', design='base') @ cuda:10.0a",
]

PLAN_FLASH = [
    "plan(ratio=4, online=False) @ cuda:9.0a",
    "plan(ratio=128, online=False) @ cuda:9.0a",
    "plan(ratio=128, online=True) @ cuda:9.0a",
]


def plan_family_missing() -> str | None:
    try:
        family.discover_families()
    except Exception as exc:  # noqa: BLE001
        return f"importing the families failed: {exc}"
    return None if "plan" in family.families() else "the plan family is not registered yet"


# (fixtures shared_cache / jit_env / private_env live in conftest.py)


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``flashcompress ARGV`` in this process (fresh in-process memo, as a new process would have)."""
    engine.clear_memo()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_subprocess(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flashcompress", *argv], env=env, capture_output=True, text=True,
                          timeout=600, check=False)


# ----------------------------------------------------------------------------- prewarm: the variant set


class _NoopModule:
    """Stands in for a loaded variant: every export accepts anything and does nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


@pytest.mark.parametrize("model", sorted(MODELS))
def test_prewarm_presets_cover_every_variant_the_cuda_backend_requests(private_env, monkeypatch: pytest.MonkeyPatch,
                                                                       model: str) -> None:
    """Each layer kind of the model, through the CUDA backend's own entry points (decode and
    prefill: compress_forward, compress_and_store, the two-step store): every ``get_module``
    request they make is in ``prewarm --model``'s set, so a prewarmed engine compiles nothing."""
    import torch

    import flashcompress.jit as fjit
    from flashcompress import layouts as L
    from flashcompress import validation as V
    from flashcompress.cuda_ops import compress as cc
    from flashcompress.cuda_ops import store as cs
    from flashcompress.jit.models import model_config

    requested: list[tuple[str, tuple]] = []

    def record(fam: str, **params):
        requested.append((fam, tuple(sorted(params.items()))))
        return _NoopModule()

    monkeypatch.setattr(fjit, "get_module", record)
    jit.clear_memo()
    cfg = model_config(model)
    kinds = []  # (ratio, online, head_dim, cache formats, page size)
    if 4 in cfg.compress_ratios:
        kinds += [(4, False, cfg.head_dim, [L.MAIN_V4], 64),
                  (4, False, cfg.index_head_dim, [L.INDEXER_FP8, L.INDEXER_FP4], 64)]
    if 128 in cfg.compress_ratios:
        kinds += [(128, False, cfg.head_dim, [L.MAIN_V4], 2), (128, True, cfg.head_dim, [L.MAIN_V4], 2)]
    f32 = torch.float32
    for ratio, online, head, fmts, page in kinds:
        width = (4 if ratio == 4 else 2) * head
        state = torch.zeros((2 * ratio, 3 * head if online else width), dtype=f32)
        inp, ape = torch.zeros((1, width), dtype=f32), torch.zeros((8 if ratio == 4 else 128, head), dtype=f32)
        rows, out = torch.zeros((1, 16), dtype=torch.uint8), torch.zeros((1, head), dtype=f32)
        layer = L.LAYER_KINDS[(ratio, head, online)]
        for decode in (True, False):
            plan_w = None if decode else torch.zeros((1, 8 if not online else 16), dtype=torch.uint8)
            call = V.CompressCall(layer, state, inp, ape, rows, plan_w, None, -1)
            cc.compress_forward(call, out)
            for fmt in fmts:
                cache = torch.zeros((1, fmt.page_bytes(page)), dtype=torch.uint8)
                freq = torch.ones((4, 32), dtype=torch.complex64)
                store = V.StoreTail(torch.ones(head), 1e-6, freq, torch.zeros(1, dtype=torch.int64), cache, page, fmt)
                cc.compress_and_store(call._replace(store=store))
                cs.compress_norm_rope_store(V.StoreCall(out, rows, decode, ratio, store, -1))
    assert {fam for fam, _ in requested} == ({"compress", "store"} if cfg.v4_ratios else set())
    presets = {(fam.name, tuple(sorted(p.items()))) for fam in family.discover_families().values()
               for p in fam.preset_params(model)}
    missing = sorted(set(requested) - presets)
    assert not missing, f"prewarm --model {model} leaves out variants the CUDA backend loads: {missing}"
    _check_v41_presets_cover_the_cuda_backend(model, requested)


def _check_v41_presets_cover_the_cuda_backend(model: str, requested: list[tuple[str, tuple]]) -> None:
    """The V4.1 ops of a model's ratio-1/2 layers (c1, c2 decode/verify/prefill, index-K), in the
    layouts of each target, request only variants of that target's preset."""
    import torch

    from flashcompress.cuda_ops import v41 as cv
    from flashcompress.jit.models import model_config
    from flashcompress.v41.layouts import KVLayout

    ratios = model_config(model).low_ratios
    for target in ("cuda:9.0a", "cuda:10.0a"):
        requested.clear()
        jit.clear_memo()
        bf, f32, i64, i32 = torch.bfloat16, torch.float32, torch.int64, torch.int32
        row, weight, out = torch.zeros((1, 512), dtype=bf), torch.ones(512, dtype=bf), torch.zeros((1, 512), dtype=bf)
        freqs, pos, loc = torch.zeros((1, 64), dtype=f32), torch.zeros(1, dtype=i64), torch.zeros(1, dtype=i64)
        for layout in map(KVLayout, cv.preset_layouts(target)):
            cache = torch.zeros((1, layout.page_bytes(1)), dtype=torch.uint8)
            kv, state = torch.zeros((1, 1024), dtype=f32), torch.zeros((2, 1024), dtype=f32)
            if 1 in ratios:
                cv.c1_decode(row, weight, pos, loc, 1e-20, freqs, cache, page_size=1, layout=layout, out=out)
            if 2 in ratios:
                cv.c2_decode(kv, state, weight, pos, loc, loc, 1e-20, freqs, cache, page_size=1, ring_size=2,
                             draft_len=1, layout=layout, out=out)
                start = torch.zeros(1, dtype=i32)
                cv.c2_prefill(kv, state, weight, pos, loc, loc, 1e-20, freqs, cache, start, start, page_size=1,
                              ring_size=2, layout=layout, out=out)
        if ratios:
            cv.index_k(torch.zeros((1, 128), dtype=bf), torch.ones(128, dtype=bf), 1e-20, freqs, pos, loc,
                       torch.zeros((1, 68), dtype=torch.uint8), ratio=max(ratios))
        assert bool(requested) == bool(ratios)
        presets = {("v41", tuple(sorted(p.items()))) for p in family.get_family("v41").preset_params(model, target)}
        missing = sorted(set(requested) - presets)
        assert not missing, f"prewarm --model {model} on {target} leaves out V4.1 variants: {missing}"


@pytest.mark.parametrize("target", PRESET_TARGETS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_preset_names_a_variant_of_its_family(model: str, target: str | None) -> None:
    """A preset entry is one point of its family's declared space (all params set, valid), for
    every model and target: a family asked for a ratio it has no kernel of fails here."""
    for fam in family.discover_families().values():
        entries = fam.preset_params(model, target)
        if fam.space is None:
            assert entries == [], f"{fam.name}: a family without a space has no presets"
            continue
        space = {tuple(sorted(p.items())) for p in fam.expand()}
        for entry in entries:
            assert tuple(sorted(entry.items())) in space, f"{fam.name} preset for {model} @ {target}: {entry}"
        assert len({tuple(sorted(e.items())) for e in entries}) == len(entries), f"{fam.name}: duplicate presets"


def test_a_preset_outside_the_family_space_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check the test above relies on: a plan variant of ratio 2 (none exists) raises."""
    import dataclasses

    plan = family.get_family("plan")
    bad = dataclasses.replace(plan, presets=lambda model: [{"ratio": 2, "online": False}])
    with pytest.raises(ValueError, match="ratio"):
        bad.preset_params("deepseek-v4.1-flash")


def test_v41_flash_presets_per_family_and_target() -> None:
    """V4.1-Flash has only ratio-1/2 layers: no V4 family is asked for anything; the v41 family
    gives V4 layouts on Hopper / SM 12x and V41_FP4 / V41_FP4_NEW on SM100 (nothing on HIP)."""
    from flashcompress.jit.models import ModelConfig, model_config

    cfg = model_config("deepseek-v4.1-flash")
    assert (cfg.v4_ratios, sorted(cfg.low_ratios), cfg.kv_source_layers) == ((), [1, 2], (2, 8, 14, 20))
    for fam in family.discover_families().values():
        if fam.name != "v41":
            assert fam.preset_params("deepseek-v4.1-flash", "cuda:9.0a") == [], fam.name
    v41 = family.get_family("v41")
    layouts = {t: {p["layout"] for p in v41.preset_params("deepseek-v4.1-flash", t)} for t in PRESET_TARGETS}
    assert layouts == {None: {"v4", "v41_fp4", "v41_fp4_new", "none"}, "cuda:9.0a": {"v4", "none"},
                       "cuda:10.0a": {"v41_fp4", "v41_fp4_new", "none"}, "cuda:12.0a": {"v4", "none"},
                       "hip:gfx942": set()}  # no HIP build of the v41 family
    for model in ("deepseek-v4-flash", "deepseek-v4-pro"):
        assert v41.preset_params(model, "cuda:10.0a") == []
    with pytest.raises(ValueError, match="compress ratios"):
        ModelConfig("bad", compress_ratios=(3,))


@requires_nvcc
@pytest.mark.nvcc
def test_prewarm_dry_run_model_flash_lists_plan_variants(private_env: dict[str, str]) -> None:
    reason = plan_family_missing()
    if reason:
        pytest.skip(reason)
    proc = cli_subprocess(private_env, "prewarm", "--dry-run", "--model", "deepseek-v4-flash")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "@ cuda:" in line or "@ host:" in line]
    assert [line.split("  ")[0].strip() for line in lines if line.startswith("plan(")] == PLAN_FLASH
    host = [line.split("  ")[0].strip() for line in lines if line.startswith("plan_host(")]
    assert [h.split(" @ ")[0] for h in host] == [p.split(" @ ")[0].replace("plan(", "plan_host(") for p in PLAN_FLASH]
    assert all("to build" in line for line in lines)
    assert f"{len(lines)} variant(s); nothing compiled" in proc.stdout  # other families' presets too
    root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    assert not list(root.glob("*/*/*/*/*/variant.json")), "a dry run must not build"


def test_prewarm_list_model_and_all(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("prewarm", "--list", "--model", "deepseek-v4-pro",
                           capsys=capsys)
    assert code == 0
    listed = out.splitlines()[:-1]
    assert not any(line.startswith("selftest(") for line in listed)  # the test family has no presets
    if "plan" in family.families():
        assert listed[:3] == PLAN_FLASH or set(PLAN_FLASH) <= set(listed)
        code, out, _ = run_cli("prewarm", "--list", "--all", capsys=capsys)
        assert code == 0 and set(PLAN_FLASH) <= set(out.splitlines())
        assert not any(line.startswith("selftest(") for line in out.splitlines())  # not part of --all
        code, out, _ = run_cli("prewarm", "--list", "plan:ratio=128", "--arch", "9.0a", "--arch", "10.0a",
                               capsys=capsys)
        assert out.splitlines()[:-1] == [
            "plan(ratio=128, online=False) @ cuda:9.0a", "plan(ratio=128, online=True) @ cuda:9.0a",
            "plan(ratio=128, online=False) @ cuda:10.0a", "plan(ratio=128, online=True) @ cuda:10.0a"]


def test_prewarm_list_and_dry_run_v41_flash(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli("prewarm", "--list", "--model", "deepseek-v4.1-flash", "--arch", "9.0a", "--arch",
                             "10.0a", capsys=capsys)
    assert code == 0, err
    assert out.splitlines() == V41_FLASH_LIST + [f"{len(V41_FLASH_LIST)} variant(s)"]
    code, out, err = run_cli("prewarm", "--dry-run", "--model", "deepseek-v4.1-flash", "--arch", "9.0a",
                             capsys=capsys)
    assert code == 0, err
    rows = [line for line in out.splitlines() if " @ " in line]
    assert [r.split("  ")[0].strip() for r in rows] == V41_FLASH_LIST[:4]
    assert "4 variant(s); nothing compiled (dry run)" in out
    root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    assert not list(root.glob("*/*/*/*/*/variant.json")), "a dry run must not build"
    # Both models in one prewarm: the union, V4 families for V4-Flash only.
    code, out, _ = run_cli("prewarm", "--list", "--model", "deepseek-v4.1-flash", "--model", "deepseek-v4-flash",
                           "--arch", "9.0a", capsys=capsys)
    assert code == 0 and set(V41_FLASH_LIST[:4]) <= set(out.splitlines())
    if "plan" in family.families():
        assert set(PLAN_FLASH) <= set(out.splitlines())


def test_check_offers_v41_flash(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """``check`` runs V4.1-Flash's ratio-2 / ratio-1 source-layer scripts (``testing/check_v41.py``)."""
    code, out, _ = run_cli("check", "--device", "cpu", "--model", "deepseek-v4.1-flash", capsys=capsys)
    assert code == 0 and "V4.1 C2 H512 v4 + index-K" in out and out.rstrip().splitlines()[-1].startswith("PASS")


@pytest.mark.parametrize("argv,message", [
    ((), "give variant specs"),
    (("nosuchfamily:x=1",), "unknown JIT kernel family"),
    (("--model", "llama-3"), "unknown model"),
    (("selftest:value=1",), "missing parameter 'block'"),
])
def test_prewarm_usage_errors(private_env: dict[str, str], capsys: pytest.CaptureFixture[str],
                              argv: tuple[str, ...], message: str) -> None:
    code, _, err = run_cli("prewarm", "--list", *argv, capsys=capsys)
    assert code == 2 and message in err


# ----------------------------------------------------------------------------- prewarm: builds


@requires_nvcc
@pytest.mark.nvcc
def test_prewarm_builds_then_second_run_compiles_nothing(jit_env: dict[str, str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["prewarm", "-j", "2", "selftest:value=3,block=128",
            "selftest:value=41,block=64"]
    expected = {"selftest(block=128, value=3) @ cuda:9.0a", "selftest(block=64, value=41) @ cuda:9.0a"}
    if plan_family_missing() is None:
        argv += ["--model", "deepseek-v4-flash"]
        expected |= {line for line in run_cli("prewarm", "--list", "--model", "deepseek-v4-flash",
                                               capsys=capsys)[1].splitlines()[:-1]}
    code, out, err = run_cli(*argv, capsys=capsys)
    assert code == 0, out + err
    progress = [line for line in out.splitlines() if re.match(r"\[\s*\d+/\d+\]", line)]
    assert len(progress) == len(expected)
    header = next(line for line in out.splitlines() if line.startswith("variant"))
    assert header.split() == ["variant", "status", "seconds", "cache", "path"]
    for line in out.splitlines():
        if "@ cuda:" in line and not line.startswith("["):
            assert re.search(r"\s(built|hit|waited)\s+\d+\.\d\d\s+/", line), line
    builds = build.build_counter()
    code, out, _ = run_cli(*argv, capsys=capsys)
    assert code == 0
    assert build.build_counter() == builds, "the second prewarm compiled something"
    assert f"{len(expected)} variant(s)" in out and f": {len(expected)} hit" in out
    assert all(re.search(r"\]\s+hit\s", line) for line in out.splitlines() if line.startswith("["))


@requires_nvcc
@pytest.mark.nvcc
def test_prewarm_failure_exits_nonzero_with_first_error(jit_env: dict[str, str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("prewarm", "selftest:value=5,block=100",
                           "selftest:value=3,block=128", capsys=capsys)
    assert code == 1
    assert "FAILED selftest(block=100, value=5) @ cuda:9.0a" in out
    assert "static assertion failed" in out and "full log:" in out and "command:" in out
    assert re.search(r"selftest\(block=128, value=3\) @ cuda:9\.0a\s+(hit|built)", out)


class FakeTTY:
    """A terminal-like stream: isatty() is True; collects what is written."""

    def __init__(self) -> None:
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        self.chunks.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def getvalue(self) -> str:
        return "".join(self.chunks)


class FakeKey(str):
    def describe(self) -> str:
        return f"plan(ratio={self}) @ cuda:9.0a"


def test_progress_line_on_a_tty_and_plain_lines_otherwise() -> None:
    a, b, c = FakeKey("4"), FakeKey("128"), FakeKey("512")
    now = [100.0]
    tty = FakeTTY()
    progress = cli.Progress(3, tty, tick=0, clock=lambda: now[0], columns=200)
    progress.started(a)
    progress.started(b)
    now[0] += 2.5
    assert progress.line() == ("[........................] 0/3   2.5s  "
                               "plan(ratio=4) @ cuda:9.0a, plan(ratio=128) @ cuda:9.0a")
    progress.finished(1, 3, types.SimpleNamespace(key=a, status="built", seconds=2.5))
    progress.started(c)
    progress.finished(2, 3, types.SimpleNamespace(key=b, status="hit", seconds=0.1))
    progress.finished(3, 3, types.SimpleNamespace(key=c, status="built", seconds=1.0))
    progress.close()
    text = tty.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n"), "a TTY gets one line, redrawn in place"
    frames = [frame for frame in text.rstrip("\n").split("\r\x1b[K") if frame]
    assert frames[0].startswith("[........................] 0/3") and "plan(ratio=4)" in frames[0]
    assert any(f.startswith("[########................] 1/3") and "plan(ratio=512)" in f for f in frames)
    assert frames[-1] == "[########################] 3/3   2.5s"
    narrow = cli.Progress(3, FakeTTY(), tick=0, clock=lambda: now[0], columns=40)
    narrow.started(a)
    assert len(narrow.line()) <= 40 and narrow.line().endswith("…")

    log = io.StringIO()  # not a terminal: one plain line per finished variant, no control characters
    progress = cli.Progress(2, log, clock=lambda: now[0])
    progress.started(a)
    progress.finished(1, 2, types.SimpleNamespace(key=a, status="built", seconds=2.5))
    progress.finished(2, 2, types.SimpleNamespace(key=b, status="hit", seconds=0.0))
    progress.close()
    assert log.getvalue().splitlines() == ["[1/2] built     2.50s  plan(ratio=4) @ cuda:9.0a",
                                           "[2/2] hit       0.00s  plan(ratio=128) @ cuda:9.0a"]


def test_jobs_capped_by_memory(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 5 * cache.GIB)
    jobs, note = cache.jobs(8)
    assert jobs == 2 and "-j 8 capped to 2 by available memory (5.0 GiB available" in note
    assert cache.jobs(2) == (2, None)
    assert cache.jobs()[0] in (1, 2)  # the setting (0: cores), capped by cores and memory
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 64 * cache.GIB)
    assert cache.jobs(8) == (8, None)  # an explicit -j may exceed the core count
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: None)
    assert cache.jobs(8) == (8, None)


@requires_nvcc
@pytest.mark.nvcc
def test_prewarm_on_a_tty_with_capped_jobs(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["prewarm", "-j", "6", "selftest:value=3,block=128"]
    run_cli(*argv, capsys=capsys)  # cached afterwards
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 3 * cache.GIB)
    tty = FakeTTY()
    monkeypatch.setattr(sys, "stdout", tty)
    engine.clear_memo()
    assert cli.main(argv) == 0
    out = tty.getvalue()
    assert "note: -j 6 capped to 1 by available memory" in out and "with 1 job(s)" in out
    assert "\r\x1b[K[########################] 1/1" in out
    assert not re.search(r"^\[\s*\d+/\d+\]", out, re.M), "no per-variant log lines on a terminal"
    assert re.search(r"^selftest\(block=128, value=3\) @ cuda:9\.0a\s+hit\s", out, re.M)  # the summary table


# ----------------------------------------------------------------------------- cache


def test_cache_list_params_in_prewarm_order(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`cache list` names variants exactly as `prewarm` does: plan(ratio=4, online=False), not sorted by name."""
    reason = plan_family_missing()
    if reason:
        pytest.skip(reason)
    root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    key = jit.make_key("plan", ratio=4, online=False)
    leaf = root / cache.package_version() / "sm90a" / key.module_name / ("0" * 16) / ("1" * 16)
    leaf.mkdir(parents=True)
    manifest = {"family": "plan", "params": dict(sorted(key.params)), "target": key.target}
    (leaf / "variant.json").write_text(json.dumps(manifest))
    assert list(manifest["params"]) == ["online", "ratio"]  # stored sorted by name
    code, out, _ = run_cli("cache", "list", capsys=capsys)
    assert code == 0 and " plan(ratio=4, online=False) @ cuda:9.0a " in out
    assert key.describe() == "plan(ratio=4, online=False) @ cuda:9.0a"


def _populate(shared: Path, private: Path) -> Path:
    """Copy the selftest(value=3) entry from the shared cache into ``private`` and add debris."""
    source = next(shared.glob(f"{cache.package_version()}/sm90a/fc_selftest_block128_value3/*/*/variant.json")).parent
    inputs = Path(source.parent.parent.name) / source.parent.name
    leaf = private / cache.package_version() / "sm90a" / inputs / source.name
    shutil.copytree(source, leaf)
    cache.ensure_root(private)
    other = private / "0.0.1" / "sm90a" / inputs / source.name
    shutil.copytree(source, other)
    old_staging = leaf.parent / f".staging-{source.name}-deadbeef"
    old_staging.mkdir()
    os.utime(old_staging, (time.time() - 7200, time.time() - 7200))
    (leaf.parent / f"{source.name}.failed").mkdir()
    return leaf


@requires_nvcc
@pytest.mark.nvcc
def test_cache_info_list_verify_clean(jit_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    jit.acquire(jit.make_key("selftest", value=3, block=128))  # make sure the shared entry exists
    private = tmp_path / "private-cache"
    leaf = _populate(Path(jit_env["FLASHCOMPRESS_CACHE_DIR"]), private)
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(private))
    reset_engine()

    code, out, _ = run_cli("cache", "info", capsys=capsys)
    assert code == 0 and str(private) in out
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+)\s+(\d+)\s", out, re.M)}
    assert counts == {"current": 1, "other-version": 1, "failed": 1, "staging": 1}

    code, out, _ = run_cli("cache", "list", capsys=capsys)
    assert code == 0 and "selftest(block=128, value=3) @ cuda:9.0a" in out and "4 item(s)" in out

    code, out, _ = run_cli("cache", "verify", capsys=capsys)
    assert code == 0 and "2 entries verified, 0 bad" in out
    assert out.splitlines()[0].split() == ["variant", "status", "path"]
    rows = [line for line in out.splitlines() if "@ cuda:" in line]
    assert len(rows) == 2 and all(re.fullmatch(r"selftest\(block=128, value=3\) @ cuda:9\.0a\s+ok\s+/\S+", r)
                                  for r in rows), rows

    code, out, _ = run_cli("cache", "clean", "--stale", "--yes", capsys=capsys)
    assert code == 0 and "removed 3 item(s)" in out
    assert leaf.is_dir() and not (private / "0.0.1").exists()

    library = leaf / "fc_selftest_block128_value3.so"
    truncated = library.with_name("truncated.tmp")
    truncated.write_bytes(library.read_bytes()[:100])
    os.replace(truncated, library)  # a new inode: the copy verify just loaded stays intact
    code, out, _ = run_cli("cache", "verify", capsys=capsys)
    assert code == 1 and "1 bad" in out
    assert re.search(r"^selftest\(block=128, value=3\) @ cuda:9\.0a\s+BAD: \S+\.so: size 100 != manifest \d+\s+"
                     + re.escape(str(leaf)) + "$", out, re.M), out

    code, _, err = run_cli("cache", "clean", capsys=capsys)  # stdin is no terminal: refused, nothing removed
    assert code == 1 and "--yes" in err and "refusing" in err and library.is_file()
    code, out, _ = run_cli("cache", "clean", "--yes", capsys=capsys)
    assert code == 0 and not list(private.glob("*/*"))
    assert "removed 1 item(s)" in out  # the one entry left, not the version directories holding it
    assert (private / cache.CACHEDIR_TAG).is_file()

    untagged = tmp_path / "not-a-cache"
    (untagged / "precious").mkdir(parents=True)
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(untagged))
    reset_engine()
    code, _, err = run_cli("cache", "clean", capsys=capsys)
    assert code == 1 and "refusing" in err and (untagged / "precious").is_dir()


def test_cache_info_empty(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("cache", "info", capsys=capsys)
    assert code == 0 and "(empty)" in out


# ----------------------------------------------------------------------------- config, demo, entry points


def test_config_command(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("config", capsys=capsys)
    assert code == 0
    assert re.search(r"^cache_dir\s+\S+\s+\$FLASHCOMPRESS_CACHE_DIR$", out, re.M)
    assert re.search(r"^default_cuda_archs\s+9\.0a\s+\S+cache-config\.toml$", out, re.M)
    code, out, _ = run_cli("config", "--markdown", capsys=capsys)
    assert code == 0 and out.rstrip("\n") == readme_settings_block()


def test_bad_setting_is_a_clean_error(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLASHCOMPRESS_JOBS", "lots")
    code, _, err = run_cli("config", capsys=capsys)
    assert code == 2 and "FLASHCOMPRESS_JOBS" in err


def test_demo_forwards_arguments_or_reports_absence(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("flashcompress.testing.demo")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashcompress.testing.demo", fake)
    code, _, _ = run_cli("demo", "--steps", "3", capsys=capsys)
    assert code == 0 and seen == [["--steps", "3"]]
    monkeypatch.setitem(sys.modules, "flashcompress.testing.demo", None)  # import now fails
    code, _, err = run_cli("demo", capsys=capsys)
    assert code == 2 and "not available" in err


def test_python_dash_m_entry_point(private_env: dict[str, str]) -> None:
    proc = cli_subprocess(private_env, "--help")
    assert proc.returncode == 0 and "prewarm" in proc.stdout and "cache" in proc.stdout


# ----------------------------------------------------------------------------- papercuts (issue 8)


def test_version(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    import flashcompress

    code, out, _ = run_cli("--version", capsys=capsys)
    assert code == 0 and out.strip() == f"flashcompress {flashcompress.__version__}"


def test_offline_prewarm_refuses_and_writes_nothing(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "1")
    jit.reload_settings()
    code, out, err = run_cli("prewarm", "--model", "deepseek-v4-flash", capsys=capsys)
    assert code == 2 and "needs offline mode off" in err and "FLASHCOMPRESS_OFFLINE=0" in err
    assert "flashcompress prewarm --" not in err  # not the same command back
    assert not Path(private_env["FLASHCOMPRESS_CACHE_DIR"]).exists()


def test_empty_cache_dir_is_an_error(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", "")
    code, _, err = run_cli("cache", "info", capsys=capsys)
    assert code == 2 and "FLASHCOMPRESS_CACHE_DIR" in err and "empty" in err


def test_unknown_environment_variable_warns_with_the_closest_setting(
        private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcompress.jit import settings

    monkeypatch.setenv("FLASHCOMPRESS_CACHEDIR", "/somewhere")
    with pytest.warns(UserWarning, match=r"FLASHCOMPRESS_CACHEDIR is not a flashcompress setting.*"
                                         r"did you mean FLASHCOMPRESS_CACHE_DIR\?"):
        settings.reload_settings()
    known = {"FLASHCOMPRESS_PROPERTY_SEEDS": "3", "FLASHCOMPRESS_TEST_DEVICE": "cpu", "FLASHCOMPRESS_CONFIG": "x",
             "FLASHCOMPRESS_DEBUG": "1"}
    assert settings.unknown_environment(known) == []
    assert settings.unknown_environment({"FLASHCOMPRESS_ZZZZZZZZ": "1"}) == [("FLASHCOMPRESS_ZZZZZZZZ", None)]


def test_jobs_must_be_positive_and_are_capped_by_cores(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from flashcompress.jit import prewarm

    for bad in ("0", "-3", "two"):
        with pytest.raises(SystemExit) as info:
            cli.main(["prewarm", "-j", bad, "--all"])
        assert info.value.code == 2 and "expected an integer >= 1" in capsys.readouterr().err
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 4096 * cache.GIB)
    monkeypatch.setattr(cache, "cpu_cores", lambda: 3)
    assert prewarm.prewarm_jobs(64) == (3, "-j 64 capped to 3 by CPU cores")
    assert prewarm.prewarm_jobs(2) == (2, None)
    monkeypatch.setattr(cache, "available_memory_bytes", lambda: 5 * cache.GIB)
    jobs, note = prewarm.prewarm_jobs(64)
    assert jobs == 2 and "by available memory" in note
    with pytest.raises(ValueError, match="^jobs:"):
        prewarm.prewarm_jobs(0)


def test_warm_launch_skip_is_reported(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from flashcompress.jit import prewarm

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the warm launch runs")
    key = jit.make_key("selftest", value=3, block=128)
    monkeypatch.setattr(prewarm, "variant_set", lambda *a, **k: [key])
    monkeypatch.setattr(prewarm, "run_prewarm", lambda keys, **k: [prewarm.PrewarmResult(key, "hit", 0.0, None)])
    code, out, _ = run_cli("prewarm", "selftest:value=3,block=128", capsys=capsys)
    assert code == 0 and "warm launch skipped: no GPU visible" in out
    code, out, _ = run_cli("prewarm", "--no-warmup", "selftest:value=3,block=128", capsys=capsys)
    assert code == 0 and "warm launch skipped (--no-warmup)" in out


def test_unwritable_cache_error_is_printed_once(private_env: dict[str, str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from flashcompress.jit import errors, prewarm

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    keys = [jit.make_key("selftest", value=v, block=128) for v in (1, 2, 3)]

    def fail(keys, **k):
        return [prewarm.PrewarmResult(key, "failed", 0.0, None, errors.CacheNotWritable(
            key.describe(), blocker / "cache", "Not a directory", "set FLASHCOMPRESS_CACHE_DIR")) for key in keys]

    monkeypatch.setattr(prewarm, "variant_set", lambda *a, **k: keys)
    monkeypatch.setattr(prewarm, "run_prewarm", fail)
    code, out, _ = run_cli("prewarm", "--no-warmup", "selftest", capsys=capsys)
    assert code == 1 and out.count("is not writable") == 1 and "FAILED 3 variant(s)" in out


def test_config_shows_target_and_toolchain(private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli("config", capsys=capsys)
    assert code == 0 and re.search(r"^target:\s+cuda:\S+$", out, re.M)
    if shutil.which("nvcc") or os.environ.get("CUDA_HOME"):
        assert re.search(r"^nvcc:\s+/\S+nvcc\s+\(.*release", out, re.M) or "toolchain:" in out


_IMPORTS_SCRIPT = ("import io, json, sys, contextlib\n"
                   "from flashcompress.cli import main\n"
                   "with contextlib.redirect_stdout(io.StringIO()):\n"
                   "    rc = main(sys.argv[1:])\n"
                   "print(json.dumps([rc, [m for m in ('tvm_ffi', 'torch') if m in sys.modules]]))\n")


def _imports_of(env: dict[str, str], *argv: str) -> list[str]:
    """The heavy modules (tvm_ffi, torch) a fresh process imported while answering ``flashcompress ARGV``."""
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_SCRIPT, *argv], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    rc, imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rc == 0, proc.stderr
    return imported


def _fake_plan_entry(root: Path) -> None:
    leaf = root / cache.package_version() / "sm90a" / "fc_plan_online0_ratio4" / ("0" * 16) / ("1" * 16)
    leaf.mkdir(parents=True)
    (leaf / "variant.json").write_text(json.dumps(
        {"family": "plan", "params": {"online": False, "ratio": 4}, "target": "cuda:9.0a"}))


def test_read_only_commands_import_no_tvm_ffi(private_env: dict[str, str]) -> None:
    """`prewarm --list` never loads tvm-ffi; `cache info|list` of an empty cache load neither tvm-ffi nor torch."""
    assert "tvm_ffi" not in _imports_of(private_env, "prewarm", "--model", "deepseek-v4-flash", "--list")
    assert _imports_of(private_env, "cache", "info") == []
    assert _imports_of(private_env, "cache", "list") == []


def test_cache_info_of_entries_imports_no_tvm_ffi(private_env: dict[str, str]) -> None:
    _fake_plan_entry(Path(private_env["FLASHCOMPRESS_CACHE_DIR"]))
    assert "tvm_ffi" not in _imports_of(private_env, "cache", "info")


# ----------------------------------------------------------------------------- issue 26, item 9


def test_cache_help_describes_every_action_and_options_sit_where_used(
        private_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["cache", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for action, words in (("info", "item counts"), ("list", "one line per cache item"),
                          ("verify", "hash-check"), ("clean", "asks first")):
        assert re.search(rf"^\s+{action}\s+.*{words}", out, re.M), out
    for argv in (["cache", "list", "--delete-bad"], ["cache", "info", "--stale"], ["cache", "verify", "--stale"],
                 ["cache", "clean", "--delete-bad"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["config", "--help"])
    assert "where it came from" in capsys.readouterr().out


def test_clean_confirmation(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "_isatty", lambda stream: False)
    assert cli._confirm("remove 3 item(s) under /x?") is False
    assert "refusing" in capsys.readouterr().err
    monkeypatch.setattr(cli, "_isatty", lambda stream: True)
    for answer, expected in (("y", True), ("yes", True), ("", False), ("n", False)):
        monkeypatch.setattr("builtins.input", lambda prompt: answer)
        assert cli._confirm("remove 3 item(s) under /x?") is expected


def test_bad_jobs_value_is_named(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLASHCOMPRESS_JOBS", "abc")
    code, _, err = run_cli("config", capsys=capsys)
    assert code == 2 and "FLASHCOMPRESS_JOBS must be a non-negative integer, got 'abc'" in err
    assert "invalid literal" not in err


def test_unknown_variable_warning_names_the_callers_line(private_env: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcompress.jit import settings

    monkeypatch.setenv("FLASHCOMPRESS_OFLINE", "1")
    with pytest.warns(UserWarning, match="did you mean FLASHCOMPRESS_OFFLINE") as record:
        settings.reload_settings()
    assert record[0].filename == __file__  # this test's line, not one of flashcompress's
    proc = cli_subprocess(dict(private_env, FLASHCOMPRESS_OFLINE="1"), "config")
    assert proc.returncode == 0
    assert proc.stderr.splitlines()[0] == ("flashcompress: warning: FLASHCOMPRESS_OFLINE is not a flashcompress "
                                           "setting and is ignored; did you mean FLASHCOMPRESS_OFFLINE?")
    assert ".py:" not in proc.stderr


API_CALL = """
import torch
from flashcompress import CompressorDecodePlan
r2t = torch.zeros(2, 16, dtype=torch.int32)
f2s = torch.zeros(16 + 256 + 1, dtype=torch.int64)
CompressorDecodePlan.generate(4, torch.tensor([1]), r2t, f2s, torch.tensor([3]), 256, 8)
print("planned")
"""


def test_settings_are_validated_on_the_api_path(private_env: dict[str, str]) -> None:
    from _jit_helpers import run_python

    proc = run_python(API_CALL, dict(private_env, FLASHCOMPRESS_BACKEND="cuda"))
    assert proc.returncode == 1 and "planned" not in proc.stdout
    assert "SettingsError: FLASHCOMPRESS_BACKEND must be one of auto, torch, jit, got 'cuda'" in proc.stderr
    proc = run_python(API_CALL, dict(private_env, FLASHCOMPRESS_OFLINE="1"))
    assert proc.returncode == 0 and "planned" in proc.stdout
    assert "<string>:6: UserWarning: FLASHCOMPRESS_OFLINE is not a flashcompress setting" in proc.stderr


def test_prewarm_unknown_family_hides_the_test_family(private_env: dict[str, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli("prewarm", "nosuch", capsys=capsys)
    assert code == 2 and "unknown JIT kernel family 'nosuch'; known: compress, plan, plan_host, store" in err
    assert "selftest" not in err


@pytest.mark.parametrize("arch,target", [("sm_90a", "cuda:9.0a"), ("sm90a", "cuda:9.0a"), ("9.0a", "cuda:9.0a"),
                                         ("cuda:10.0a", "cuda:10.0a"), ("8.0", "cuda:8.0"), ("sm_86", "cuda:8.6")])
def test_arch_spellings_accepted(private_env: dict[str, str], capsys: pytest.CaptureFixture[str], arch: str,
                                 target: str) -> None:
    code, out, _ = run_cli("prewarm", "--list", "plan:ratio=4,online=false", "--arch", arch, capsys=capsys)
    assert code == 0 and f"@ {target}\n" in out


@pytest.mark.parametrize("arch,message", [("sm90", "ambiguous CUDA target 'sm90'"), ("9.0", "'9.0a'"),
                                          ("7.5", "needs sm_80 or newer"), ("sm_70", "needs sm_80 or newer"),
                                          ("8.6a", "no 'a' targets before 9.0")])
def test_arch_spellings_refused(private_env: dict[str, str], capsys: pytest.CaptureFixture[str], arch: str,
                                message: str) -> None:
    code, _, err = run_cli("prewarm", "--list", "plan:ratio=4,online=false", "--arch", arch, capsys=capsys)
    assert code == 2 and message in err and "accepted spellings: '9.0a', 'sm_90a', 'sm90a'" in err


def test_hip_target_the_compiler_cannot_build_is_named(private_env: dict[str, str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from flashcompress.jit import toolchain

    fake = tmp_path / "hipcc"
    fake.write_text("#!/bin/sh\necho \"clang: error: invalid target ID 'gfx942'; format is ...\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(toolchain, "get_toolchain", lambda backend, root: types.SimpleNamespace(device_compiler=fake))
    code, out, err = run_cli("prewarm", "selftest:value=3,block=128", "--arch", "gfx942", capsys=capsys)
    assert code == 2 and err.startswith("flashcompress prewarm: UnsupportedTarget: ")
    assert f"{fake} cannot compile for gfx942" in err and "Nothing was built" in err
    assert "prewarming" not in out and not (Path(private_env["FLASHCOMPRESS_CACHE_DIR"]) / "0.1.0").exists()
    fake.write_text("#!/bin/sh\nexit 0\n")
    assert cli._hip_target_problem("hip:gfx942") is None


def test_demo_bad_device_is_one_line(private_env: dict[str, str]) -> None:
    proc = cli_subprocess(private_env, "demo", "--device", "gpu")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "flashcompress demo: --device must be cpu, cuda or cuda:N, got 'gpu'"
