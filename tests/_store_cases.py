"""Store-kernel test cases and a code-aware byte comparison (test_store_kernel_host.py, test_gpu_store.py).

``make_case`` builds one ``compress_norm_rope_store`` call (decode or prefill plan with
skipped / invalid rows, distinct destination slots, a poisoned cache, rows of very
different magnitudes); ``reference_cache`` runs the PyTorch backend on it;
``compare_store`` checks another implementation's cache against that reference the way
issue 12 asks: bytes outside the written entries unchanged, scale bytes and RoPE bf16
identical, indexer fp32 scales within 1e-6 relative, fp8 / fp4 / bf16 codes identical
except for at most 0.1% that are exactly one code step away (rounding ties in fp32 noise).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

from flashcompress import layouts as L
from flashcompress.torch_backend import ops as torch_ops
from flashcompress.torch_backend.rows import store_targets
from flashcompress.validation import StoreCall, StoreTail

POISON = 0xA5
FORMATS = dict(L.CACHE_FORMATS)  # the V4 formats, then the V4.1 layouts (layout=)


@dataclass
class StoreCase:
    fmt: L.CacheFormat
    is_decode: bool
    ratio: int
    page_size: int
    kv: torch.Tensor
    plan: torch.Tensor
    out_loc: torch.Tensor
    norm_weight: torch.Tensor
    norm_eps: float
    freq_cis: torch.Tensor
    cache: torch.Tensor  # poisoned, before the store
    extra: dict = field(default_factory=dict)

    def kwargs(self, device: torch.device | str = "cpu", cache: torch.Tensor | None = None) -> dict:
        """The store's arguments by name (tensors moved to ``device``): ``store_call(kv, plan, **kwargs)``
        makes the call object the backends' ``compress_norm_rope_store`` takes."""
        return dict(
            is_decode=self.is_decode, ratio=self.ratio, norm_weight=self.norm_weight.to(device),
            norm_eps=self.norm_eps, freq_cis=self.freq_cis.to(device), out_loc=self.out_loc.to(device),
            kvcache=self.cache.clone().to(device) if cache is None else cache, page_size=self.page_size,
            fmt=self.fmt,
        )

    def targets(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return store_targets(self.plan, self.is_decode, self.ratio, self.out_loc)


def _freq_table(rows: int, gen: torch.Generator) -> torch.Tensor:
    theta = 40000.0 ** (-torch.arange(32, dtype=torch.float64) / 32)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * theta[None, :]
    angles = angles + 0.01 * torch.rand((rows, 32), generator=gen, dtype=torch.float64)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)


def _rows(n: int, head_dim: int, gen: torch.Generator) -> torch.Tensor:
    """Rows of very different magnitudes: normal, tiny, huge, zero, one outlier, a tiny tile."""
    x = torch.randn((n, head_dim), generator=gen)
    scale = torch.tensor([1.0, 1e-6, 3e3, 0.0, 1.0, 1.0, 1e-30, 50.0])
    x = x * scale[torch.arange(n) % len(scale)][:, None]
    for r in range(n):
        kind = r % len(scale)
        if kind == 4:
            x[r, int(torch.randint(0, head_dim, (1,), generator=gen))] = 900.0
        if kind == 5:
            x[r, :64] *= 1e-7
    return x


