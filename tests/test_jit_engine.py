"""JIT engine tests: settings, families, keys, cache hits/misses, races, corruption, errors.

Tests marked ``nvcc`` compile the ``selftest`` family for sm_90a with the real
nvcc (no GPU needed) into a session-wide temporary cache; each distinct variant
costs one cold build (~4-5 s on 2 cores), so tests reuse variants where they can
and use private ones only when they damage entries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _jit_helpers import apply_environ, readme_settings_block, requires_nvcc, reset_engine, run_python

from flashcompress import jit
from flashcompress.jit import build, cache, engine, errors, family, flags, maintenance, render, settings, variant

# ----------------------------------------------------------------------------- fixtures


# (fixtures shared_cache / jit_env / private_env live in conftest.py)


def replace_file(path: Path, data: bytes) -> None:
    """Give ``path`` new content through a new inode (never rewrite a library in place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def selftest_key(value: int, block: int = 128, target: str | None = None) -> jit.VariantKey:
    return jit.make_key("selftest", target=target, value=value, block=block)


def check_module(module, value: int, block: int = 128) -> None:
    import torch

    x = torch.arange(10, dtype=torch.float32)
    out = torch.empty_like(x)
    module.add_value_cpu(x, out)
    assert torch.equal(out, x + value)
    assert module.variant_value() == value and module.variant_block() == block
    assert module.variant_arch() == "90a"
    with pytest.raises(ValueError, match="x: expected a cuda tensor, got one on cpu:0"):
        module.quant_probe(x[:8], torch.zeros((8, 4), dtype=torch.uint8))


# ----------------------------------------------------------------------------- settings


def test_import_is_cheap(private_env: dict[str, str]) -> None:
    proc = run_python("import sys, flashcompress.jit\n"
                      "print(sorted(m for m in ('torch', 'tvm_ffi', 'jinja2', 'filelock') if m in sys.modules))",
                      private_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_settings_precedence(private_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings.reload_settings()
    assert s.jobs == 0 and s.default_cuda_archs == ("9.0a",) and s.offline is False
    assert s.origin("jobs").endswith(("default-cache-config.toml", ".cache-config.toml"))
    user = tmp_path / "user.toml"
    user.write_text('jobs = 3\noffline = true\ndefault_cuda_archs = ["9.0a", "10.0a"]\n')
    monkeypatch.setenv("FLASHCOMPRESS_CONFIG", str(user))
    s = settings.reload_settings()
    assert (s.jobs, s.offline, s.default_cuda_archs) == (3, True, ("9.0a", "10.0a"))
    assert s.origin("jobs") == str(user)
    monkeypatch.setenv("FLASHCOMPRESS_JOBS", "5")
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "0")
    s = settings.reload_settings()
    assert (s.jobs, s.offline) == (5, False) and s.origin("jobs") == "$FLASHCOMPRESS_JOBS"


@pytest.mark.parametrize("var,value", [("FLASHCOMPRESS_JOBS", "many"), ("FLASHCOMPRESS_OFFLINE", "maybe"),
                                       ("FLASHCOMPRESS_BACKEND", "cuda")])
def test_settings_reject_bad_values(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                    var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(settings.SettingsError, match=var):
        settings.reload_settings()


def test_settings_unknown_key_in_user_file(private_env: dict[str, str], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "user.toml"
    user.write_text('cache-dir = "/tmp/x"\n')
    monkeypatch.setenv("FLASHCOMPRESS_CONFIG", str(user))
    with pytest.raises(settings.SettingsError, match="unknown setting 'cache-dir'"):
        settings.reload_settings()


def test_backend_and_debug_switches(private_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert jit.jit_enabled_for(torch.device("cuda", 0)) is True
    assert jit.jit_enabled_for(torch.device("cpu")) is False
    assert jit.debug_checks_enabled() is False
    monkeypatch.setenv("FLASHCOMPRESS_BACKEND", "torch")
    monkeypatch.setenv("FLASHCOMPRESS_DEBUG", "1")
    settings.reload_settings()
    assert jit.jit_enabled_for(torch.device("cuda", 0)) is False
    assert jit.debug_checks_enabled() is True


def test_settings_doc_is_current() -> None:
    doc = readme_settings_block()
    assert doc == settings.markdown_table().rstrip("\n"), (
        "regenerate the README's Settings block with `flashcompress config --markdown`"
    )
    for setting in settings.SCHEMA:
        assert setting.env in doc



# ----------------------------------------------------------------------------- families and keys


def test_family_space_validation_and_expansion() -> None:
    fam = family.Family("toyfam", sources=(("x.cu.j2", "kernel.cu"),),
                        space={"ratio": (4, 128), "online": (False, True)},
                        validate=lambda p: (_ for _ in ()).throw(ValueError("online needs ratio 128"))
                        if p["online"] and p["ratio"] != 128 else None,
                        presets={"deepseek-v4-flash": [{"ratio": 4, "online": False}]})
    assert fam.expand() == [{"ratio": 4, "online": False}, {"ratio": 128, "online": False},
                            {"ratio": 128, "online": True}]
    assert fam.expand({"ratio": 128}) == [{"ratio": 128, "online": False}, {"ratio": 128, "online": True}]
    with pytest.raises(ValueError, match="online needs ratio 128"):
        fam.check_params({"ratio": 4, "online": True})
    with pytest.raises(ValueError, match="not one of"):
        fam.check_params({"ratio": 4, "online": 0})  # int is not bool
    with pytest.raises(ValueError, match="exactly"):
        fam.check_params({"ratio": 4})
    assert fam.preset_params("deepseek-v4-flash") == [{"ratio": 4, "online": False}]
    assert fam.preset_params("deepseek-v4-pro") == []
    with pytest.raises(ValueError, match="unknown model"):
        fam.preset_params("llama")
    with pytest.raises(ValueError, match="reserved|bad parameter"):
        family.Family("toyfam2", sources=(("x.cu.j2", "kernel.cu"),), space={"backend": ("a",)})


def test_family_defaults_fill_left_out_params() -> None:
    fam = family.Family("toyfam", sources=(("x.cu.j2", "kernel.cu"),),
                        space={"ratio": (4, 128), "tiling": ("auto", "whole_row")}, defaults={"tiling": "auto"})
    assert fam.key("cuda:9.0a", ratio=4) == fam.key("cuda:9.0a", ratio=4, tiling="auto")
    assert fam.key("cuda:9.0a", ratio=4, tiling="whole_row").module_name == "fc_toyfam_ratio4_tilingwhole_row"
    assert len(fam.expand({"ratio": 128})) == 2  # a default does not narrow the space
    with pytest.raises(ValueError, match="exactly"):
        fam.check_params({"ratio": 4})  # explicit param dicts stay complete
    with pytest.raises(ValueError, match="not in its space"):
        family.Family("toyfam3", sources=(("x.cu.j2", "kernel.cu"),), space={"ratio": (4,)}, defaults={"ratio": 8})


def test_compress_tiling_is_part_of_the_key(private_env: dict[str, str]) -> None:
    params = {"ratio": 128, "online": False, "head_dim": 512, "in_dtype": "f32", "state_dtype": "f32",
              "out_dtype": "f32", "store": "v4"}
    auto, whole = (jit.make_key("compress", "cuda:9.0a", **params, tiling=t) for t in ("auto", "whole_row"))
    assert jit.make_key("compress", "cuda:9.0a", **params) == auto
    assert auto != whole and auto.module_name != whole.module_name
    assert whole.module_name.endswith("_tilingwhole_row")


def test_variant_key_names(private_env: dict[str, str]) -> None:
    key = selftest_key(3)
    assert key == jit.make_key("selftest", block=128, value=3)  # param order is irrelevant
    assert hash(key) == hash(jit.make_key("selftest", block=128, value=3))
    assert key.params == (("block", 128), ("value", 3))
    assert key.target == "cuda:9.0a"
    assert key.module_name == "fc_selftest_block128_value3"
    assert key.describe() == "selftest(block=128, value=3) @ cuda:9.0a"
    assert family.parse_spec(key.spec()) == ("selftest", {"block": 128, "value": 3})
    neg = selftest_key(-5)
    assert neg.module_name == "fc_selftest_block128_valuem5"
    hip = selftest_key(3, target="gfx942")
    assert hip.target == "hip:gfx942" and variant.target_tag(hip.target) == "gfx942"
    assert variant.target_arch(hip.target) == "gfx942"
    for text in ("9.0a", "90a", "sm_90a", "cuda:9.0a"):
        assert variant.normalize_target(text) == "cuda:9.0a"
    with pytest.raises(ValueError):
        variant.normalize_target("volta")
    with pytest.raises(ValueError, match="must be an int"):
        jit.make_key("selftest", value="3", block=128)
    with pytest.raises(jit.UnknownFamily, match="nosuchfamily"):
        jit.make_key("nosuchfamily")


def test_hip_build_commands(private_env: dict[str, str]) -> None:
    """HIP is not precluded: a hip target produces hipcc commands with --offload-arch (not run)."""
    from flashcompress.jit.toolchain import Toolchain, TvmFfiInfo

    key = selftest_key(3, target="hip:gfx942")
    fam = jit.get_family("selftest")
    tc = Toolchain("hip", Path("/opt/rocm"), Path("/opt/rocm/bin/hipcc"), Path("/usr/bin/c++"), "hipcc x", "c++ y")
    tvm = TvmFfiInfo("0", (Path("/inc"),), Path("/lib"), "tvm_ffi")
    compiles, (link,) = build.plan_steps(key, fam, tc, tvm, ["config.h", "kernel.cu", "binding.cpp"],
                                         Path("/jk"), "m.so", Path("/leaf"))
    kernel = next(s for s in compiles if s.label == "compile kernel.cu")
    assert kernel.argv[0].endswith("hipcc") and "--offload-arch=gfx942" in kernel.argv
    assert kernel.env["HIP_PLATFORM"] == "amd"
    assert "-lamdhip64" in link.argv
    assert [s.label for s in compiles] == ["compile kernel.cu", "compile binding.cpp"]  # config.h not compiled


def test_sources_digest_covers_templates_and_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file under templates/ and jit_kernel/ counts (path + content); nothing else does."""
    templates, headers = tmp_path / "templates", tmp_path / "jit_kernel"
    shutil.copytree(render.template_dir(), templates)
    shutil.copytree(render.kernel_include_dir(), headers)
    render.clear_digest_memo()
    base = render.sources_digest()
    monkeypatch.setattr(render, "template_dir", lambda: templates)
    monkeypatch.setattr(render, "kernel_include_dir", lambda: headers)

    def digest() -> str:
        render.clear_digest_memo()
        return render.sources_digest()

    assert digest() == base  # same content at another path
    for path in (headers / "selftest.cuh", templates / "plan_kernel.cu.j2"):
        original = path.read_text()
        path.write_text(original + "\n// edited\n")
        assert digest() != base, path
        path.write_text(original)
    (headers / "new.cuh").write_text("// a new header\n")
    assert digest() != base
    (headers / "new.cuh").unlink()
    (tmp_path / "unrelated.h").write_text("// outside both trees\n")
    assert digest() == base
    render.clear_digest_memo()


@requires_nvcc
@pytest.mark.nvcc
def test_key_changes_only_with_inputs(jit_env: dict[str, str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    key = selftest_key(3)
    base = engine.resolve(key).layout.key
    assert engine.resolve(key).layout.key == base
    # Not otherwise: another cache root, recomputed digests, a fresh toolchain probe.
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(tmp_path / "elsewhere"))
    reset_engine()
    other_root = engine.resolve(key)
    assert other_root.layout.key == base and other_root.layout.root == tmp_path / "elsewhere"
    # The arch.
    assert engine.resolve(selftest_key(3, target="cuda:10.0a")).layout.key != base
    # A parameter.
    assert engine.resolve(selftest_key(4)).layout.key != base
    # Any file under jit_kernel/ or templates/ (edit a copy of the tree): every variant's key changes.
    plan = jit.make_key("plan", ratio=4, online=False)
    plan_base = engine.resolve(plan).layout.key
    headers = tmp_path / "jit_kernel"
    shutil.copytree(render.kernel_include_dir(), headers)
    monkeypatch.setattr(render, "kernel_include_dir", lambda: headers)

    def keys() -> tuple[str, str]:
        render.clear_digest_memo()
        return engine.resolve(key).layout.key, engine.resolve(plan).layout.key

    assert keys() == (base, plan_base)  # identical content, different path: same keys
    (headers / "selftest.cuh").write_text((headers / "selftest.cuh").read_text() + "\n// edited\n")
    selftest_edited, plan_edited = keys()
    assert selftest_edited != base and plan_edited != plan_base
    assert selftest_edited.split("/")[1] == base.split("/")[1], "a header edit changes the input digest only"
    render.clear_digest_memo()
    monkeypatch.undo()
    apply_environ(monkeypatch, jit_env)
    assert engine.resolve(key).layout.key == base
    # A base flag and a family flag.
    monkeypatch.setattr(flags, "BASE_CUDA_FLAGS", flags.BASE_CUDA_FLAGS + ("-DEXTRA=1",))
    assert engine.resolve(key).layout.key != base
    monkeypatch.setattr(flags, "BASE_CUDA_FLAGS", flags.BASE_CUDA_FLAGS[:-1])
    original = jit.get_family("selftest")
    try:
        family.register_family(dataclasses.replace(original, cuda_flags=("-use_fast_math",)))
        assert engine.resolve(key).layout.key != base
    finally:
        family.register_family(original)
    assert engine.resolve(key).layout.key == base
    # The compiler version.
    real = engine.get_toolchain

    def other_compiler(backend, root):  # noqa: ANN001, ANN202
        return dataclasses.replace(real(backend, root), device_version="nvcc: release 99.9")

    monkeypatch.setattr(engine, "get_toolchain", other_compiler)
    other = engine.resolve(key).layout.key
    assert other != base and other.split("/")[0] == base.split("/")[0], "compilers: the toolchain digest only"


# ----------------------------------------------------------------------------- builds


@requires_nvcc
@pytest.mark.nvcc
def test_cold_build_then_cache_hit(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    key = selftest_key(3)
    first = jit.acquire(key)
    assert first.status in ("built", "hit")  # "hit" when another test of this session built it first
    check_module(first.module, 3)
    assert jit.load(key) is first.module and jit.get_module("selftest", value=3, block=128) is first.module
    leaf = first.path
    assert (leaf / "variant.json").is_file() and (leaf / f"{key.module_name}.so").is_file()
    assert {"kernel.cu", "binding.cpp", "config.h", "build.log"} <= {p.name for p in leaf.iterdir()}
    manifest = json.loads((leaf / "variant.json").read_text())
    assert manifest["params"] == {"block": 128, "value": 3} and manifest["target"] == "cuda:9.0a"
    # <version>/<tag>/<module>/<input digest>/<toolchain digest>
    assert leaf.parent.parent.name == key.module_name and leaf.parent.parent.parent.name == "sm90a"
    assert leaf.parent.parent.parent.parent.name == cache.package_version()

    # Same process, memo forgotten: a disk hit, no compiler (subprocess.run would be the compiler).
    engine.clear_memo()
    builds = build.build_counter()

    def no_compiler(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError(f"compiler invoked on a cache hit: {args}")

    with monkeypatch.context() as patch:
        patch.setattr(build.subprocess, "run", no_compiler)
        second = jit.acquire(key)
    assert second.status == "hit" and build.build_counter() == builds
    check_module(second.module, 3)

    # A fresh process: a hit, nothing built, no ninja/nvcc child ever started.
    proc = run_python(textwrap.dedent("""
        import json, subprocess
        from flashcompress.jit import VariantKey, make_key, engine, build
        calls = []
        real = subprocess.Popen.__init__
        def spy(self, *a, **k):
            calls.append(a[0] if a else k.get("args"))
            return real(self, *a, **k)
        subprocess.Popen.__init__ = spy
        a = engine.acquire(make_key("selftest", value=3, block=128))
        print(json.dumps({"status": a.status, "builds": build.build_counter(), "children": calls}))
    """), jit_env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"status": "hit", "builds": 0, "children": []}


RACE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import torch, tvm_ffi, jinja2, filelock  # import before the barrier
    from flashcompress.jit import VariantKey, make_key, engine, build
    key = make_key("selftest", value=7, block=64)
    barrier = Path(sys.argv[1])
    (barrier / f"ready-{os.getpid()}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.002)
    a = engine.acquire(key)
    x = torch.arange(4, dtype=torch.float32); out = torch.empty_like(x); a.module.add_value_cpu(x, out)
    print(json.dumps({"status": a.status, "builds": build.build_counter(), "ok": bool(torch.equal(out, x + 7))}))
""")


@requires_nvcc
@pytest.mark.nvcc
def test_four_processes_race_one_build(private_env: dict[str, str], tmp_path: Path) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RACE_SCRIPT, str(barrier)], env=private_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    deadline = time.time() + 120
    while len(list(barrier.glob("ready-*"))) < 4 and time.time() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    (barrier / "go").touch()
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sorted(r["status"] for r in results) == ["built", "waited", "waited", "waited"]
    assert sum(r["builds"] for r in results) == 1 and all(r["ok"] for r in results)
    module_dir = next(Path(private_env["FLASHCOMPRESS_CACHE_DIR"]).glob("*/sm90a/fc_selftest_block64_value7"))
    (input_dir,) = [p for p in module_dir.iterdir() if p.is_dir()]
    assert len([p for p in input_dir.iterdir() if p.is_dir()]) == 1  # one entry, no staging debris


def zero_middle_in_place(path: Path, length: int = 4096) -> None:
    """Zero ``length`` bytes in the middle of ``path`` in place (same inode and size), then set the
    mtime back, as a careless copy tool or a bad disk would leave it."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek((st.st_size // 2) // length * length)
        f.write(b"\0" * length)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


@requires_nvcc
@pytest.mark.nvcc
def test_corrupt_library_is_detected_removed_and_rebuilt(jit_env: dict[str, str]) -> None:
    key = selftest_key(11)
    # Build in another process: this one must never have mapped the library it damages (dlopen
    # would hand back the already-loaded copy, and rewriting a mapped library in place crashes).
    proc = run_python("from flashcompress.jit import VariantKey, make_key, acquire\n"
                      "print(acquire(make_key('selftest', value=11, block=128)).path)", jit_env)
    assert proc.returncode == 0, proc.stderr
    leaf = Path(proc.stdout.strip().splitlines()[-1])
    library = leaf / f"{key.module_name}.so"
    good = library.read_bytes()
    # Same size, same inode, same mtime, 4 KiB of zeros mid-file: dlopen may well still succeed (the
    # damage can sit in code that is never run), so loads do not hash; `cache verify` catches it.
    zero_middle_in_place(library)
    assert maintenance.verify_entry(leaf) == (False, f"{library.name}: sha256 mismatch")
    # A damaged ELF header (same size): the load fails; warned about, removed, rebuilt.
    replace_file(library, b"\0" * 4096 + good[4096:])
    builds = build.build_counter()
    with pytest.warns(errors.CacheCorruptionWarning, match="failed to load"):
        again = jit.acquire(key)
    assert again.status == "rebuilt" and build.build_counter() == builds + 1
    check_module(again.module, 11)
    assert maintenance.verify_entry(leaf) == (True, "ok")
    # Truncated (a half-copied file): caught by the size check, warned about, removed, rebuilt.
    replace_file(library, good[: len(good) // 2])
    engine.clear_memo()
    builds = build.build_counter()
    with pytest.warns(errors.CacheCorruptionWarning, match="truncated"):
        again = jit.acquire(key)
    assert again.status == "rebuilt" and build.build_counter() == builds + 1
    check_module(again.module, 11)
    assert maintenance.verify_entry(leaf) == (True, "ok")


@requires_nvcc
@pytest.mark.nvcc
def test_offline_mode(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    jit.acquire(selftest_key(3))  # cached (built by this or an earlier test)
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "1")
    settings.reload_settings()
    check_module(jit.get_module("selftest", value=3, block=128), 3)  # a hit is fine offline
    builds = build.build_counter()
    with pytest.raises(jit.OfflineCacheMiss) as info:
        jit.get_module("selftest", value=999, block=128)
    message = str(info.value)
    assert "selftest(block=128, value=999) @ cuda:9.0a" in message
    assert "FLASHCOMPRESS_OFFLINE=1" in message
    assert ("flashcompress prewarm --arch cuda:9.0a "
            "'selftest:block=128,value=999'") in message
    assert build.build_counter() == builds


NO_TOOLCHAIN_LOAD = textwrap.dedent("""
    import json, subprocess, sys
    import torch
    from flashcompress.jit import VariantKey, make_key, engine, build
    spawned = []
    real = subprocess.Popen.__init__
    def spy(self, *a, **k):
        spawned.append(a[0] if a else k.get("args"))
        return real(self, *a, **k)
    subprocess.Popen.__init__ = spy
    out = {}
    for family, params in json.loads(sys.argv[1]):
        a = engine.acquire(make_key(family, **params))
        out[family] = [a.status, str(a.path)]
        if family == "selftest":
            x = torch.arange(8, dtype=torch.float32); y = torch.empty_like(x); a.module.add_value_cpu(x, y)
            assert torch.equal(y, x + params["value"])
    print(json.dumps({"loaded": out, "builds": build.build_counter(), "children": spawned}))
""")


@requires_nvcc
@pytest.mark.nvcc
def test_prewarmed_cache_loads_without_the_toolchain(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime image without the CUDA toolkit (or without a host compiler) loads a prewarmed cache,
    offline or not; a miss there raises ToolchainMissing naming the compiler and both remedies."""
    wanted = [["selftest", {"value": 3, "block": 128}], ["plan", {"ratio": 4, "online": False}]]
    paths = {family: str(jit.acquire(jit.make_key(family, **params)).path) for family, params in wanted}
    for extra in ({"CUDA_HOME": "/nonexistent", "FLASHCOMPRESS_OFFLINE": "1"},
                  {"CUDA_HOME": "/nonexistent"},
                  {"CXX": "/nonexistent/c++"}):
        proc = subprocess.run([sys.executable, "-c", NO_TOOLCHAIN_LOAD, json.dumps(wanted)],
                              env=dict(jit_env, **extra), capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, (extra, proc.stderr)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result == {"loaded": {f: ["hit", p] for f, p in paths.items()}, "builds": 0, "children": []}, extra

    # A miss without nvcc (in this process: nothing is loaded).
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    reset_engine()
    builds = build.build_counter()
    with pytest.raises(jit.ToolchainMissing) as info:
        jit.get_module("selftest", value=998, block=128)
    err = info.value
    message = str(err)
    assert isinstance(err, jit.JitError) and isinstance(err, jit.OfflineCacheMiss)
    assert err.compilers == ["nvcc"]
    assert "selftest(block=128, value=998) @ cuda:9.0a" in message
    assert "no compiler was found" in message and "/nonexistent/bin/nvcc" in message
    assert ("flashcompress prewarm --arch cuda:9.0a "
            "'selftest:block=128,value=998'") in message
    assert "FLASHCOMPRESS_BACKEND=torch" in message
    assert build.build_counter() == builds
    # Same without a host compiler; offline is mentioned when set.
    monkeypatch.setenv("CUDA_HOME", jit_env["CUDA_HOME"])
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "1")
    reset_engine()
    with pytest.raises(jit.ToolchainMissing, match=r"(?s)`/nonexistent/c\+\+` missing; FLASHCOMPRESS_OFFLINE=1.*"
                                                   r"prewarm.*FLASHCOMPRESS_BACKEND=torch") as info:
        jit.get_module("selftest", value=998, block=128)
    assert info.value.compilers == ["/nonexistent/c++"]
    # `prewarm --dry-run` and `cache list` work without a compiler too.
    leaf, present = engine.lookup(selftest_key(3))
    assert present and str(leaf) == paths["selftest"]
    assert engine.lookup(selftest_key(998)) == (engine.resolve(selftest_key(998)).input_dir, False)


@requires_nvcc
@pytest.mark.nvcc
def test_other_compilers_rebuild_unless_offline(private_env: dict[str, str], shared_cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Compilers that differ from the builder's: a normal run rebuilds (another toolchain digest); an
    offline run loads the entry built from the same inputs (a sibling under the input digest), after
    checking that its manifest matches the directory it sits in."""
    key = selftest_key(3)
    jit_root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    # Seed this private cache with the session's entry instead of building it again.
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(shared_cache))
    reset_engine()
    shared_res = engine.resolve(key)
    jit.acquire(key)
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(jit_root))
    reset_engine()
    res = engine.resolve(key)
    shutil.copytree(shared_res.input_dir, res.input_dir)
    original = res.layout

    real = engine.get_toolchain

    def other_compiler(backend, root):  # noqa: ANN001, ANN202
        return dataclasses.replace(real(backend, root), device_version="nvcc: release 99.9")

    monkeypatch.setattr(engine, "get_toolchain", other_compiler)
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "1")
    settings.reload_settings()
    other = engine.resolve(key)
    assert other.layout.key != original.key and other.input_digest == res.input_digest
    offline = jit.acquire(key)
    assert offline.status == "hit" and offline.path == original.leaf
    check_module(offline.module, 3)
    # An entry whose manifest belongs to other inputs is not trusted.
    manifest_path = original.manifest
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps(dict(manifest, input_digest="0" * 16)))
    engine.clear_memo()
    with pytest.warns(errors.CacheCorruptionWarning, match="other sources, flags, target or compilers"):
        with pytest.raises(jit.OfflineCacheMiss):
            jit.acquire(key)
    shutil.rmtree(res.input_dir)
    shutil.copytree(shared_res.input_dir, res.input_dir)
    # Not offline: build with "these" compilers, next to the original entry.
    monkeypatch.setenv("FLASHCOMPRESS_OFFLINE", "0")
    settings.reload_settings()
    engine.clear_memo()
    rebuilt = jit.acquire(key)
    assert rebuilt.status == "built" and rebuilt.path == other.layout.leaf != original.leaf
    assert rebuilt.path.parent == original.leaf.parent
    # Back to the real compilers: their entry is a hit.
    monkeypatch.setattr(engine, "get_toolchain", real)
    reset_engine()
    again = jit.acquire(key)
    assert again.status == "hit" and again.path == original.leaf


@requires_nvcc
@pytest.mark.nvcc
def test_compile_error_is_reported(jit_env: dict[str, str]) -> None:
    key = selftest_key(5, block=100)  # static_assert: block must be a multiple of 32
    with pytest.raises(jit.BuildError) as info:
        jit.acquire(key)
    err = info.value
    message = str(err)
    assert "selftest(block=100, value=5) @ cuda:9.0a" in message
    assert "nvcc" in err.command and "kernel.cu" in err.command
    assert any("static assertion failed" in line for line in err.first_errors)
    assert err.log_path.is_file() and "static assertion failed" in err.log_path.read_text()
    assert str(err.log_path) in message
    module_dir = err.log_path.parent.parent
    assert not [p for p in module_dir.iterdir() if p.is_dir() and not p.name.endswith(".failed")]
    assert (err.log_path.parent / "build.sh").is_file()  # reproduce by hand


@requires_nvcc
@pytest.mark.nvcc
def test_template_error_names_variable(jit_env: dict[str, str], tmp_path: Path) -> None:
    import jinja2

    original = jit.get_family("selftest")
    broken = dataclasses.replace(original, name="selftest")
    templates = tmp_path / "templates"
    shutil.copytree(render.template_dir(), templates)
    (templates / "selftest_config.h.j2").write_text("constexpr int kX = {{ no_such_param }};\n")
    render._ENVIRONMENT = None
    old_dir = render.template_dir
    try:
        render.template_dir.cache_clear()
        render.template_dir = lambda: templates  # type: ignore[assignment]
        family.register_family(broken)
        with pytest.raises(jinja2.UndefinedError, match="no_such_param"):
            jit.acquire(selftest_key(17))
    finally:
        render.template_dir = old_dir  # type: ignore[assignment]
        render._ENVIRONMENT = None
        family.register_family(original)


@requires_nvcc
@pytest.mark.nvcc
def test_killed_build_leaves_nothing_loadable(private_env: dict[str, str]) -> None:
    code = ("from flashcompress.jit import VariantKey, make_key, engine\n"
            "engine.acquire(make_key('selftest', value=23, block=128))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=private_env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    deadline = time.time() + 60
    while time.time() < deadline and not list(root.glob("*/*/*/*/.staging-*/build.log")):
        time.sleep(0.01)
    time.sleep(0.2)  # the compilers are running now (a build takes well over a second)
    os.killpg(proc.pid, signal.SIGKILL)  # the build process and its compilers
    proc.wait()
    key = selftest_key(23)
    res = engine.resolve(key)
    assert not res.layout.leaf.exists(), "a killed build published an entry"
    assert res.layout.stale_stagings(), "expected the killed build's staging directory"
    again = jit.acquire(key)
    assert again.status == "built"
    check_module(again.module, 23)
    assert not res.layout.stale_stagings(), "the next builder sweeps the killed build's staging"


def _unwritable_dir(tmp_path: Path) -> Path | None:
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        return ro / "cache"
    candidate = Path("/sys/flashcompress-test-cache")  # root: chmod does not stop us, sysfs does
    try:
        candidate.mkdir()
    except OSError:
        return candidate
    candidate.rmdir()
    return None


@requires_nvcc
@pytest.mark.nvcc
def test_read_only_cache_dir_error(private_env: dict[str, str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    target = _unwritable_dir(tmp_path)
    if target is None:
        pytest.skip("no unwritable directory available")
    monkeypatch.setenv("FLASHCOMPRESS_CACHE_DIR", str(target))
    reset_engine()
    with pytest.raises(jit.CacheNotWritable) as info:
        jit.acquire(selftest_key(3))
    message = str(info.value)
    assert "FLASHCOMPRESS_CACHE_DIR" in message and "cache_dir" in message
    assert "selftest(block=128, value=3)" in message


@requires_nvcc
@pytest.mark.nvcc
def test_no_build_during_graph_capture(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    jit.acquire(selftest_key(3))
    engine.clear_memo()
    monkeypatch.setattr(engine, "_is_capturing", lambda: True)
    check_module(jit.acquire(selftest_key(3)).module, 3)  # loading a cached variant is allowed
    with pytest.raises(jit.CaptureBuildError, match="CUDA-graph capture"):
        jit.acquire(selftest_key(31))


@requires_nvcc
@pytest.mark.nvcc
def test_force_rebuild_once_per_process(jit_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    jit.acquire(selftest_key(3))
    engine.clear_memo()
    monkeypatch.setenv("FLASHCOMPRESS_FORCE_REBUILD", "1")
    settings.reload_settings()
    first = jit.acquire(selftest_key(3))
    assert first.status == "rebuilt"
    engine._MEMO.clear()
    assert jit.acquire(selftest_key(3)).status == "hit"
    check_module(first.module, 3)


def test_size_cap_evicts_other_versions_then_lru(tmp_path: Path) -> None:
    root = tmp_path / "c"
    current = cache.package_version()

    def entry(version: str, module: str, key: str, age: float) -> Path:
        leaf = root / version / "sm90a" / module / "inputs" / key
        leaf.mkdir(parents=True)
        (leaf / "x.so").write_bytes(b"\0" * 1000)
        os.utime(leaf, (time.time() - age, time.time() - age))
        return leaf

    old_version = entry("0.0.1", "fc_a", "k1", 10)
    lru = entry(current, "fc_b", "k2", 100)
    recent = entry(current, "fc_c", "k3", 50)
    just_built = entry(current, "fc_d", "k4", 500)
    removed = cache.enforce_size_cap(root, 2500, keep=just_built)
    assert removed == [old_version, lru]
    assert recent.exists() and just_built.exists()


@requires_nvcc
@pytest.mark.nvcc
def test_concurrent_first_use_of_a_fresh_cache(private_env: dict[str, str]) -> None:
    """Prewarm threads hitting an empty cache at once: root creation and compiler probes must not race."""
    import threading

    from flashcompress.jit import toolchain

    root = Path(private_env["FLASHCOMPRESS_CACHE_DIR"])
    errors_seen: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait()
            cache.ensure_root(root)
            toolchain.get_toolchain("cuda", root)
        except BaseException as exc:  # noqa: BLE001
            errors_seen.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors_seen
    assert (root / cache.CACHEDIR_TAG).is_file()
    assert len(list((root / ".toolchain").glob("*.txt"))) == 2 and not list((root / ".toolchain").glob(".*tmp"))


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


@requires_nvcc
@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
def test_gpu_launch_streams_and_graph_capture(jit_env: dict[str, str]) -> None:
    """On a GPU: the kernel runs on the caller's current stream, also under CUDA-graph capture;
    a cached variant may be first-loaded inside capture, a build is refused there."""
    import torch

    assert jit.detect_target() == "cuda:9.0a"
    module = jit.get_module("selftest", value=3, block=128)
    x = torch.arange(4096, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    module.add_value(x, out)
    torch.cuda.synchronize()
    assert torch.equal(out, x + 3)

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        out2 = torch.empty_like(x)
        module.add_value(x, out2)
    side.synchronize()
    assert torch.equal(out2, x + 3)

    with pytest.raises(ValueError, match="float32|1-D"):
        module.add_value(x.view(64, 64), out.view(64, 64))

    jit.acquire(selftest_key(11))  # cached before capture, loaded for the first time inside it
    engine.clear_memo()
    graph = torch.cuda.CUDAGraph()
    y = torch.empty_like(x)
    z = torch.empty_like(x)
    with torch.cuda.graph(graph):
        jit.get_module("selftest", value=3, block=128).add_value(x, y)
        jit.get_module("selftest", value=11, block=128).add_value(y, z)
        with pytest.raises(jit.CaptureBuildError):
            jit.get_module("selftest", value=37, block=128)
    x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(z, x + 14)


@requires_nvcc
@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU")
def test_gpu_prewarm_warm_launch(jit_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from flashcompress import cli

    engine.clear_memo()
    code = cli.main(["prewarm", "selftest:value=3,block=128"])
    out = capsys.readouterr().out
    assert code == 0 and "warm-launched 1 variant(s) on the GPU" in out
