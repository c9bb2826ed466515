"""``flashcompress.integrations.sglang`` against the real SGLang 0.5.23 wheel.

The wheel is ``$FC_SGLANG_WHEEL`` if set, else ``.sglwhl/sglang-0.5.23-*.whl``
in the checkout, else fetched once (``pip download --no-deps sglang==0.5.23`` into
``$FLASHCOMPRESS_CACHE_DIR/../sglang-wheel``, else pytest's cache dir; the tests
skip with the reason when it cannot be fetched) and its Python sources are
unpacked, without dependencies, into a temporary target.  SGLang's own
``compressor_v2`` module is imported from there and driven through a small
engine loop (state pools, chunked prefill, decode, a CUDA-graph-style padded
decode) with ``apply()`` on; every state row and cache byte must equal the same
loop run through flashcompress directly.

Stubs (modules that cannot import without SGLang's GPU / server dependencies):

  sglang, sglang.kernels, sglang.kernels.ops, sglang.kernels.ops.attention
      package shells: the wheel's directories without running their
      ``__init__`` (the frontend API, the kernel inventory and registry import
      transformers, msgspec, triton); every submodule is the wheel's own file.
  sglang.srt.utils (and .common)
      imports triton, PIL, starlette, orjson, psutil, ...; the stub answers the
      four platform probes the compressor path uses (is_cuda / is_hip / is_xpu /
      is_gfx95_supported) with False: the CUDA code path, no HIP / XPU branch.
  sglang.kernels.jit.utils.compile
      SGLang's nvcc / ninja JIT loader (imports msgspec); ``load_jit`` raises
      ``SGLangKernelReached``, so any call that reaches one of SGLang's own
      kernels fails the test loudly.
  sglang.srt.layers.attention.dsa.utils
      imports triton; the stub holds the two names ``compress.py`` imports.
  the leaves of the V4.1 modules (``dsv41_sparse``, ``fp4_indexer_rope``)
      ``gemm.bf16_fp32``, ``gemm.router_gemv_hip``, ``layernorm.rmsnorm_fp32``,
      ``srt.layers.linear``, ``srt.layers.quantization.base_config`` and
      ``dsv4.fp4_indexer`` import triton / msgspec / the distributed runtime;
      each stub holds only the names those two modules import (the GEMM and
      norm stubs raise ``SGLangKernelReached`` if called), and
      ``gemm``, ``layernorm``, ``quantization`` are package shells as above.

The engine objects around SGLang's code (the KV pool, the compressor layer, the
forward batch, the attention backend's metadata) are small test doubles of the
interfaces ``compressor_v2`` reads.  CPU tensors here; with a GPU present the
``gpu``-marked variants run the same loop on CUDA with a real CUDA graph.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import flashcompress as fc
import flashcompress.integrations.sglang as fc_sglang
from flashcompress.layouts import INDEXER_FP4, INDEXER_FP8, MAIN_FORMATS, MAIN_V4

VERSION = "0.5.23"
REPO = Path(__file__).resolve().parent.parent
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")])]


# --------------------------------------------------------------------------- the wheel


def _wheel_dir(config: pytest.Config) -> Path:
    cache = os.environ.get("FLASHCOMPRESS_CACHE_DIR")
    path = Path(cache).parent / "sglang-wheel" if cache else Path(config.cache.mkdir("sglang-wheel"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _fetch_wheel(config: pytest.Config) -> Path:
    """The SGLang wheel: ``$FC_SGLANG_WHEEL``, else one in the checkout's ``.sglwhl/``, else the
    cached download (fetched on first use); skips the tests if it cannot be had."""
    named = os.environ.get("FC_SGLANG_WHEEL")
    if named:
        if not Path(named).is_file():
            pytest.fail(f"FC_SGLANG_WHEEL={named} is not a file")
        return Path(named)
    local = sorted((REPO / ".sglwhl").glob(f"sglang-{VERSION}-*.whl"))
    if local:
        return local[-1]
    where = _wheel_dir(config)
    found = sorted(where.glob(f"sglang-{VERSION}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
               f"sglang=={VERSION}", "-d", str(where)]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot download the SGLang {VERSION} wheel: {e}")
        found = sorted(where.glob(f"sglang-{VERSION}-*.whl"))
        if run.returncode or not found:
            pytest.skip(f"cannot download the SGLang {VERSION} wheel: {(run.stderr or run.stdout).strip()[-400:]}")
    return found[-1]


def _unpack(wheel: Path, target: Path) -> None:
    """Install without dependencies: the wheel's Python sources and its dist-info (for the version)."""
    with zipfile.ZipFile(wheel) as z:
        members = [n for n in z.namelist()
                   if (n.startswith("sglang/") and n.endswith(".py")) or n.startswith(f"sglang-{VERSION}.dist-info/")]
        z.extractall(target, members)


# --------------------------------------------------------------------------- stubs


class SGLangKernelReached(AssertionError):
    """SGLang's own JIT loader was called: a compressor op ran on SGLang's kernels, not flashcompress's."""


def _load_jit(*args: object, **kwargs: object) -> None:
    raise SGLangKernelReached(f"sglang load_jit{args!r}")


def _no(*_: object, **__: object) -> bool:
    return False


def _install_stubs(target: Path) -> None:
    def module(name: str, package: bool = False, **attrs: object) -> None:
        m = types.ModuleType(name)
        if package:
            m.__path__ = [str(target.joinpath(*name.split(".")))]
        m.__dict__.update(attrs)
        sys.modules[name] = m

    for name in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.attention"):
        module(name, package=True)
    platform = dict(is_cuda=_no, is_hip=_no, is_xpu=_no, is_gfx95_supported=_no)
    module("sglang.srt.utils", package=True, **platform)
    module("sglang.srt.utils.common", **platform)
    module("sglang.kernels.jit.utils.compile", load_jit=_load_jit, make_cpp_args=_no, parallel_compile=_no,
           cuda_stubs_dir=_no, KERNEL_PATH=target / "sglang" / "kernels" / "jit")
    module("sglang.srt.layers.attention.dsa.utils", INDEXER_K_CACHE_PRESHUFFLE_TILE=16,
           aiter_can_use_preshuffle_paged_mqa=_no)
    # the V4.1 modules' leaves (dsv41_sparse, fp4_indexer_rope)
    for name in ("sglang.kernels.ops.gemm", "sglang.kernels.ops.layernorm", "sglang.kernels.ops.quantization",
                 "sglang.srt.layers.quantization"):
        module(name, package=True)
    sys.modules["sglang.srt.utils"].add_prefix = lambda name, prefix: f"{prefix}.{name}" if prefix else name
    module("sglang.kernels.ops.gemm.bf16_fp32", linear_bf16_fp32=_load_jit)
    module("sglang.kernels.ops.gemm.router_gemv_hip", rocm_gemv_split_k_max_tokens=lambda **_: -1)
    module("sglang.kernels.ops.layernorm.rmsnorm_fp32", rmsnorm_fp32=_load_jit)
    module("sglang.srt.layers.linear", ReplicatedLinear=torch.nn.Module)
    module("sglang.srt.layers.quantization.base_config", QuantizationConfig=object)
    module("sglang.kernels.ops.attention.dsv4.fp4_indexer", INDEX_K_SLOT_BYTES=68)