def make_case(fmt_name: str, dtype: torch.dtype, is_decode: bool, *, rows: int = 24, ratio: int = 4,
              page_size: int = 4, seed: int = 0) -> StoreCase:
    fmt = FORMATS[fmt_name]
    gen = torch.Generator().manual_seed(seed)
    kv = _rows(rows, fmt.head_dim, gen).to(dtype)
    max_seq = ratio * 40
    if is_decode:
        seq = torch.randint(1, max_seq, (rows,), generator=gen)
        stored = torch.rand(rows, generator=gen) < 0.6
        seq = torch.where(stored, (seq // ratio).clamp(min=1) * ratio, seq)
        seq = torch.where(~stored & (seq % ratio == 0), seq + 1, seq)
        plan = torch.zeros((rows, 16), dtype=torch.uint8)
        plan[:, 0:4] = seq.to(torch.int32).view(torch.uint8).reshape(rows, 4)
        plan[:, 4:16] = torch.randint(0, 256, (rows, 12), generator=gen, dtype=torch.uint8)  # ignored fields
        n_loc = rows
        dest_rows = torch.arange(rows)
    else:
        num_q = rows + 9
        plan = torch.tensor(list(L.INVALID_COMPRESS_ROW) * rows, dtype=torch.uint8).reshape(rows, 16)
        valid = torch.rand(rows, generator=gen) < 0.7
        ragged = torch.randperm(num_q, generator=gen)[:rows]
        seq = (torch.randint(1, max_seq // ratio, (rows,), generator=gen)) * ratio
        for r in range(rows):
            if valid[r]:
                plan[r, 0:4] = torch.tensor([int(seq[r])], dtype=torch.int32).view(torch.uint8)
                plan[r, 4:6] = torch.tensor([int(ragged[r])], dtype=torch.int16).view(torch.uint8)
                plan[r, 6:8] = torch.tensor([3], dtype=torch.int16).view(torch.uint8)
                plan[r, 8:16] = torch.randint(0, 256, (8,), generator=gen, dtype=torch.uint8)
        n_loc = num_q
        dest_rows = ragged
    pages = n_loc // page_size + 3
    capacity = pages * page_size
    out_loc = torch.randperm(capacity, generator=gen)[:n_loc].to(torch.int64)
    row_bytes = fmt.cache_row_bytes(page_size)
    cache = torch.full((pages, row_bytes), POISON, dtype=torch.uint8)
    weight = (1.0 + 0.3 * torch.randn(fmt.head_dim, generator=gen)).to(torch.float32)
    return StoreCase(fmt, is_decode, ratio, page_size, kv, plan, out_loc, weight, 1e-6, _freq_table(max_seq, gen),
                     cache, extra={"dest_rows": dest_rows})


def store_call(kv: torch.Tensor, plan: torch.Tensor, *, is_decode: bool, ratio: int, norm_weight: torch.Tensor,
               norm_eps: float, freq_cis: torch.Tensor, out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
               fmt: L.CacheFormat) -> StoreCall:
    """The backends' call object for a store (tests hand it to a backend directly, past the validation)."""
    return StoreCall(kv, plan, is_decode, ratio, StoreTail(norm_weight, norm_eps, freq_cis, out_loc, kvcache, page_size,
                                                           fmt), kv.get_device())


def reference_cache(case: StoreCase) -> torch.Tensor:
    """The PyTorch backend's cache after the store (CPU)."""
    cache = case.cache.clone()
    torch_ops.compress_norm_rope_store(store_call(case.kv, case.plan, **case.kwargs("cpu", cache)))
    return cache


# ------------------------------------------------------------------ comparison


def _signed(code: torch.Tensor, sign_bit: int) -> torch.Tensor:
    """Sign-magnitude codes -> signed integers on the code grid (0x80 / 0x8 = -0 -> 0)."""
    c = code.to(torch.int64)
    mag = c & (sign_bit - 1)
    return torch.where((c & sign_bit) != 0, -mag, mag)


@dataclass
class Comparison:
    codes: int = 0
    code_mismatches: int = 0
    problems: list = field(default_factory=list)

    def fail(self, msg: str) -> None:
        if len(self.problems) < 8:
            self.problems.append(msg)

    @property
    def ok(self) -> bool:
        return not self.problems and self.code_mismatches <= max(0, int(self.codes * 0.001))

    def report(self) -> str:
        return (f"{self.code_mismatches} of {self.codes} codes differ by one step; "
                f"problems: {self.problems or 'none'}")


def compare_store(got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, case: StoreCase,
                  exact: bool = False) -> Comparison:
    """Compare caches ``got`` vs ``want`` (both after the store of ``case``; ``before`` the cache before it)."""
    fmt, P = case.fmt, case.page_size
    got, want, before = got.cpu().reshape(-1), want.cpu().reshape(-1), before.cpu().reshape(-1)
    res = Comparison()
    valid, dest, _ = case.targets()
    stored = valid.nonzero().flatten().tolist()
    written = torch.zeros_like(got, dtype=torch.bool)
    page_bytes = got.numel() // case.cache.shape[0]
    addr = fmt.addressing(P)
    assert addr.page_bytes == page_bytes
    shift = P.bit_length() - 1
    scale_written = 7 if fmt.name == "v4" else fmt.scale_bytes
    for r in stored:
        loc = int(dest[r])
        base = (loc >> shift) * page_bytes
        d0 = base + (loc & (P - 1)) * addr.data_stride
        s0 = base + addr.scale_base + (loc & (P - 1)) * addr.scale_stride
        written[d0:d0 + fmt.data_bytes] = True
        written[s0:s0 + scale_written] = True
        gd, wd = got[d0:d0 + fmt.data_bytes], want[d0:d0 + fmt.data_bytes]
        gs, ws = got[s0:s0 + scale_written], want[s0:s0 + scale_written]
        if fmt.name == "idx_fp8":
            g_scale = struct.unpack("<f", bytes(gs.tolist()))[0]
            w_scale = struct.unpack("<f", bytes(ws.tolist()))[0]
            if (g_scale != w_scale) if exact else abs(g_scale - w_scale) > 1e-6 * abs(w_scale):
                res.fail(f"row {r} (loc {loc}): fp32 scale {g_scale!r} vs {w_scale!r}")
        elif not torch.equal(gs, ws):
            res.fail(f"row {r} (loc {loc}): scale bytes {gs.tolist()} vs {ws.tolist()}")
        if fmt.name == "v4":
            codes_g, codes_w, sign = gd[:448], wd[:448], 0x80
            if not torch.equal(gd[448:], wd[448:]):
                res.fail(f"row {r} (loc {loc}): rope bf16 bytes differ")
        elif fmt.name in ("idx_fp8", "v41", "v41_new", "uniform_fp8"):
            codes_g, codes_w, sign = gd, wd, 0x80
        elif fmt.name in ("idx_fp4", "v41_fp4", "v41_fp4_new"):
            codes_g = torch.stack((gd & 0xF, gd >> 4), -1).flatten()
            codes_w = torch.stack((wd & 0xF, wd >> 4), -1).flatten()
            sign = 0x8
        else:  # bf16 rows: compare the 16-bit patterns as codes
            codes_g = gd.view(torch.int16).to(torch.int64) & 0xFFFF
            codes_w = wd.view(torch.int16).to(torch.int64) & 0xFFFF
            sign = 0x8000
        res.codes += codes_g.numel()
        diff = codes_g.to(torch.int64) != codes_w.to(torch.int64)
        if diff.any():
            steps = (_signed(codes_g, sign) - _signed(codes_w, sign)).abs()
            res.code_mismatches += int(diff.sum())
            if exact or bool((steps[diff] > 1).any()):
                i = int(diff.nonzero()[0])
                res.fail(f"row {r} (loc {loc}): code {i} is 0x{int(codes_g[i]):x}, expected 0x{int(codes_w[i]):x}")
    outside = ~written
    if not torch.equal(got[outside], before[outside]):
        i = int(((got != before) & outside).nonzero()[0])
        res.fail(f"byte {i} outside every written entry changed: 0x{int(before[i]):02x} -> 0x{int(got[i]):02x}")
    if not torch.equal(want[outside], before[outside]):
        res.fail("the reference wrote outside the entries (test bug)")
    return res
