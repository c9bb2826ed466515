"""SGLang 0.5.23's DeepSeek-V4 / V4.1 compressor kernels as thin callables, for side-by-side timing.

Nothing of the peer is copied into this repository: at run time this module finds an
installed SGLang wheel (``pip install --no-index --no-deps --target /tmp/sgl sglang-*.whl``
and ``/tmp/sgl`` on ``PYTHONPATH``, or ``FC_PEER_SGLANG=/path/holding/sglang``) and gets
the peer's compiled tvm-ffi modules in one of two ways (``FC_PEER_MODE``):

* ``import``: the peer's own Python module getters (``sglang.kernels.ops.attention.dsv4.
  compress._jit_compress_module`` and friends, which build through SGLang's ``load_jit``).
  This needs the whole ``sglang`` package importable (transformers, msgspec, orjson, ...).
* ``build``: the peer's CUDA sources, ``<wheel>/sglang/kernels/jit/csrc/deepseek_v4/*.cuh``
  with ``<wheel>/sglang/kernels/jit/include``, compiled with ``tvm_ffi.cpp.build_inline``
  through a generated wrapper unit that includes the peer's header and exports the same
  entry points (``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` inside ``namespace sglang``), with the
  template arguments and flags the peer's getters use: ``-std=c++20 -O3
  --expt-relaxed-constexpr -DSGL_CUDA_ARCH=<cc>``, ``-use_fast_math`` for the compress
  kernels, PDL on for sm_90+, no aiter preshuffle (CUDA).  Needs only tvm-ffi and nvcc.
* ``auto`` (default): ``import`` when ``sglang`` imports, else ``build``.

Every op below is called the way the peer's Python wrappers call their module (same
argument order; the one-time conversions of those wrappers — ``ape`` to the input dtype,
``norm_weight`` to the kv dtype, ``view_as_real(freq_cis).flatten(-2)`` — happen once when
the callable is made, not inside the timed call).  Plans: the peer's plan bytes are ours
(``spec/compressor.md``; ``DecodePlan`` / ``CompressPlan`` 16 B, ``WritePlan`` 8 B, online
``WritePlan`` 16 B), so the peer's compress and store kernels run on flashcompress's plan
tensors, on the same state pools, inputs, outputs and caches.

API (every ``*_call`` returns a zero-argument callable that launches one peer kernel on
the current stream; it raises :class:`PeerUnavailable` at construction — never at call
time for a reason known up front — when the wheel is missing, the device is not CUDA, or
the module fails to import / build):

* :class:`Peer` ``(device)``: ``.available``, ``.reason`` (one line), ``.version``, ``.mode``.
* ``compress_call(ratio, head_dim, online, state, inp, ape, out, plan, decode)``:
  ``compress_forward`` — ``FlashCompress{4,128}Kernel`` / ``FlashCompress128OnlineKernel``
  ``decode(state, inp, out, ape, plan_d)`` or ``prefill(state, inp, out, ape, plan_c, plan_w)``.
  ``plan`` is the tuple of plan tensors (``plan[1:3]`` of a flashcompress plan).
* ``store_call(kv, plan_rows, decode, ratio, norm_weight, eps, freq_cis, out_loc, kvcache,
  page_size, use_fp4=False, bf16_store=False)``: ``compress_norm_rope_store`` —
  ``FusedNormRopeKernel::forward`` (``forward_fp4`` for the FP4 indexer).
* ``plan_decode_call(ratio, rpi, r2t, f2s, seq_lens, swa_page, ring)`` /
  ``plan_prefill_call(ratio, rpi, seq_lens, extend_lens, r2t, f2s, swa_page, ring, n_tok)``
  / ``plan_online_decode_call(seq_lens, rpi, r2t)`` / ``plan_online_prefill_call(seq_lens,
  extend_lens, rpi, r2t, n_tok)``: the peer's plan builders (``c_plan.cuh``, online ones in
  ``c128_online_v2.cuh``); host-length prefill calls include the peer's host stage.
* V4.1 (``low_ratio_compress.py``, ``fp4_indexer_rope.py``), for ``bench_v41.py``:
  ``c1_call(kv_input, norm_weight, positions, out_loc, eps, freqs_cis, k_cache, page_size,
  layout="v4", out=None)``; ``c2_decode_call(kv_input, kv_state, norm_weight, positions, req,
  raw_out_loc, eps, freqs_cis, k_cache, page_size, ring_size, draft_len=1, layout="v4",
  out=None)``; ``c2_prefill_call(..., k_cache, extend_start_loc, extend_seq_lens, page_size,
  ring_size, layout="v4", out=None)``; ``index_k_call(input, norm_weight, eps, freqs_cis,
  positions, loc, cache, ratio)``.  ``freqs_cis`` here is the complex64 ``[max_pos, 32]``
  table or its fp32 ``[max_pos, 64]`` real view; tensors as in the peer's docstrings
  (bf16 inputs, int32/int64 positions and locations, uint8 caches).
* ``get_peer(device)``: one shared :class:`Peer` per device (``FC_PEER_ARCH=9.0a`` makes a
  CPU device's peer build for that target: the benchmarks' ``--peer`` path then builds and
  argument-checks every peer op on a CPU box, each call failing only at its launch).
* ``prewarm(specs)``: build many modules in parallel (``python benchmarks/_peer.py
  --prewarm`` builds every module the three op benchmarks use).

``bench_v41.py --peer`` uses the V4.1 calls through ``_common.PeerSide`` on its own buffers:
the c2 state is flashcompress's pair ring, fp32 ``[rows, 2 * head_dim]`` with request ``r``'s
ring rows at ``r * ring_size + pos % ring_size`` (the peer's ``kv_state`` matcher is
``{-1, 2 * kHeadDim}`` fp32, ``req`` int64), so both sides read and park the same rows.
"""