@pytest.fixture(scope="module")
def sgl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """SGLang's real modules (``compressor_v2``, the dsv4 ops package, ``KVLayout``), imported from the wheel."""
    wheel = _fetch_wheel(request.config)
    target = tmp_path_factory.mktemp("sglang-target")
    _unpack(wheel, target)
    saved_path = list(sys.path)
    sys.path.insert(0, str(target))
    _install_stubs(target)
    import importlib

    mods = SimpleNamespace(
        layer=importlib.import_module("sglang.srt.layers.attention.dsv4.compressor_v2"),
        ops=importlib.import_module("sglang.kernels.ops.attention.dsv4"),
        compress=importlib.import_module("sglang.kernels.ops.attention.dsv4.compress"),
        KVLayout=importlib.import_module("sglang.kernels.ops.attention.dsv4.kv_layout").KVLayout,
        low_ratio=importlib.import_module(fc_sglang.LOW_RATIO_MODULE),
        index_k=importlib.import_module(fc_sglang.INDEX_K_MODULE),
        dsv41=importlib.import_module(fc_sglang.GATE_MODULE),
        root=target / "sglang",
    )
    yield mods
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    sys.path[:] = saved_path


@pytest.fixture()
def no_handle_left() -> None:
    """Fail (and clean up) if a test leaves the integration applied."""
    yield
    active = fc_sglang._active
    if active is not None and active.active:
        active.revert()
        pytest.fail("a test left flashcompress.integrations.sglang applied")


# --------------------------------------------------------------------------- the engine world

SWA_PAGE = 256  # DeepSeek-V4's SWA page
MAX_LEN = 512  # req_to_token width; request slot r owns full locs [r * MAX_LEN, (r + 1) * MAX_LEN)
SLOTS = 4  # slot 0 is the CUDA-graph padding slot
FULL_TOKENS = SLOTS * MAX_LEN
RING = {4: 8, 128: 128}
EPS = 1e-6


@dataclass
class Layer:
    """One compressor layer's parameters, state pool and compressed KV cache."""

    ratio: int
    head_dim: int
    indexer: bool
    in_dtype: torch.dtype
    online: bool  # online C128: one running-state row per request slot
    fp4: bool  # FP4 indexer cache
    ape: torch.Tensor
    norm_weight: torch.Tensor
    state: torch.Tensor  # [rows, width] fp32
    cache: torch.Tensor  # uint8 [pages, page bytes]
    page_size: int
    inputs: torch.Tensor  # [SLOTS, MAX_LEN, width]: the projection of every (request, position)

    @property
    def width(self) -> int:
        return self.state.shape[1]


@dataclass(frozen=True)
class Variant:
    """Which of SGLang's compressor configurations the world uses."""

    fp4_indexer: bool = False  # the backend's enable_deepseek_v4_fp4_indexer
    online_c128: bool = False  # SGLANG_OPT_USE_ONLINE_COMPRESS=1

    def __str__(self) -> str:
        return "+".join(n for n, on in (("fp4-indexer", self.fp4_indexer), ("online-c128", self.online_c128)) if on) or "v4"


VARIANTS = [Variant(), Variant(fp4_indexer=True, online_c128=True)]


