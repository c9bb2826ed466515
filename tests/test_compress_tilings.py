"""The compress family's ``tiling`` parameter on the CPU: every value is a distinct variant key,
validated, listed by ``prewarm --list``, rendered into the kernel template and accepted by
``set_tiling``; the model presets keep the default tiling (``closing`` is an A/B variant).

The kernels themselves: tests/test_cluster_tiling.py (each tiling's Cfg), test_pdl_order.py (the
write passes' wait order per tiling), the GPU tests (test_gpu_compress.py over ``TILINGS``).
"""

from __future__ import annotations

import re

import pytest

from flashcompress import cli, jit
from flashcompress.cuda_ops import compress as cc
from flashcompress.jit import family
from flashcompress.jit.render import render_sources

ONLINE = {"ratio": 128, "online": True, "head_dim": 512, "in_dtype": "f32", "state_dtype": "f32",
          "out_dtype": "f32", "store": "none"}
_ENUM = {"auto": "kAuto", "whole_row": "kWholeRow", "closing": "kClosing"}


def test_tilings_are_the_family_space() -> None:
    fam = family.get_family("compress")
    assert dict(fam.space)["tiling"] == cc.TILINGS
    assert set(cc.TILINGS) == set(_ENUM)
    assert dict(fam.defaults)["tiling"] == "auto"


def test_each_tiling_is_its_own_key(private_env: dict[str, str]) -> None:
    keys = {t: jit.make_key("compress", "cuda:9.0a", **ONLINE, tiling=t) for t in cc.TILINGS}
    assert len(set(keys.values())) == len(cc.TILINGS)
    assert len({k.module_name for k in keys.values()}) == len(cc.TILINGS)
    assert keys["closing"].module_name.endswith("_tilingclosing")
    assert jit.make_key("compress", "cuda:9.0a", **ONLINE) == keys["auto"]
    assert family.parse_spec(keys["closing"].spec()) == ("compress", {**ONLINE, "tiling": "closing"})


def test_tiling_validation() -> None:
    fam = family.get_family("compress")
    fam.check_params({**ONLINE, "tiling": "closing"})
    fam.check_params({**ONLINE, "ratio": 4, "online": False, "head_dim": 128, "tiling": "closing"})
    with pytest.raises(ValueError, match="not one of"):
        fam.check_params({**ONLINE, "tiling": "spread"})
    saved = cc.current_tiling()
    try:
        cc.set_tiling("closing")
        assert cc.current_tiling() == "closing"
        with pytest.raises(ValueError, match="closing"):  # the message lists the values
            cc.set_tiling("spread")
        assert cc.current_tiling() == "closing"
    finally:
        cc.set_tiling(saved)


@pytest.mark.parametrize("tiling", sorted(_ENUM))
def test_the_template_instantiates_the_tiling(tiling: str) -> None:
    fam = family.get_family("compress")
    key = fam.key("cuda:9.0a", **ONLINE, tiling=tiling)
    sources = render_sources(key, fam)
    for name, text in sources.items():
        found = set(re.findall(r"Tiling::(k\w+)", text))
        assert found == {_ENUM[tiling]}, (name, found)


def test_prewarm_lists_every_tiling_but_presets_keep_auto(private_env: dict[str, str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    spec = "compress:" + ",".join(f"{k}={v}" for k, v in ONLINE.items())
    assert cli.main(["prewarm", "--list", spec]) == 0
    listed = capsys.readouterr().out.splitlines()[:-1]
    tilings = [re.search(r"tiling='(\w+)'", line).group(1) for line in listed]
    assert tilings == list(cc.TILINGS)
    assert cli.main(["prewarm", "--list", f"{spec},tiling=closing"]) == 0
    listed = capsys.readouterr().out.splitlines()[:-1]
    assert len(listed) == 1 and "tiling='closing'" in listed[0]
    for model in ("deepseek-v4-flash", "deepseek-v4-pro"):
        presets = family.get_family("compress").preset_params(model)
        assert presets and {p["tiling"] for p in presets} == {"auto"}, model
