"""Thread block clusters only where the target has them (CPU, needs nvcc).

A C128 row that is stored is pooled by an 8-block cluster on sm_90 and later; on CUDA targets
before sm_90 (and on HIP) every C128 row is pooled by one 512-thread block instead
(jit_kernel/compress_config.cuh, Cfg::kWholeRow; FC_HAS_CLUSTERS comes from the kernel template),
and so is every C128 row of a ``tiling="whole_row"`` variant on any target. A cluster instruction
in a pre-sm_90 build would not assemble, and a cluster launch fails there, so this test compiles
the C128 variants to PTX for sm_90a, sm_89 and sm_80 and checks where the cluster instructions
(and PDL) appear; the GPU tests run the whole-row tiling on the H200 through the same parameter.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from _jit_helpers import NVCC, REPO, requires_nvcc_only, variant_ptx
from flashcompress.cuda_ops.compress import TILINGS

pytestmark = requires_nvcc_only

F32 = {"in_dtype": "f32", "state_dtype": "f32", "out_dtype": "f32"}
_CLUSTER = re.compile(r"barrier\.cluster|mapa\.|st\.async|\.shared::cluster")
_PDL = re.compile(r"griddepcontrol\.")


def _ptx(params: dict, target: str, tmp: Path) -> str:
    return variant_ptx("compress", params, tmp, target)


@pytest.mark.parametrize("store", ["v4", "bf16"])
def test_clusters_on_sm90_only(tmp_path, store: str) -> None:
    params = {"ratio": 128, "online": False, "head_dim": 512, "store": store, **F32}
    hopper = _ptx(params, "cuda:9.0a", tmp_path)
    assert _CLUSTER.search(hopper), "sm_90a: the C128 store epilogue should exchange sums across a cluster"
    assert _PDL.search(hopper)
    for target in ("cuda:8.9", "cuda:8.0"):
        ptx = _ptx(params, target, tmp_path)
        hit = _CLUSTER.search(ptx)
        assert hit is None, f"{target}: cluster instruction {hit.group(0)!r} in a target without clusters"
        assert _PDL.search(ptx) is None, f"{target}: griddepcontrol in a target without PDL"
        # every kernel of the family is at most a 512-thread block, two per SM
        assert set(re.findall(r"\.maxntid (\d+)", ptx)) <= {"512", "256"}, target


@pytest.mark.parametrize("store", ["v4", "none"])
def test_whole_row_tiling_needs_no_clusters_on_sm90(tmp_path, store: str) -> None:
    params = {"ratio": 128, "online": False, "head_dim": 512, "store": store, **F32}
    auto = _ptx({**params, "tiling": "auto"}, "cuda:9.0a", tmp_path)
    whole = _ptx({**params, "tiling": "whole_row"}, "cuda:9.0a", tmp_path)
    assert (_CLUSTER.search(auto) is not None) == (store != "none")
    hit = _CLUSTER.search(whole)
    assert hit is None, f"whole_row: cluster instruction {hit.group(0)!r}"
    assert _PDL.search(whole), "whole_row keeps programmatic dependent launch on sm_90a"
    assert re.findall(r"\.maxntid (\d+)", whole) and set(re.findall(r"\.maxntid (\d+)", whole)) <= {"512", "256"}
    assert auto != whole


def _tilings(tmp: Path, has_clusters: int) -> dict[tuple[str, ...], dict[str, int]]:
    exe = tmp / f"tiling{has_clusters}"
    cmd = [NVCC, "-std=c++17", f"-DFC_HAS_CLUSTERS={has_clusters}", f"-I{REPO / 'jit_kernel'}",
           str(REPO / "tests" / "native" / "compress_tiling_check.cu"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr[-3000:]}"
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert lines[0] == f"has_clusters {has_clusters}"
    fields = ("chans", "split", "batch", "lanes", "csplit", "threads", "cluster", "load_batch", "per_split")
    return {tuple(p[:6]): dict(zip(fields, map(int, p[6:]))) for p in (line.split() for line in lines[1:])}


def test_tiling_by_target(tmp_path) -> None:
    """Each configuration's tiling with and without clusters (the build also checks, at compile
    time, that a store variant pools with its compress_forward variant's tiling)."""
    both_cl, both_nocl = _tilings(tmp_path, 1), _tilings(tmp_path, 0)
    assert both_cl.keys() == both_nocl.keys() and len(both_cl) == 60  # 20 configurations x 3 tilings
    assert {k[0] for k in both_cl} == set(TILINGS)
    # tiling="whole_row" tiles as a target without clusters, on every target
    for key, t in both_cl.items():
        if key[0] == "whole_row":
            assert t == both_nocl[key] == both_nocl[("auto", *key[1:])], key
    cl = {k[1:]: v for k, v in both_cl.items() if k[0] == "auto"}
    nocl = {k[1:]: v for k, v in both_nocl.items() if k[0] == "auto"}
    dec, pre = ("128", "0", "512", "v4", "decode"), ("128", "0", "512", "v4", "prefill")
    # sm_90: a stored C128 row is an 8-block cluster of 512 threads (decode and prefill: 64
    # channels per block); the stored online prefill is a cluster of 4 blocks of 128 channels
    assert (cl[dec]["csplit"], cl[dec]["cluster"], cl[dec]["threads"]) == (8, 1, 512)
    assert (cl[pre]["csplit"], cl[pre]["cluster"], cl[pre]["chans"]) == (8, 1, 64)
    online_pre = ("128", "1", "512", "v4", "prefill")
    assert (cl[online_pre]["csplit"], cl[online_pre]["chans"]) == (4, 128)
    # without clusters: one 512-thread block per C128 row, stored or not, online prefill included
    for key, t in nocl.items():
        if key[0] == "128" and not (key[1] == "1" and key[4] == "decode"):
            assert (t["chans"], t["split"], t["csplit"], t["cluster"], t["threads"]) == (512, 4, 1, 0, 512), key
    # ratio 4 and online decode tile the same on every target
    for key in cl:
        if key[0] == "4" or (key[1] == "1" and key[4] == "decode"):
            assert cl[key] == nocl[key], key


def test_online_prefill_spread_tiling(tmp_path) -> None:
    """The online C128 prefill passes that store no cache row (pass 1 of ``compress_forward``, the
    write list of every variant) spread a segment over 16 blocks of 32 channels on sm_90 (128
    threads, no cluster) and load a thread's 8 entries in one burst, with the stored pass 1's
    per-channel merge sequence (entries per split, fold batch, splits, combine lanes); without
    clusters every online prefill pass pools whole rows."""
    rows = _tilings(tmp_path, 1)
    auto = {k[1:]: v for k, v in rows.items() if k[0] == "auto"}
    stored = auto[("128", "1", "512", "v4", "prefill")]
    assert (stored["chans"], stored["csplit"], stored["threads"], stored["cluster"], stored["load_batch"]) == \
        (128, 4, 512, 1, 2)
    spread = [("128", "1", "512", "none", "prefill"), ("128", "1", "512", "none", "write"),
              ("128", "1", "512", "v4", "write")]
    for key in spread:
        t = auto[key]
        assert (t["chans"], t["csplit"], t["threads"], t["cluster"], t["load_batch"]) == (32, 16, 128, 0, 8), key
        for field in ("split", "batch", "lanes", "per_split"):
            assert t[field] == stored[field], (key, field)
    for key, t in _tilings(tmp_path, 0).items():
        if key[1:3] == ("128", "1") and key[5] != "decode":
            assert (t["chans"], t["csplit"], t["threads"]) == (512, 1, 512), key