@dataclass
class World:
    device: torch.device
    variant: Variant
    layers: list[Layer]
    req_to_token: torch.Tensor
    full_to_swa: torch.Tensor
    freqs_cis: torch.Tensor
    layout: object = "v4"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _state_pool(ratio: int, head_dim: int, online: bool, g: torch.Generator) -> torch.Tensor:
    """A state pool sized as the engine guide says; garbage rows (the kernels must not read them)."""
    if online:
        return torch.randn(SLOTS + 2, 3 * head_dim, generator=g)
    width, ring = (4 if ratio == 4 else 2) * head_dim, RING[ratio]
    rows = FULL_TOKENS // SWA_PAGE * ring if ratio == 4 else SLOTS * ring
    state = torch.randn(_round_up(rows + ring + 1, ratio), width, generator=g)
    state[-1, : width // 2], state[-1, width // 2:] = 0.0, float("-inf")  # the cleared last row
    return state


def make_world(device: str, variant: Variant = Variant(), layout: object = "v4") -> World:
    """Three layers of DeepSeek-V4 (C4 main / C4 indexer / C128 main), filled from one seed; the
    main-KV caches in ``layout`` (SGLang's ``KVLayout`` or its string: the pool's extra-key layout)."""
    main = MAIN_FORMATS[fc.KVLayout(str(getattr(layout, "value", layout)).lower())]
    dev = torch.device(device)
    g = torch.Generator().manual_seed(30)
    layers = []
    for ratio, head_dim, indexer, in_dtype in ((4, 512, False, torch.bfloat16), (4, 128, True, torch.float32),
                                               (128, 512, False, torch.float32)):
        online, fp4 = ratio == 128 and variant.online_c128, indexer and variant.fp4_indexer
        page_size = SWA_PAGE // ratio if ratio == 4 else 2
        fmt = (INDEXER_FP4 if fp4 else INDEXER_FP8) if indexer else main
        pages = -(-(FULL_TOKENS // ratio) // page_size)
        width = (4 if ratio == 4 else 2) * head_dim
        layers.append(Layer(
            ratio, head_dim, indexer, in_dtype, online, fp4,
            ape=torch.randn(8 if ratio == 4 else 128, head_dim, generator=g).to(dev),
            norm_weight=(1 + 0.1 * torch.randn(head_dim, generator=g)).to(dev),
            state=_state_pool(ratio, head_dim, online, g).to(dev),
            cache=torch.zeros(pages, fmt.page_bytes(page_size), dtype=torch.uint8, device=dev),
            page_size=page_size,
            inputs=torch.randn(SLOTS, MAX_LEN, width, generator=g).to(in_dtype).to(dev),
        ))
    locs = torch.arange(FULL_TOKENS, dtype=torch.int32).view(SLOTS, MAX_LEN)
    full_to_swa = torch.cat([torch.arange(FULL_TOKENS + SWA_PAGE), torch.tensor([-1])])
    angles = torch.arange(MAX_LEN)[:, None] * (10000.0 ** (-torch.arange(32) / 32))[None, :]
    return World(dev, variant, layers, locs.to(dev), full_to_swa.to(dev), torch.polar(torch.ones_like(angles), angles).to(dev),
                 layout)


# Each step: (kind, [(request slot, prefix length, new tokens)]).  Request 1 is prefilled in two
# chunks; the decode steps cross C4 boundaries and the C128 boundaries at 128 and 256.
PREFILL = [("prefill", [(1, 0, 160), (2, 0, 120)]), ("prefill", [(1, 160, 90), (3, 0, 133)])]
EAGER_DECODE = [("decode", [(1, 250 + i, 1), (2, 120 + i, 1), (3, 133 + i, 1)]) for i in range(6)]
GRAPH_BATCH = 4  # captured batch: 3 requests + 1 padding row (slot 0, seq_len 1)
GRAPH_DECODE = [("graph", [(1, 256 + i, 1), (2, 126 + i, 1), (3, 139 + i, 1)]) for i in range(5)]


def _batch(world: World, layer: Layer, reqs: list[tuple[int, int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's kv_score_input rows and out_loc (compressed slot = full loc // ratio)."""
    rows, locs = [], []
    for rid, prefix, new in reqs:
        rows.append(layer.inputs[rid, prefix:prefix + new])
        locs.append(world.req_to_token[rid, prefix:prefix + new].long() // layer.ratio)
    return torch.cat(rows), torch.cat(locs)


def _padded(reqs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    return reqs + [(0, 0, 1)] * (GRAPH_BATCH - len(reqs))


def snapshot(world: World) -> list[torch.Tensor]:
    """Every state pool and cache, as bytes."""
    return [t.view(torch.uint8).clone() for layer in world.layers for t in (layer.state, layer.cache)]


# --------------------------------------------------------------------------- the direct loop


def _direct_plan(world: World, ratio: int, reqs: list[tuple[int, int, int]], decode: bool):
    rpi = torch.tensor([r for r, _, _ in reqs], dtype=torch.int64, device=world.device)
    seq = torch.tensor([p + n for _, p, n in reqs], dtype=torch.int64)
    ext = torch.tensor([n for _, _, n in reqs], dtype=torch.int64)
    r2t, dev = world.req_to_token, world.device
    if ratio == 128 and world.variant.online_c128:
        if decode:
            return fc.CompressorDecodePlan.generate_online(seq.to(dev), rpi, r2t)
        return fc.CompressorPrefillPlan.generate_online(seq, ext, rpi, r2t, int(ext.sum()))
    if decode:
        return fc.CompressorDecodePlan.generate(ratio, rpi, r2t, world.full_to_swa, seq.to(dev), SWA_PAGE, RING[ratio])
    return fc.CompressorPrefillPlan.generate(ratio, rpi, seq, ext, r2t, world.full_to_swa, SWA_PAGE, RING[ratio],
                                             int(ext.sum()))


def _direct_layer(world: World, layer: Layer, plan, inp: torch.Tensor, loc: torch.Tensor) -> None:
    kv = fc.compress_forward(layer.state, inp, layer.ape, plan, head_dim=layer.head_dim, compress_ratio=layer.ratio,
                             is_online=layer.online)
    layout = "v4" if layer.indexer else str(getattr(world.layout, "value", world.layout))
    fc.compress_norm_rope_store(kv, plan, norm_weight=layer.norm_weight, norm_eps=EPS, freq_cis=world.freqs_cis,
                                out_loc=loc, kvcache=layer.cache, page_size=layer.page_size, use_fp4=layer.fp4,
                                layout=layout)


def run_direct(world: World) -> list[list[torch.Tensor]]:
    """The engine loop on flashcompress's API: one snapshot after each phase."""
    shots = []
    for phase in (PREFILL, EAGER_DECODE, None, GRAPH_DECODE):
        if phase is None:  # the graph's warm-up call: a batch of padding rows only
            phase = [("graph", [])]
        for kind, reqs in phase:
            reqs = _padded(reqs) if kind == "graph" else reqs
            plans = {r: _direct_plan(world, r, reqs, kind != "prefill") for r in RING}
            for layer in world.layers:
                _direct_layer(world, layer, plans[layer.ratio], *_batch(world, layer, reqs))
        shots.append(snapshot(world))
    return shots


# --------------------------------------------------------------------------- the SGLang loop


class _Pool:
    """The ``DeepSeekV4TokenToKVPool`` surface ``compressor_v2`` reads."""

    uniform_fp8 = False
    _unified_kv = False
    swa_page_size = SWA_PAGE

    def __init__(self, world: World) -> None:
        self.world = world
        self.full_to_swa_index_mapping = world.full_to_swa
        self.layer_mapping = {i: (None, None, object()) for i in range(len(world.layers))}

    def get_ring_size(self, compress_ratio: int) -> int:
        return RING[compress_ratio]

    def get_index_k_page_size(self, compress_ratio: int) -> int:
        return next(l.page_size for l in self.world.layers if l.indexer and l.ratio == compress_ratio)

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        return self.world.layers[layer_id].cache

    get_extra_key_buffer = get_index_k_with_scale_buffer

    def get_extra_key_page_size(self, layer_id: int) -> int:
        return self.world.layers[layer_id].page_size

    def get_extra_key_layout(self, layer_id: int) -> object:
        return self.world.layout


class _Compressor:
    """The DeepSeek-V4 ``Compressor`` layer surface: parameters, state pool; the projection is the input."""

    def __init__(self, world: World, layer: Layer) -> None:
        self.ratio, self.head_dim, self.is_in_indexer, self.rotate = layer.ratio, layer.head_dim, layer.indexer, layer.indexer
        self.ape, self.freqs_cis = layer.ape, world.freqs_cis
        self.norm = SimpleNamespace(weight=layer.norm_weight, variance_epsilon=EPS)
        self._state = SimpleNamespace(kv_score_buffer=SimpleNamespace(kv_score=layer.state))

    def compute_kv_score(self, x: torch.Tensor, forward_batch: object) -> torch.Tensor:
        return x

    def get_state_pool(self, backend: object) -> object:
        return self._state


_FORWARD_BATCH = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: False))


class SGLangEngine:
    """SGLang's attention-backend side: its ``CompressorBackendMixin`` and ``create_paged_compressor_data``."""

    def __init__(self, sgl: SimpleNamespace, world: World) -> None:
        backend_cls = type("Backend", (sgl.layer.CompressorBackendMixin,), {})
        self.backend = backend_cls()
        self.backend.token_to_kv_pool = _Pool(world)
        self.backend.enable_deepseek_v4_fp4_indexer = world.variant.fp4_indexer
        self.sgl, self.world = sgl, world
        self.compressors = [_Compressor(world, layer) for layer in world.layers]

    def metadata(self, reqs: list[tuple[int, int, int]], decode: bool) -> SimpleNamespace:
        """The backend's ``forward_metadata``: plans through SGLang's planner code, out_loc per ratio."""
        w = self.world
        rpi = torch.tensor([r for r, _, _ in reqs], dtype=torch.int64, device=w.device)
        seq = [p + n for _, p, n in reqs]
        ext = [n for _, _, n in reqs]
        core, plans = SimpleNamespace(), {}
        for ratio in RING:
            plans[f"c{ratio}_compress_metadata"] = self.sgl.layer.create_paged_compressor_data(
                ratio, is_prefill=not decode, token_to_kv_pool=self.backend.token_to_kv_pool,
                req_to_token=w.req_to_token, req_pool_indices=rpi, seq_lens=torch.tensor(seq, device=w.device),
                extend_lens=None if decode else torch.tensor(ext, device=w.device),
                seq_lens_cpu=None if decode else seq, extend_lens_cpu=None if decode else ext)
            layer = next(l for l in w.layers if l.ratio == ratio)
            setattr(core, f"c{ratio}_out_loc", _batch(w, layer, reqs)[1])
        return SimpleNamespace(core_metadata=core, **plans)

    def forward(self, metadata: SimpleNamespace, inputs: list[torch.Tensor]) -> None:
        """Every layer's compressor through SGLang's ``forward_unified``."""
        self.backend.forward_metadata = metadata
        for layer_id, (compressor, x) in enumerate(zip(self.compressors, inputs)):
            self.backend.forward_unified(x, _FORWARD_BATCH, layer_id, compressor)

    def step(self, reqs: list[tuple[int, int, int]], decode: bool) -> None:
        self.forward(self.metadata(reqs, decode), [_batch(self.world, l, reqs)[0] for l in self.world.layers])


class GraphDecode:
    """A captured padded decode: static plans / out_loc / inputs, refreshed in place before each replay."""

    def __init__(self, engine: SGLangEngine) -> None:
        self.engine = engine
        w = engine.world
        self.meta = engine.metadata(_padded([]), decode=True)
        self.inputs = [_batch(w, l, _padded([]))[0].clone() for l in w.layers]
        engine.forward(self.meta, self.inputs)  # warm-up (loads the kernels): padding rows only
        self.graph = None
        if w.device.type == "cuda":
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                engine.forward(self.meta, self.inputs)

    def step(self, reqs: list[tuple[int, int, int]]) -> None:
        reqs = _padded(reqs)
        fresh = self.engine.metadata(reqs, decode=True)
        for ratio in RING:  # what SGLang's metadata copy does for a replay
            getattr(self.meta, f"c{ratio}_compress_metadata").copy_(getattr(fresh, f"c{ratio}_compress_metadata"))
            getattr(self.meta.core_metadata, f"c{ratio}_out_loc").copy_(getattr(fresh.core_metadata, f"c{ratio}_out_loc"))
        for static, layer in zip(self.inputs, self.engine.world.layers):
            static.copy_(_batch(self.engine.world, layer, reqs)[0])
        if self.graph is None:
            self.engine.forward(self.meta, self.inputs)
        else:
            self.graph.replay()


def run_sglang(sgl: SimpleNamespace, world: World) -> list[list[torch.Tensor]]:
    """The engine loop through SGLang's ``compressor_v2``: one snapshot after each phase (as ``run_direct``)."""
    engine = SGLangEngine(sgl, world)
    shots = []
    for _, reqs in PREFILL:
        engine.step(reqs, decode=False)
    shots.append(snapshot(world))
    for _, reqs in EAGER_DECODE:
        engine.step(reqs, decode=True)
    shots.append(snapshot(world))
    graph = GraphDecode(engine)
    shots.append(snapshot(world))
    for _, reqs in GRAPH_DECODE:
        graph.step(reqs)
    if world.device.type == "cuda":
        torch.cuda.synchronize()
    shots.append(snapshot(world))
    return shots


def _assert_same(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    names = [f"layer {i} {what}" for i in range(3) for what in ("state", "cache")]
    for phase, (g, w) in enumerate(zip(got, want)):
        for name, a, b in zip(names, g, w):
            if not torch.equal(a, b):
                bad = (a != b).nonzero()
                pytest.fail(f"phase {phase}: {name} differs in {bad.shape[0]} bytes, first at {bad[0].tolist()}")


def _assert_every_phase_writes(shots: list[list[torch.Tensor]], variant: Variant, layout: object = "v4") -> None:
    """Each compute phase stores into every cache and updates every state pool (the comparison is not vacuous)."""
    start = snapshot(make_world("cpu", variant, layout))
    for phase, (before, after) in enumerate(zip([start] + shots, shots)):
        if phase == 2:  # the graph warm-up: padding rows write state, store nothing
            continue
        for i, (a, b) in enumerate(zip(before, after)):
            assert not torch.equal(a.cpu(), b.cpu()), f"phase {phase} left tensor {i} unchanged"


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", VARIANTS, ids=str)
@pytest.mark.parametrize("fused", [False, True], ids=["two-step", "fused"])
def test_engine_loop_matches_flashcompress(sgl, no_handle_left, monkeypatch: pytest.MonkeyPatch, device: str,
                                           variant: Variant, fused: bool) -> None:
    if variant.online_c128:
        monkeypatch.setenv("SGLANG_OPT_USE_ONLINE_COMPRESS", "1")
    want = run_direct(make_world(device, variant))
    fused_calls = []
    compress_and_store = fc.compress_and_store
    monkeypatch.setattr(fc, "compress_and_store", lambda *a, **k: fused_calls.append(1) or compress_and_store(*a, **k))
    with fc_sglang.apply(fused=fused):
        got = run_sglang(sgl, make_world(device, variant))
    _assert_every_phase_writes(want, variant)
    _assert_same(got, want)
    # one call per layer and Python-side step: the graph warm-up, then on CUDA one capture (replays
    # launch without Python), on the CPU one eager call per graph-style step
    graph_calls = 1 + (1 if device == "cuda" else len(GRAPH_DECODE))
    calls = (len(PREFILL) + len(EAGER_DECODE) + graph_calls) * len(want[0]) // 2
    assert len(fused_calls) == (calls if fused else 0)


def test_without_apply_sglang_reaches_its_own_kernels(sgl) -> None:
    """The control: the same engine without ``apply()`` calls SGLang's JIT (stubbed to raise)."""
    with pytest.raises(SGLangKernelReached):
        SGLangEngine(sgl, make_world("cpu")).step(EAGER_DECODE[0][1], decode=True)


def _bound(prefix: str = "sglang") -> dict[tuple[str, str], int]:
    """id of every module-level object under ``prefix``."""
    from flashcompress.integrations._patching import engine_modules

    return {(m.__name__, k): id(v) for m in engine_modules(prefix) for k, v in vars(m).items()}


def test_apply_patches_every_binding_and_revert_restores_identity(sgl, no_handle_left) -> None:
    import importlib

    from flashcompress.integrations import _sglang_ops

    originals = {name: getattr(sgl.ops, name) for name in fc_sglang.OP_NAMES}
    mixin = sgl.layer.CompressorBackendMixin
    method = mixin.__dict__["_forward_compress_all_in_one"]
    before = _bound()
    handle = fc_sglang.apply()
    ours = {"CompressorDecodePlan": fc.CompressorDecodePlan, "CompressorPrefillPlan": fc.CompressorPrefillPlan,
            "compress_forward": fc.compress_forward, "compress_norm_rope_store": _sglang_ops.compress_norm_rope_store}
    for module in (sgl.ops, sgl.compress, sgl.layer):
        for name, obj in ours.items():
            assert getattr(module, name) is obj, f"{module.__name__}.{name} not patched"
    patched = {b.where for b in handle.bindings}
    assert {f"{m}.{n}" for m in (sgl.ops.__name__, sgl.compress.__name__, sgl.layer.__name__) for n in ours} <= patched
    assert mixin.__dict__["_forward_compress_all_in_one"] is method  # fused=False leaves the layer method alone
    with pytest.raises(fc_sglang.IntegrationError, match="already applied"):
        fc_sglang.apply()
    # a module imported while applied binds flashcompress's op; revert() restores it there too
    late = importlib.import_module("sglang.srt.layers.attention.dsv4.compressor_trtllm")
    assert late.compress_forward is fc.compress_forward
    handle.revert()
    assert late.compress_forward is originals["compress_forward"]
    after = _bound()
    assert {k: after.get(k) for k in before} == before
    for name, obj in originals.items():
        assert getattr(sgl.layer, name) is obj and getattr(sgl.ops, name) is obj
    handle.revert()  # idempotent
    assert not handle.active


def test_fused_wraps_the_layer_method_and_the_context_manager_reverts(sgl, no_handle_left) -> None:
    mixin = sgl.layer.CompressorBackendMixin
    method = mixin.__dict__["_forward_compress_all_in_one"]
    forward = sgl.layer.compress_forward
    with fc_sglang.apply(fused=True) as handle:
        wrapped = mixin.__dict__["_forward_compress_all_in_one"]
        assert wrapped is not method and wrapped.__wrapped__ is method
        assert f"{sgl.layer.__name__}.CompressorBackendMixin._forward_compress_all_in_one" in {b.where for b in handle.bindings}
        assert sgl.layer.compress_forward is not forward
    assert mixin.__dict__["_forward_compress_all_in_one"] is method
    assert sgl.layer.compress_forward is forward and not handle.active


def test_strict_refuses_unknown_versions(sgl, no_handle_left, monkeypatch: pytest.MonkeyPatch) -> None:
    assert fc_sglang.installed_version() == VERSION  # read from the wheel's dist-info
    monkeypatch.setattr(sys.modules["sglang"], "__version__", "0.6.0", raising=False)
    before = _bound()
    with pytest.raises(fc_sglang.UnsupportedVersionError, match=r"supports SGLang 0\.5\.23; found SGLang 0\.6\.0"):
        fc_sglang.apply()
    assert _bound() == before  # nothing patched
    with pytest.warns(UserWarning, match="0.6.0"):
        handle = fc_sglang.apply(strict=False)
    assert sgl.layer.compress_forward is fc.compress_forward
    handle.revert()
    assert _bound() == before


def _store_call(world: World, layer_id: int) -> tuple[object, dict[str, object]]:
    """A valid decode store for ``layer_id``: (kv, plan) and the SGLang keyword arguments."""
    layer = world.layers[layer_id]
    reqs = [(1, 7, 1)]  # seq_len 8: a boundary for ratio 4
    plan = _direct_plan(world, layer.ratio, reqs, decode=True)
    inp, loc = _batch(world, layer, reqs)
    kv = fc.compress_forward(layer.state, inp, layer.ape, plan, head_dim=layer.head_dim, compress_ratio=layer.ratio)
    return (kv, plan), dict(norm_weight=layer.norm_weight, norm_eps=EPS, freq_cis=world.freqs_cis, out_loc=loc,
                            kvcache=layer.cache, page_size=layer.page_size)


@pytest.mark.parametrize("keyword", ["kvcache_scale", "rope_cache", "fp4_k_write_metadata", "fp8_2buff",
                                     "kvcache_rope"])
def test_unsupported_store_keywords_raise_and_write_nothing(sgl, no_handle_left, keyword: str) -> None:
    world = make_world("cpu")
    args, kwargs = _store_call(world, 0)
    t = torch.zeros(4, dtype=torch.uint8)
    value = {"kvcache_scale": t, "rope_cache": (t, t), "fp4_k_write_metadata": object(),
             "fp8_2buff": True, "kvcache_rope": t}[keyword]
    cache = world.layers[0].cache.clone()
    with fc_sglang.apply():
        with pytest.raises(fc_sglang.UnsupportedFeatureError, match=keyword):
            sgl.layer.compress_norm_rope_store(*args, **kwargs, **{keyword: value})
    assert torch.equal(world.layers[0].cache, cache)


@pytest.mark.parametrize("layout", ["v41", "v41_fp4_new"])
@pytest.mark.parametrize("fused", [False, True], ids=["two-step", "fused"])
def test_v41_pool_through_sglang_matches_flashcompress(sgl, no_handle_left, fused: bool, layout: str) -> None:
    """SGLang's own code passes the pool's layout (``get_extra_key_layout``); a V4.1 pool's main-KV
    caches get the bytes of ``flashcompress.compress_norm_rope_store(layout=...)``, fused or not."""
    want = run_direct(make_world("cpu", layout=layout))
    with fc_sglang.apply(fused=fused):
        got = run_sglang(sgl, make_world("cpu", layout=sgl.KVLayout(layout)))
    _assert_every_phase_writes(want, Variant(), layout)
    _assert_same(got, want)
    assert want[-1][1].shape[1] == fc.KVLayout(layout).page_bytes(64)  # layer 0's cache: the layout's C4 pages


@pytest.mark.parametrize("fused", [False, True], ids=["two-step", "fused"])
def test_v41_layout_on_a_v4_sized_pool_raises_before_any_write(sgl, no_handle_left, fused: bool) -> None:
    """A layout whose cache size the pool does not have: flashcompress's named ValueError, nothing written."""
    world = make_world("cpu")
    world.layout = sgl.KVLayout.V41
    before = snapshot(world)
    with fc_sglang.apply(fused=fused):
        with pytest.raises(ValueError, match=r"^kvcache: expected \[pages, 33792\] \(v41 page of 64 tokens\)"):
            SGLangEngine(sgl, world).step(EAGER_DECODE[0][1], decode=True)
    after = snapshot(world)
    assert torch.equal(after[1], before[1])  # layer 0's (main-KV) cache: nothing stored
    if fused:  # the deferred compress never ran
        assert torch.equal(after[0], before[0])


def test_unknown_layout_raises_flashcompress_error(sgl, no_handle_left) -> None:
    world = make_world("cpu")
    args, kwargs = _store_call(world, 0)
    cache = world.layers[0].cache.clone()
    with fc_sglang.apply():
        with pytest.raises(ValueError, match="^layout: expected one of"):
            sgl.layer.compress_norm_rope_store(*args, **kwargs, layout="v5")
    assert torch.equal(world.layers[0].cache, cache)


@pytest.mark.parametrize("layout", ["V4", "v4", "KVLayout.V4"])
def test_v4_layout_is_accepted(sgl, no_handle_left, layout: str) -> None:
    value = sgl.KVLayout.V4 if layout == "KVLayout.V4" else layout
    got_world, want_world = make_world("cpu"), make_world("cpu")
    args, kwargs = _store_call(got_world, 0)
    with fc_sglang.apply():
        sgl.layer.compress_norm_rope_store(*args, **kwargs, layout=value)
    w_args, w_kwargs = _store_call(want_world, 0)
    fc.compress_norm_rope_store(*w_args, **w_kwargs)
    assert torch.equal(got_world.layers[0].cache, want_world.layers[0].cache)
    assert got_world.layers[0].cache.any()


def test_import_is_lazy() -> None:
    code = ("import sys, flashcompress.integrations.sglang as m; "
            "bad = [n for n in sys.modules if n.split('.')[0] in ('sglang', 'torch', 'tvm_ffi') "
            "or n.startswith(('flashcompress.jit', 'flashcompress.api', 'flashcompress.cuda_ops'))]; "
            "assert not bad, bad; print(m.SUPPORTED_VERSIONS)")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert VERSION in run.stdout


def test_apply_without_sglang_is_a_named_error(tmp_path: Path) -> None:
    code = ("import flashcompress.integrations.sglang as m\n"
            "try:\n    m.apply()\nexcept m.IntegrationError as e:\n    print('refused:', e)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "refused:" in run.stdout and "sglang.kernels.ops.attention.dsv4" in run.stdout


# --------------------------------------------------------------------------- V4.1 low-ratio layers
#
# SGLang's ``DeepseekV4AttnBackend._low_ratio_compress_fused`` (not importable here: it pulls in
# the whole serving runtime) imports the four entry points from their modules at call time and
# calls them with the pool's ``KVLayout``.  ``sglang_v41_call`` does the same; each case is
# built twice from one seed, once for the patched SGLang call and once for the direct
# flashcompress call, and every output and written buffer must be byte-equal.

V41_EPS = 1e-20  # V4.1-Flash's rms_norm_eps
V41_ROPE_ROWS = 64
V41_OPS = {  # case -> (SGLang module attribute of fc_sglang, entry point, indexes of the buffers it writes)
    "c1": ("LOW_RATIO_MODULE", "c1_decode_norm_rope_store", (6,)),
    "c2_decode": ("LOW_RATIO_MODULE", "c2_decode_norm_rope_store", (1, 8)),
    "c2_verify": ("LOW_RATIO_MODULE", "c2_decode_norm_rope_store", (1, 8)),
    "c2_prefill": ("LOW_RATIO_MODULE", "c2_prefill_norm_rope_store", (1, 8)),
    "index_k_r1": ("INDEX_K_MODULE", "index_k_norm_rope_pack_store", (6,)),
    "index_k_r2": ("INDEX_K_MODULE", "index_k_norm_rope_pack_store", (6,)),
}
V41_LAYOUTS = [m.value for m in fc.KVLayout]


def v41_case(case: str, device: str, layout: object = None) -> tuple[list[object], dict[str, object]]:
    """Fresh ``(args, kwargs)`` of one SGLang-style call of ``case`` (same seed, same bytes every time).

    Rows cover the sentinels: a padded row (slot / raw_out_loc 0), even and odd ratio-2
    positions, a verify block per request, a prefill with two requests and a padding row,
    index-K rows with loc 0 and -1.  ``layout=None`` leaves the keyword out (SGLang's default).
    """
    g = torch.Generator().manual_seed(41 + list(V41_OPS).index(case))
    dev = torch.device(device)
    angles = torch.arange(V41_ROPE_ROWS)[:, None] * (10000.0 ** (-torch.arange(32) / 32))[None, :]
    freqs = torch.view_as_real(torch.polar(torch.ones_like(angles), angles)).flatten(-2).contiguous()
    i64 = lambda v: torch.tensor(v, dtype=torch.int64, device=dev)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)
    lay = fc.KVLayout(str(getattr(layout, "value", layout) or "v4").lower())  # sizes the cache
    kw: dict[str, object] = {} if layout is None else {"layout": layout}
    if case.startswith("index_k"):
        x = torch.randn(5, 128, generator=g).to(torch.bfloat16)
        w = (1 + 0.1 * torch.randn(128, generator=g)).to(torch.bfloat16)
        cache = torch.zeros(2, 68 * 64, dtype=torch.uint8)
        args = [x, w, 1e-6, freqs, i64([0, 3, 7, 8, 20]), i64([0, -1, 9, 100, 64]), cache]
        return [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args], {"ratio": int(case[-1])}
    w = (1 + 0.1 * torch.randn(512, generator=g)).to(torch.bfloat16).to(dev)
    if case == "c1":
        x = (3 * torch.randn(6, 512, generator=g)).to(torch.bfloat16).to(dev)
        cache = torch.zeros(2, lay.page_bytes(256), dtype=torch.uint8, device=dev)
        args = [x, w, i64([0, 5, 17, 30, 31, 63]), i64([0, 5, 300, 17, 256, 42]), V41_EPS, freqs.to(dev), cache]
        return args, {"page_size": 256, **kw}
    if case == "c2_decode":  # one row per request; the last row is CUDA-graph padding
        ring, req, pos, raw, extra = 2, [1, 2, 3, 0], [7, 10, 33, 0], [15, 20, 101, 0], {}
    elif case == "c2_verify":  # two blocks of 3 drafts, one starting odd, one even
        ring, req, pos, raw = 8, [1, 1, 1, 2, 2, 2], [11, 12, 13, 4, 5, 6], [23, 24, 25, 260, 261, 262]
        extra = {"draft_len": 3}
    else:  # prefill: request 1 resumes at an odd position, request 2 starts, a padding row
        ring = 2
        req, pos = [1] * 6 + [2] * 3 + [0], [3, 4, 5, 6, 7, 8, 0, 1, 2, 0]
        raw = [100 + p for p in pos[:6]] + [300 + p for p in pos[6:9]] + [0]
        extra = {}
    kv = torch.randn(len(req), 1024, generator=g)
    state = torch.randn(fc.v41.pair_ring_rows(4, ring), 1024, generator=g)
    cache = torch.zeros(4, lay.page_bytes(128), dtype=torch.uint8)
    args = [kv.to(dev), state.to(dev), w, i64(pos), i64(req), i64(raw), V41_EPS, freqs.to(dev), cache.to(dev)]
    if case == "c2_prefill":
        args += [i32([0, 6]), i32([6, 3])]
    return args, {"page_size": 128, "ring_size": ring, **extra, **kw}


def sglang_v41_call(case: str, args: list[object], kwargs: dict[str, object]) -> object:
    """Call ``case``'s SGLang entry point the way ``_low_ratio_compress_fused`` does: imported from
    its module at call time, positional tensors, keyword options."""
    module_attr, name, _ = V41_OPS[case]
    import importlib

    return getattr(importlib.import_module(getattr(fc_sglang, module_attr)), name)(*args, **kwargs)


def direct_v41_call(case: str, args: list[object], kwargs: dict[str, object]) -> object:
    """The same call on flashcompress's op, with flashcompress's ``KVLayout``."""
    kwargs = dict(kwargs)
    if "layout" in kwargs:
        kwargs["layout"] = fc.KVLayout(getattr(kwargs["layout"], "value", kwargs["layout"]).lower())
    return getattr(fc, V41_OPS[case][1])(*args, **kwargs)


def v41_written(case: str, args: list[object], result: object) -> list[torch.Tensor]:
    """The call's outputs as bytes: the returned latent (c1 / c2) and every buffer it writes."""
    out = [args[i] for i in V41_OPS[case][2]] + ([result] if isinstance(result, torch.Tensor) else [])
    return [t.contiguous().view(torch.uint8).cpu().clone() for t in out]


def assert_v41_equal(case: str, got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        if not torch.equal(a, b):
            bad = (a != b).nonzero()
            pytest.fail(f"{case}: output {i} differs in {bad.shape[0]} bytes, first at {bad[0].tolist()}")


def _v41_sglang_layout(sgl: SimpleNamespace, layout: str | None, spelling: str) -> object:
    if layout is None:
        return None
    return {"member": sgl.KVLayout(layout), "str": layout, "upper": layout.upper()}[spelling]


@pytest.mark.parametrize("case", [c for c in V41_OPS if not c.startswith("index_k")])
@pytest.mark.parametrize("layout", V41_LAYOUTS)
def test_v41_adapters_equal_direct_calls(sgl, no_handle_left, case: str, layout: str) -> None:
    """SGLang's entry points, patched and called with SGLang's ``KVLayout``, write our op's bytes."""
    want_args, kwargs = v41_case(case, "cpu", layout)
    want = v41_written(case, want_args, direct_v41_call(case, want_args, kwargs))
    fresh = v41_written(case, v41_case(case, "cpu", layout)[0], None)  # the written buffers before the call
    args, kwargs = v41_case(case, "cpu", sgl.KVLayout(layout))
    with fc_sglang.apply():
        got = v41_written(case, args, sglang_v41_call(case, args, kwargs))
    assert_v41_equal(case, got, want)
    for before, after in zip(fresh, want):  # every written buffer changed, and the latent is not all zero
        assert not torch.equal(before, after)
    assert want[-1].view(torch.bfloat16).abs().sum() > 0


@pytest.mark.parametrize("case", list(V41_OPS))
@pytest.mark.parametrize("spelling", ["default", "str", "upper"])
def test_v41_adapters_take_sglang_defaults_and_layout_strings(sgl, no_handle_left, case: str, spelling: str) -> None:
    layout = None if spelling == "default" or case.startswith("index_k") else "v41_fp4"
    want_args, kwargs = v41_case(case, "cpu", layout)
    want = v41_written(case, want_args, direct_v41_call(case, want_args, kwargs))
    args, kwargs = v41_case(case, "cpu", _v41_sglang_layout(sgl, layout, "str" if spelling == "default" else spelling))
    with fc_sglang.apply():
        got = v41_written(case, args, sglang_v41_call(case, args, kwargs))
    assert_v41_equal(case, got, want)


@pytest.mark.parametrize("case", ["c1", "c2_decode", "c2_prefill"])
@pytest.mark.parametrize("layout", ["v5", "fp8", 3, None])
def test_v41_unknown_layouts_raise_before_writing(sgl, no_handle_left, case: str, layout: object) -> None:
    args, kwargs = v41_case(case, "cpu", "v4")
    kwargs["layout"] = layout
    out = torch.full((len(args[0]), 512), 7.0, dtype=torch.bfloat16)
    before = v41_written(case, args, out)
    with fc_sglang.apply():
        with pytest.raises(fc_sglang.UnsupportedFeatureError, match="layout"):
            sglang_v41_call(case, args, {**kwargs, "out": out})
    assert_v41_equal(case, v41_written(case, args, out), before)


@pytest.mark.parametrize("case", list(V41_OPS))
def test_v41_adapters_refuse_rocm_before_writing(sgl, no_handle_left, monkeypatch: pytest.MonkeyPatch,
                                                 case: str) -> None:
    args, kwargs = v41_case(case, "cpu", None)
    before = v41_written(case, args, None)
    with fc_sglang.apply():
        monkeypatch.setattr(torch.version, "hip", "6.2")
        with pytest.raises(fc_sglang.UnsupportedFeatureError, match="ROCm"):
            sglang_v41_call(case, args, kwargs)
    assert_v41_equal(case, v41_written(case, args, None), before)


def test_v41_adapters_have_sglang_signatures(sgl) -> None:
    """Argument names, order, kinds and defaults of every adapter equal SGLang's entry point's."""
    import inspect

    from flashcompress.integrations import _sglang_v41

    for module_name, name in fc_sglang.V41_TARGETS:
        original = getattr(sys.modules[module_name], name)  # a missing target fails here
        assert callable(original), f"{module_name}.{name}"
        ours = _sglang_v41.ADAPTERS.get(name)
        if ours is None:  # the gate: no arguments, as SGLang's
            assert not inspect.signature(original).parameters
            continue
        shape = lambda f: [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]
        assert shape(ours) == shape(original), f"{module_name}.{name}"


def _wheel_ast(sgl: SimpleNamespace, relpath: str):
    import ast

    return ast.parse((sgl.root / relpath).read_text())


def test_v41_call_sites_in_the_wheel_resolve_the_patched_names(sgl) -> None:
    """The engine code that cannot be imported here (the attention backend, the model) reaches the
    patched objects: the fused method imports the entry points from the patched modules at call
    time, the backend binds the gate from ``dsv41_sparse`` (found by identity once imported), and
    the model builds ``DeepseekV41Compressor`` without overriding the gate."""
    import ast

    backend = _wheel_ast(sgl, "srt/layers/attention/deepseek_v4_backend.py")
    method = next(n for n in ast.walk(backend)
                  if isinstance(n, ast.FunctionDef) and n.name == "_low_ratio_compress_fused")
    local = {(n.module, a.name) for n in ast.walk(method) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {(m, n) for m, n in fc_sglang.V41_TARGETS[:4]} <= local
    top = {(n.module, a.name) for n in backend.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert (fc_sglang.GATE_MODULE, "fused_low_ratio_compress_supported") in top
    model = _wheel_ast(sgl, "srt/models/deepseek_v4.py")
    builds = [n for n in ast.walk(model)
              if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "DeepseekV41Compressor"]
    assert builds and all("fused_compress" not in {k.arg for k in b.keywords} for b in builds)


def test_v41_apply_patches_and_revert_restores(sgl, no_handle_left) -> None:
    from flashcompress.integrations import _sglang_v41

    originals = {t: getattr(sys.modules[t[0]], t[1]) for t in fc_sglang.V41_TARGETS}
    before = _bound()
    with fc_sglang.apply() as handle:
        where = {b.where for b in handle.bindings}
        for (module_name, name), original in originals.items():
            now = getattr(sys.modules[module_name], name)
            assert f"{module_name}.{name}" in where and now is not original
            assert now is _sglang_v41.ADAPTERS.get(name, now)
        gate = sgl.dsv41.fused_low_ratio_compress_supported
        assert gate.__wrapped__ is originals[(fc_sglang.GATE_MODULE, "fused_low_ratio_compress_supported")]
        # the call site's own import
        from sglang.kernels.ops.attention.dsv4.low_ratio_compress import c1_decode_norm_rope_store

        assert c1_decode_norm_rope_store is _sglang_v41.c1_decode_norm_rope_store
    assert _bound() == before
    for (module_name, name), original in originals.items():
        assert getattr(sys.modules[module_name], name) is original
    with fc_sglang.apply(low_ratio=False) as handle:  # the V4 compressor only
        assert not {f"{m}.{n}" for m, n in fc_sglang.V41_TARGETS} & {b.where for b in handle.bindings}
        assert sgl.low_ratio.c1_decode_norm_rope_store is originals[fc_sglang.V41_TARGETS[0]]
        assert sgl.layer.compress_forward is fc.compress_forward
    assert _bound() == before


@pytest.mark.parametrize("capability", [(9, 0), (10, 0), (8, 0)], ids=["sm90", "sm100", "sm80"])
def test_v41_gate_builds_fused_compressors_on_hopper(sgl, no_handle_left, monkeypatch: pytest.MonkeyPatch,
                                                     capability: tuple[int, int]) -> None:
    """SGLang's real ``DeepseekV41Compressor`` picks the fused path (and its one-GEMM ratio-2
    projection ``wkv_gate``) on a GPU of ``capability`` exactly when flashcompress serves it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    build = lambda ratio: sgl.dsv41.DeepseekV41Compressor(64, 512, ratio, V41_EPS)
    sglang_says, ours = capability[0] >= 10, capability[0] >= 9
    assert build(2).use_fused_compress is sglang_says
    with fc_sglang.apply():
        for ratio in (1, 2):
            c = build(ratio)
            assert c.use_fused_compress is ours
            assert hasattr(c, "wkv_gate") is (ours and ratio == 2) and hasattr(c, "wkv") is not (ours and ratio == 2)
    assert build(2).use_fused_compress is sglang_says
    with fc_sglang.apply(low_ratio=False):
        assert build(2).use_fused_compress is sglang_says


def test_v41_missing_target_is_a_named_error_and_patches_nothing(sgl, no_handle_left,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    before = _bound()
    monkeypatch.delattr(sgl.low_ratio, "c2_prefill_norm_rope_store")
    with pytest.raises(fc_sglang.IntegrationError, match="c2_prefill_norm_rope_store.*low_ratio=False"):
        fc_sglang.apply()
    assert {k: v for k, v in _bound().items() if k != (fc_sglang.LOW_RATIO_MODULE, "c2_prefill_norm_rope_store")} == \
        {k: v for k, v in before.items() if k != (fc_sglang.LOW_RATIO_MODULE, "c2_prefill_norm_rope_store")}
    with fc_sglang.apply(low_ratio=False):  # the V4 compressor alone still applies
        assert sgl.layer.compress_forward is fc.compress_forward


def wheel_low_ratio_compress_fused(sgl: SimpleNamespace):
    """SGLang's own ``DeepseekV4AttnBackend._low_ratio_compress_fused``, compiled from the wheel's
    source file (its module imports the whole serving runtime, the method only ``torch`` and
    ``KVLayout``): the real call site of the four V4.1 entry points."""
    import ast

    path = sgl.root / "srt/layers/attention/deepseek_v4_backend.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV4AttnBackend")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_low_ratio_compress_fused")
    assert not fn.decorator_list
    namespace = {"torch": torch, "KVLayout": sgl.KVLayout}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["_low_ratio_compress_fused"]


def v41_layer_world(case: str, layout: str, sgl_layout: object, device: str = "cpu"):
    """One source layer that owns index keys, as ``_low_ratio_compress_fused`` sees it: test
    doubles of the backend (pool, metadata) and the layer (projection = the input rows).

    Returns ``(backend, layer, (x, req, pos), method keywords, written buffers, direct)``;
    ``direct`` holds the same inputs for :func:`direct_v41_layer_step`."""
    args, kwargs = v41_case(case, device, layout)
    ratio = 1 if case == "c1" else 2
    g = torch.Generator().manual_seed(9)
    wk = (0.05 * torch.randn(128, 512, generator=g)).to(torch.bfloat16).to(device)
    k_norm = (1 + 0.1 * torch.randn(128, generator=g)).to(torch.bfloat16).to(device)
    index_cache = torch.zeros(8, 68 * 64, dtype=torch.uint8, device=device)  # slots < 512
    if ratio == 1:
        x, w, pos, raw, eps, freqs, cache = args
        req, state, ring, out_loc = torch.zeros_like(pos), None, None, raw
    else:
        x, state, w, pos, req, raw, eps, freqs, cache = args[:9]
        ring = kwargs["ring_size"]
        out_loc = torch.where((pos + 1) % 2 == 0, raw // 2, torch.full_like(raw, -1))
    pool = SimpleNamespace(
        uniform_fp8=False,
        get_extra_key_buffer=lambda layer_id: cache,
        get_extra_key_page_size=lambda layer_id: kwargs["page_size"],
        get_extra_key_layout=lambda layer_id: sgl_layout,
        get_attention_compress_states=lambda layer_id: SimpleNamespace(
            kv_score_buffer=SimpleNamespace(kv_score=state), ring_size=ring),
        low_ratio_index_k_is_split=lambda layer_id: False,
        get_index_k_with_scale_buffer=lambda layer_id: index_cache,
    )
    core = SimpleNamespace(raw_out_loc=raw, c1_out_loc=raw if ratio == 1 else None, c2_out_loc=out_loc)
    backend = SimpleNamespace(token_to_kv_pool=pool, forward_metadata=SimpleNamespace(core_metadata=core))
    layer = SimpleNamespace(
        layer_id=3, compress_ratio=ratio, freqs_cis=torch.view_as_complex(freqs.view(freqs.shape[0], -1, 2)),
        compressor=SimpleNamespace(wkv=lambda t: t, project_fused=lambda t: t,
                                   norm=SimpleNamespace(weight=torch.nn.Parameter(w, requires_grad=False), eps=eps)),
        indexer=SimpleNamespace(owns_k=True, forward_wk=lambda latent: latent @ wk.t(),
                                k_norm=SimpleNamespace(weight=torch.nn.Parameter(k_norm, requires_grad=False),
                                                       eps=1e-6)),
    )
    call = {"draft_len": kwargs["draft_len"]} if "draft_len" in kwargs else {}
    if case == "c2_prefill":
        call["extend_offsets"] = tuple(args[9:11])
    written = [t for t in (cache, state, index_cache) if t is not None]
    direct = SimpleNamespace(case=case, args=args, kwargs=kwargs, wk=wk, k_norm=k_norm, out_loc=out_loc,
                             index_cache=index_cache)
    return backend, layer, (x, req, pos), call, written, direct


def direct_v41_layer_step(d: SimpleNamespace) -> None:
    """The same layer step on flashcompress's ops: c1 / c2, ``wk`` on the latent, index-K at ``c{r}_out_loc``."""
    latent = direct_v41_call(d.case, d.args, d.kwargs)
    ratio = 1 if d.case == "c1" else 2
    pos = d.args[2] if ratio == 1 else d.args[3]
    fc.index_k_norm_rope_pack_store(latent @ d.wk.t(), d.k_norm, 1e-6, d.args[5 if ratio == 1 else 7], pos, d.out_loc,
                                    d.index_cache, ratio=ratio)


@pytest.mark.parametrize("case", ["c1", "c2_decode", "c2_verify", "c2_prefill"])
@pytest.mark.parametrize("layout", ["v4", "v41_fp4", "v41_fp4_new"])
def test_v41_sglang_fused_method_runs_on_flashcompress(sgl, no_handle_left, case: str, layout: str) -> None:
    """SGLang's real ``_low_ratio_compress_fused`` (compiled from the wheel) with ``apply()`` on
    writes the main cache, pair ring and index-K cache bytes of the same step run directly."""
    method = wheel_low_ratio_compress_fused(sgl)
    backend, layer, rows, call, got, _ = v41_layer_world(case, layout, sgl.KVLayout(layout))
    fresh = [t.clone() for t in got]
    with fc_sglang.apply():
        method(backend, layer, *rows, **call)
    _, _, _, _, want, direct = v41_layer_world(case, layout, sgl.KVLayout(layout))
    direct_v41_layer_step(direct)
    assert_v41_equal(case, [t.view(torch.uint8) for t in got], [t.view(torch.uint8) for t in want])
    for before, after in zip(fresh, got):
        assert not torch.equal(before, after)