from __future__ import annotations

import argparse
import concurrent.futures as _cf
import importlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

PEER_NAME = "SGLang"
RING_PAGE_SLOT_BYTES = 68  # index-K slot of the V4.1 indexer cache (fp4_indexer.INDEX_K_SLOT_BYTES)

_CPP_DTYPE = {torch.float32: "fp32_t", torch.bfloat16: "bf16_t", torch.float16: "fp16_t"}
_FFI_HEADERS = ("tvm/ffi/container/tensor.h", "tvm/ffi/dtype.h", "tvm/ffi/error.h",
                "tvm/ffi/extra/c_env_api.h", "tvm/ffi/function.h")


class PeerUnavailable(RuntimeError):
    """The peer op cannot run here; ``str(exc)`` is the one-line reason for the table note."""


def _one_line(exc: BaseException, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    # a compiler failure: the first "error" line says more than ninja's banner
    err = next((ln for ln in lines if " error" in ln or ln.startswith("error")), lines[0] if lines else "")
    return f"{type(exc).__name__}: {err[:limit]}"


def find_wheel() -> tuple[Path | None, str]:
    """(directory that holds the ``sglang`` package, version) of the installed peer, or (None, reason)."""
    cands: list[Path] = []
    if os.environ.get("FC_PEER_SGLANG"):
        cands.append(Path(os.environ["FC_PEER_SGLANG"]))
    try:
        spec = importlib.util.find_spec("sglang")  # locates the package without running its __init__
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        cands += [Path(p).parent for p in spec.submodule_search_locations]
    cands.append(Path("/tmp/sgl"))
    for root in cands:
        if (root / "sglang" / "kernels" / "jit" / "csrc" / "deepseek_v4" / "c4_v2.cuh").is_file():
            version = "?"
            for meta in sorted(root.glob("sglang-*.dist-info/METADATA")):
                for line in meta.read_text(errors="replace").splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                        break
            return root, version
    return None, ("no SGLang wheel found (install it with pip --target DIR and put DIR on PYTHONPATH, "
                  "or set FC_PEER_SGLANG=DIR)")


@dataclass(frozen=True)
class ModuleSpec:
    """One peer module: its header, C++ class template arguments and exported entry points."""

    name: str  # our cache name
    header: str  # relative to csrc/
    exports: tuple[tuple[str, str], ...]  # (export name, C++ entity inside namespace sglang)
    fast_math: bool = False
    import_getter: tuple[str, str, tuple] = ("", "", ())  # (peer module, getter, args) for import mode


class Peer:
    """The peer's kernels on ``device``; see the module docstring for the API."""

    def __init__(self, device: torch.device | str, mode: str | None = None, arch: str | None = None):
        """``arch`` (e.g. ``"9.0a"``) builds for that target without a GPU (a compile check on a CPU box)."""
        self.device = torch.device(device)
        self.mode = (mode or os.environ.get("FC_PEER_MODE", "auto")).lower()
        self.root, self.version = find_wheel()
        self.reason = ""
        self._mods: dict[str, Any] = {}
        self._errs: dict[str, str] = {}
        self._lock = threading.Lock()
        self.import_error = ""
        self._pdl, self._arch, self._sgl_arch = False, "", 0
        if arch:  # a target named by the caller: a compile check without a GPU
            self._set_arch(int(arch.split(".")[0]), int(arch.split(".")[1][0]), arch)
        elif self.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(self.device)
            self._set_arch(major, minor, f"{major}.{minor}" + ("a" if major in (9, 10) else ""))
        if self.root is None:
            self.reason, self.version = self.version, ""
        elif not self._arch:
            self.reason = f"the peer's kernels are CUDA-only (device {self.device.type})"
        elif self.mode not in ("auto", "import", "build"):
            self.reason = f"FC_PEER_MODE={self.mode!r}: expected auto, import or build"
        elif self.mode in ("auto", "import"):
            self._try_import()

    def _set_arch(self, major: int, minor: int, arch: str) -> None:
        self._arch = arch  # TVM_FFI_CUDA_ARCH_LIST form: "9.0a" builds sm_90a like the peer's loader
        self._pdl = major >= 9  # the peer's is_arch_support_pdl()
        self._sgl_arch = major * 100 + minor * 10

    # ------------------------------------------------------------------ loading
    @property
    def available(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        if not self.available:
            return f"peer: - ({self.reason})"
        why = f"; not import: {self.import_error}" if self.import_error and self.mode == "build" else ""
        return (f"peer: {PEER_NAME} {self.version} from {self.root} "
                f"({self.mode} mode, sm_{self._arch.replace('.', '')}{why})")

    # what importing ``sglang`` (its package ``__init__``) and its JIT loader need before anything else
    _IMPORT_DEPS = ("msgspec", "orjson", "psutil", "requests", "transformers")

    def _try_import(self) -> None:
        if self.mode == "auto":
            missing = [m for m in self._IMPORT_DEPS if importlib.util.find_spec(m) is None]
            if missing:  # importing would fail half-way after sglang's package init ran; build instead
                self.mode = "build"
                self.import_error = f"sglang's package import needs {', '.join(missing)}"
                return
        root = str(self.root)
        if root not in sys.path:
            sys.path.append(root)
        try:
            importlib.import_module("sglang.kernels.ops.attention.dsv4.compress")
            self.mode = "import"
        except Exception as exc:  # missing engine dependencies on a bare kernel image: build the csrc
            if self.mode == "import":
                self.reason = f"import mode: {_one_line(exc)}"
            else:
                self.mode = "build"
                self.import_error = _one_line(exc)

    def _kernel_path(self) -> Path:
        assert self.root is not None
        return self.root / "sglang" / "kernels" / "jit"

    def _wrapper_source(self, spec: ModuleSpec) -> str:
        lines = [f"#include <{h}>" for h in _FFI_HEADERS]
        lines.append(f'#include "{self._kernel_path() / "csrc" / spec.header}"')
        lines.append("namespace sglang {")
        lines += [f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({exp}, ({ent}));" for exp, ent in spec.exports]
        lines.append("}  // namespace sglang")
        return "\n".join(lines) + "\n"

    def _build_kwargs(self, spec: ModuleSpec) -> dict:
        cuda_flags = [f"-DSGL_CUDA_ARCH={self._sgl_arch}", "-std=c++20", "-O3", "--expt-relaxed-constexpr"]
        if spec.fast_math:
            cuda_flags.append("-use_fast_math")
        kw = dict(cuda_sources=self._wrapper_source(spec), extra_cflags=["-std=c++20", "-O3"],
                  extra_cuda_cflags=cuda_flags, extra_include_paths=[str(self._kernel_path() / "include")])
        base = os.environ.get("FC_PEER_CACHE_DIR")
        if base:
            import hashlib

            key = hashlib.sha256(repr(sorted(kw.items())).encode() + self._arch.encode()).hexdigest()[:16]
            d = Path(base) / f"{spec.name}_{key}"
            d.mkdir(parents=True, exist_ok=True)
            kw["build_directory"] = str(d)
        return kw

    def _build(self, spec: ModuleSpec) -> str:
        """Compile one module (thread-safe; returns the .so path)."""
        import tvm_ffi.cpp

        os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", self._arch)  # the peer builds sm_90a on Hopper
        return tvm_ffi.cpp.build_inline(spec.name, **self._build_kwargs(spec))

    def module(self, spec: ModuleSpec) -> Any:
        """The loaded peer module for ``spec`` (built or imported on first use), else :class:`PeerUnavailable`."""
        if not self.available:
            raise PeerUnavailable(self.reason)
        with self._lock:
            if spec.name in self._mods:
                return self._mods[spec.name]
            if spec.name in self._errs:
                raise PeerUnavailable(self._errs[spec.name])
            try:
                if self.mode == "import":
                    modname, getter, args = spec.import_getter
                    mod = getattr(importlib.import_module(modname), getter)(*args)
                else:
                    import tvm_ffi

                    mod = tvm_ffi.load_module(self._build(spec))
            except Exception as exc:
                self._errs[spec.name] = f"{spec.name}: {_one_line(exc)}"
                raise PeerUnavailable(self._errs[spec.name]) from None
            self._mods[spec.name] = mod
            return mod

    def prewarm(self, specs: Sequence[ModuleSpec], jobs: int | None = None) -> list[str]:
        """Build ``specs`` in parallel (build mode), then load them; returns the failures' reasons."""
        if not self.available:
            return [self.reason]
        todo = [s for s in dict.fromkeys(specs) if s.name not in self._mods]
        if self.mode == "build" and todo:
            jobs = jobs or max(1, min(len(todo), (os.cpu_count() or 2) // 2))
            with _cf.ThreadPoolExecutor(jobs) as ex:
                futs = {s.name: ex.submit(self._build, s) for s in todo}
                for name, f in futs.items():
                    exc = f.exception()
                    if exc is not None:
                        self._errs[name] = f"{name}: {_one_line(exc)}"
        errs = []
        for s in todo:
            try:
                self.module(s)
            except PeerUnavailable as exc:
                errs.append(str(exc))
        return errs

    # ------------------------------------------------------------------ module specs
    _DSV4 = "sglang.kernels.ops.attention.dsv4"

    def _args(self, *vals: Any) -> str:
        out = []
        for v in vals:
            if isinstance(v, bool):
                out.append("true" if v else "false")
            elif isinstance(v, torch.dtype):
                out.append(_CPP_DTYPE[v])
            else:
                out.append(str(v))
        return ", ".join(out)

    def compress_spec(self, ratio: int, head_dim: int, online: bool, buf: torch.dtype = torch.float32,
                      inp: torch.dtype = torch.float32, out: torch.dtype = torch.float32) -> ModuleSpec:
        if online:
            if head_dim != 512 or ratio != 128:
                raise PeerUnavailable("the peer's online compressor is C128 head 512 only")
            a = self._args(head_dim, buf, self._pdl)
            cls = f"FlashCompress128OnlineKernel<{a}>"
            return ModuleSpec(f"peer_c128_online_{head_dim}_{_CPP_DTYPE[buf]}", "deepseek_v4/c128_online_v2.cuh",
                              (("decode", f"{cls}::run_decode"), ("prefill", f"{cls}::run_prefill"),
                               ("plan_decode", "plan_compress_128_online_decode"),
                               ("plan_prefill", "plan_compress_128_online_prefill")),
                              fast_math=True,
                              import_getter=(f"{self._DSV4}.compress", "_jit_compress_128_online_module",
                                             (head_dim, buf)))
        a = self._args(head_dim, buf, inp, out, self._pdl)
        cls = f"FlashCompress{ratio}Kernel<{a}>"
        tag = "_".join(_CPP_DTYPE[d] for d in (buf, inp, out))
        return ModuleSpec(f"peer_c{ratio}_{head_dim}_{tag}", f"deepseek_v4/c{ratio}_v2.cuh",
                          (("decode", f"{cls}::run_decode"), ("prefill", f"{cls}::run_prefill")), fast_math=True,
                          import_getter=(f"{self._DSV4}.compress", "_jit_compress_module",
                                         (head_dim, buf, inp, out, ratio)))

    def store_spec(self, dtype: torch.dtype, head_dim: int, page_size: int, bf16_store: bool = False,
                   rope_dim: int = 64) -> ModuleSpec:
        a = self._args(dtype, head_dim, rope_dim, page_size, 0, bf16_store, "V4", self._pdl)
        cls = f"FusedNormRopeKernel<{a}>"
        exports = [("forward", f"{cls}::forward")]
        if head_dim == 128:
            exports.append(("forward_fp4", f"{cls}::forward_fp4"))
        layout = self._layout("v4") if self.mode == "import" else None
        return ModuleSpec(f"peer_norm_rope_{_CPP_DTYPE[dtype]}_{head_dim}_p{page_size}_{int(bf16_store)}",
                          "deepseek_v4/fused_norm_rope_v2.cuh", tuple(exports),
                          import_getter=(f"{self._DSV4}.compress", "_jit_compress_norm_rope_module",
                                         (dtype, head_dim, rope_dim, page_size, bf16_store, layout)))

    def plan_spec(self) -> ModuleSpec:
        return ModuleSpec("peer_compress_plan", "deepseek_v4/c_plan.cuh",
                          (("plan_prefill", "plan_compress_prefill"), ("plan_decode", "plan_compress_decode")),
                          import_getter=(f"{self._DSV4}.compress", "_jit_compress_plan_module", ()))

    def _layout(self, layout: str) -> Any:
        """The peer's ``KVLayout`` enum member (import mode) or its C++ enumerator name (build mode)."""
        if self.mode == "import":
            kl = importlib.import_module(f"{self._DSV4}.kv_layout").KVLayout
            return kl.parse(layout)
        return str(getattr(layout, "value", layout)).upper()

    def c1_spec(self, head_dim: int, page_size: int, layout: str = "v4", rope_dim: int = 64) -> ModuleSpec:
        cpp = str(getattr(layout, "value", layout)).upper()
        a = self._args(head_dim, rope_dim, page_size, cpp, self._pdl)
        return ModuleSpec(f"peer_c1_{head_dim}_p{page_size}_{cpp}", "deepseek_v4/c1.cuh",
                          (("decode_fusion", f"FlashCompress1Kernel<{a}>::run_decode_fusion"),),
                          import_getter=(f"{self._DSV4}.low_ratio_compress", "_jit_c1_module",
                                         (head_dim, rope_dim, page_size, self._layout(layout)
                                          if self.mode == "import" else None)))

    def c2_spec(self, head_dim: int, page_size: int, layout: str = "v4", rope_dim: int = 64) -> ModuleSpec:
        cpp = str(getattr(layout, "value", layout)).upper()
        a = self._args(head_dim, rope_dim, page_size, cpp, self._pdl)
        cls = f"FlashCompress2Kernel<{a}>"
        return ModuleSpec(f"peer_c2_{head_dim}_p{page_size}_{cpp}", "deepseek_v4/c2.cuh",
                          (("decode_fusion", f"{cls}::run_decode_fusion"),
                           ("prefill_fusion", f"{cls}::run_prefill_fusion")),
                          import_getter=(f"{self._DSV4}.low_ratio_compress", "_jit_c2_module",
                                         (head_dim, rope_dim, page_size, self._layout(layout)
                                          if self.mode == "import" else None)))

    def index_k_spec(self, head_dim: int, page_size: int, ratio: int, rope_dim: int = 64) -> ModuleSpec:
        a = self._args(head_dim, rope_dim, page_size, ratio, self._pdl)
        return ModuleSpec(f"peer_index_k_{head_dim}_p{page_size}_r{ratio}", "deepseek_v4/fp4_indexer_rope.cuh",
                          (("index_k", f"IndexKKernel<{a}>::run_index_k"),),
                          import_getter=(f"{self._DSV4}.fp4_indexer_rope", "_jit_index_k_module",
                                         (head_dim, rope_dim, page_size, ratio)))

    # ------------------------------------------------------------------ V4 ops
    def compress_call(self, ratio: int, head_dim: int, online: bool, state: torch.Tensor, inp: torch.Tensor,
                      ape: torch.Tensor, out: torch.Tensor, plan: Sequence[torch.Tensor],
                      decode: bool) -> Callable[[], None]:
        """The peer's ``compress_forward`` launch on these buffers (``plan``: ``(plan_d,)`` / ``(plan_c, plan_w)``)."""
        mod = self.module(self.compress_spec(ratio, head_dim, online, state.dtype, inp.dtype, out.dtype))
        if ape.dtype != inp.dtype:
            ape = ape.to(inp.dtype)
        fn = mod.decode if decode else mod.prefill
        p = tuple(plan[:1] if decode else plan[:2])
        return lambda: fn(state, inp, out, ape, *p)

    def store_call(self, kv: torch.Tensor, plan_rows: torch.Tensor, decode: bool, ratio: int,
                   norm_weight: torch.Tensor, eps: float, freq_cis: torch.Tensor, out_loc: torch.Tensor,
                   kvcache: torch.Tensor, page_size: int, use_fp4: bool = False,
                   bf16_store: bool = False) -> Callable[[], None]:
        """The peer's ``compress_norm_rope_store`` launch (V4 layout; FP4 = the indexer's ``forward_fp4``)."""
        freq = _freq_real(freq_cis)
        mod = self.module(self.store_spec(kv.dtype, kv.shape[-1], page_size, bf16_store, freq.shape[-1]))
        if norm_weight.dtype != kv.dtype:
            norm_weight = norm_weight.to(kv.dtype)
        fn = mod.forward_fp4 if use_fp4 else mod.forward
        e, r, d = float(eps), int(ratio), bool(decode)
        return lambda: fn(kv, plan_rows, norm_weight, e, freq, out_loc, kvcache, d, r)

    def plan_decode_call(self, ratio: int, rpi: torch.Tensor, r2t: torch.Tensor, f2s: torch.Tensor,
                         seq_lens: torch.Tensor, swa_page: int, ring: int) -> Callable[[], Any]:
        """``CompressorDecodePlan.generate``'s launch (returns the plan tensor)."""
        fn = self.module(self.plan_spec()).plan_decode
        args = (rpi, r2t, f2s, seq_lens, int(ratio), int(swa_page), int(ring), False)
        return lambda: fn(*args)

    def plan_prefill_call(self, ratio: int, rpi: torch.Tensor, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
                          r2t: torch.Tensor, f2s: torch.Tensor, swa_page: int, ring: int, n_tok: int,
                          use_cuda_graph: bool = False) -> Callable[[], Any]:
        """``CompressorPrefillPlan.generate``: a pinned host buffer per call for host lengths, as the peer does."""
        fn = self.module(self.plan_spec()).plan_prefill
        host = seq_lens.device.type == "cpu"
        tail = (int(n_tok), int(ratio), int(swa_page), int(ring), False, bool(use_cuda_graph))

        def call() -> Any:
            pin = torch.empty(n_tok * 24 if host else 0, dtype=torch.uint8, pin_memory=host)
            return fn(rpi, r2t, f2s, seq_lens, extend_lens, pin, *tail)
        return call

    def plan_online_decode_call(self, seq_lens: torch.Tensor, rpi: torch.Tensor,
                                r2t: torch.Tensor) -> Callable[[], torch.Tensor]:
        fn = self.module(self.compress_spec(128, 512, True)).plan_decode
        plan = torch.empty((seq_lens.shape[0], 16), dtype=torch.uint8, device=rpi.device)

        def call() -> torch.Tensor:
            fn(seq_lens, rpi, r2t, plan, 0)
            return plan
        return call

    def plan_online_prefill_call(self, seq_lens: torch.Tensor, extend_lens: torch.Tensor, rpi: torch.Tensor,
                                 r2t: torch.Tensor, n_tok: int, use_cuda_graph: bool = False) -> Callable[[], Any]:
        """``CompressorPrefillPlan.generate_online`` (host stage on the CPU lengths, pinned buffers, H2D)."""
        fn = self.module(self.compress_spec(128, 512, True)).plan_prefill
        dev = rpi.device
        rid, r2t32 = rpi.to(torch.int64), r2t.to(torch.int32)

        def call() -> Any:
            pin = torch.empty((2, n_tok, 16), dtype=torch.uint8, pin_memory=True)
            pc = torch.empty((n_tok, 16), dtype=torch.uint8, device=dev)
            pw = torch.empty((n_tok, 16), dtype=torch.uint8, device=dev)
            nc, nw = fn(seq_lens.to(torch.int64).cpu(), extend_lens.to(torch.int64).cpu(), rid, r2t32,
                        pin[0], pin[1], pc, pw, 0, bool(use_cuda_graph))
            return pc[: int(nc)], pw[: int(nw)]
        return call

    # ------------------------------------------------------------------ V4.1 ops
    def c1_call(self, kv_input: torch.Tensor, norm_weight: torch.Tensor, positions: torch.Tensor,
                out_loc: torch.Tensor, eps: float, freqs_cis: torch.Tensor, k_cache: torch.Tensor, page_size: int,
                layout: str = "v4", out: torch.Tensor | None = None) -> Callable[[], None]:
        """``c1_decode_norm_rope_store`` (ratio 1; decode and extend)."""
        freq = _freq_real(freqs_cis)
        mod = self.module(self.c1_spec(kv_input.shape[-1], page_size, layout, freq.shape[-1]))
        out = out if out is not None else kv_input.new_empty(kv_input.shape)
        e = float(eps)
        return lambda: mod.decode_fusion(kv_input, out, norm_weight, freq, positions, out_loc, k_cache, e)

    def c2_decode_call(self, kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor,
                       positions: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float,
                       freqs_cis: torch.Tensor, k_cache: torch.Tensor, page_size: int, ring_size: int,
                       draft_len: int = 1, layout: str = "v4",
                       out: torch.Tensor | None = None) -> Callable[[], None]:
        """``c2_decode_norm_rope_store`` (ratio 2 decode / verify)."""
        freq = _freq_real(freqs_cis)
        h = kv_input.shape[-1] // 2
        mod = self.module(self.c2_spec(h, page_size, layout, freq.shape[-1]))
        out = out if out is not None else kv_input.new_empty((kv_input.shape[0], h), dtype=torch.bfloat16)
        e, rs, dl = float(eps), int(ring_size), int(draft_len)
        return lambda: mod.decode_fusion(kv_input, kv_state, out, norm_weight, positions, req, raw_out_loc, e, freq,
                                         k_cache, rs, dl)

    def c2_prefill_call(self, kv_input: torch.Tensor, kv_state: torch.Tensor, norm_weight: torch.Tensor,
                        positions: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float,
                        freqs_cis: torch.Tensor, k_cache: torch.Tensor, extend_start_loc: torch.Tensor,
                        extend_seq_lens: torch.Tensor, page_size: int, ring_size: int, layout: str = "v4",
                        out: torch.Tensor | None = None) -> Callable[[], None]:
        """``c2_prefill_norm_rope_store`` (ratio 2 extend, then the ring write-back)."""
        freq = _freq_real(freqs_cis)
        h = kv_input.shape[-1] // 2
        mod = self.module(self.c2_spec(h, page_size, layout, freq.shape[-1]))
        out = out if out is not None else kv_input.new_empty((kv_input.shape[0], h), dtype=torch.bfloat16)
        e, rs = float(eps), int(ring_size)
        return lambda: mod.prefill_fusion(kv_input, kv_state, out, norm_weight, positions, req, raw_out_loc, e, freq,
                                          k_cache, rs, extend_start_loc, extend_seq_lens)

    def index_k_call(self, input: torch.Tensor, norm_weight: torch.Tensor, eps: float, freqs_cis: torch.Tensor,
                     positions: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor,
                     ratio: int) -> Callable[[], None]:
        """``index_k_norm_rope_pack_store`` (68-byte fp4 index-K slots)."""
        freq = _freq_real(freqs_cis)
        page = cache.shape[1] // RING_PAGE_SLOT_BYTES
        mod = self.module(self.index_k_spec(input.shape[-1], page, ratio, freq.shape[-1]))
        e = float(eps)
        return lambda: mod.index_k(input, norm_weight, freq, positions, loc, cache, e)


def _freq_real(freq_cis: torch.Tensor) -> torch.Tensor:
    """The peer's RoPE table form: fp32 ``[max_pos, 2 * pairs]`` (real/imag interleaved; a view, no copy)."""
    if freq_cis.is_complex():
        return torch.view_as_real(freq_cis).flatten(-2)
    return freq_cis


# ---------------------------------------------------------------------------- benchmark helpers

_PEERS: dict[str, Peer] = {}


def get_peer(device: torch.device) -> Peer:
    """One :class:`Peer` per device per process."""
    key = str(device)
    if key not in _PEERS:  # FC_PEER_ARCH=9.0a: build for that target without a GPU (a CPU box's check)
        _PEERS[key] = Peer(device, arch=os.environ.get("FC_PEER_ARCH") or None)
    return _PEERS[key]


def bench_specs(peer: Peer, bf16: bool = False) -> list[ModuleSpec]:
    """Every peer module ``bench_compress.py`` / ``bench_store.py`` / ``bench_pipeline.py --peer`` build;
    ``bf16``: also those of ``--in-dtype bf16`` (bf16 input and rows, fp32 state; no online layer)."""
    f32, b16 = torch.float32, torch.bfloat16
    specs = [peer.compress_spec(4, 512, False), peer.compress_spec(4, 128, False),
             peer.compress_spec(128, 512, False), peer.compress_spec(128, 512, True),
             peer.store_spec(f32, 512, 64), peer.store_spec(f32, 128, 64), peer.store_spec(f32, 512, 2),
             peer.plan_spec()]
    if bf16:
        specs += [peer.compress_spec(r, h, False, f32, b16, b16) for r, h in ((4, 512), (4, 128), (128, 512))]
        specs += [peer.store_spec(b16, 512, 64), peer.store_spec(b16, 128, 64), peer.store_spec(b16, 512, 2)]
    return specs


def v41_specs(peer: Peer, layout: str = "v4", index_ratio: int = 1) -> list[ModuleSpec]:
    """The V4.1 fused modules ``bench_v41.py --peer`` builds: V4.1-Flash's pool page sizes (c1 256,
    c2 128, index-K 64) in ``layout``, index-K at ``index_ratio`` (the benchmark's cases use 1)."""
    return [peer.c1_spec(512, 256, layout), peer.c2_spec(512, 128, layout), peer.index_k_spec(128, 64, index_ratio)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Find / build the peer's kernels (SGLang) for the --peer benchmarks.")
    p.add_argument("--prewarm", action="store_true", help="build every module the op benchmarks use, in parallel")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--arch", default=None, help="build for this target without a GPU, e.g. 9.0a (compile check)")
    p.add_argument("--v41", action="store_true", help="also the V4.1 c1 / c2 / index-K modules")
    p.add_argument("--bf16", action="store_true", help="also the modules of the benchmarks' --in-dtype bf16")
    p.add_argument("--only", default="", help="comma list of module-name substrings to prewarm")
    args = p.parse_args(argv)
    peer = Peer(args.device, arch=args.arch)
    print(peer.describe())
    if args.prewarm and peer.available:
        import time

        t0 = time.perf_counter()
        specs = [s for s in bench_specs(peer, args.bf16) + (v41_specs(peer) if args.v41 else [])
                 if not args.only or any(o in s.name for o in args.only.split(","))]
        errs = peer.prewarm(specs, args.jobs)
        print(f"prewarm: {len(specs) - len(errs)} of {len(specs)} modules ready in {time.perf_counter() - t0:.1f} s")
        for e in errs:
            print(f"  failed: {e}")
        return 1 if errs else 0
    return 0 if peer.available else 1


if __name__ == "__main__":
    sys.exit(main())
