"""Byte layouts: Python definitions, the bytes the backend packs, and the C++ mirror agree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from flashcompress import layouts as L
from flashcompress.torch_backend.rows import compress_fields, pack_compress_rows, pack_words, write_fields

try:  # the installed package ships jit_kernel/ inside it
    import flashcompress.jit_kernel as _jk

    JIT_KERNEL_DIR = Path(next(iter(_jk.__path__)))
except ImportError:  # pragma: no cover - source checkout without install
    JIT_KERNEL_DIR = Path(__file__).resolve().parents[1] / "jit_kernel"


def test_row_layouts_are_contiguous_and_aligned() -> None:
    for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
        end = 0
        for f in layout.fields:
            assert f.offset == end, f"{layout.name}.{f.name} leaves a gap"
            assert f.offset % f.size == 0, f"{layout.name}.{f.name} is misaligned"
            end += f.size
        assert end == layout.row_bytes
    assert (L.DECODE_PLAN.row_bytes, L.COMPRESS_PLAN.row_bytes, L.WRITE_PLAN.row_bytes) == (16, 16, 8)


def test_packed_rows_put_fields_at_their_offsets() -> None:
    row = pack_compress_rows(*(torch.tensor([v]) for v in (0x01020304, 0x0506, 0x0708, -2, 0x0A0B0C0D)))
    b = bytes(row[0].tolist())
    f = L.COMPRESS_PLAN.field
    assert b[f("seq_len").offset : f("seq_len").offset + 4] == bytes.fromhex("04030201")
    assert b[f("ragged_id").offset : f("ragged_id").offset + 2] == bytes.fromhex("0605")
    assert b[f("buffer_len").offset : f("buffer_len").offset + 2] == bytes.fromhex("0807")
    assert b[f("read_page_0").offset : f("read_page_0").offset + 4] == bytes.fromhex("feffffff")
    assert b[f("read_page_1").offset : f("read_page_1").offset + 4] == bytes.fromhex("0d0c0b0a")
    fields = compress_fields(row)
    assert [int(fields[n][0]) for n in ("seq_len", "ragged_id", "buffer_len", "read_page_0", "read_page_1")] == [
        0x01020304, 0x0506, 0x0708, -2, 0x0A0B0C0D,
    ]


def test_sentinels() -> None:
    sentinel_c = torch.tensor(list(L.INVALID_COMPRESS_ROW), dtype=torch.uint8)[None]
    c = compress_fields(sentinel_c)
    assert not bool(c["valid"][0]) and int(c["ragged_id"][0]) == 0 and int(c["buffer_len"][0]) == 0
    assert int(c["read_page_0"][0]) == -1 and int(c["read_page_1"][0]) == -1
    sentinel_w = torch.tensor(list(L.INVALID_WRITE_ROW), dtype=torch.uint8)[None]
    w = write_fields(sentinel_w)
    assert not bool(w["valid"][0]) and int(w["write_loc"][0]) == -1
    assert bytes(pack_words(torch.tensor([0xFFFFFFFF]), torch.tensor([-1]))[0].tolist()) == L.INVALID_WRITE_ROW


@pytest.mark.parametrize(
    "fmt,page_size,expected",
    [
        (L.MAIN_V4, 1, 1152), (L.MAIN_V4, 2, 1728), (L.MAIN_V4, 64, 37440), (L.MAIN_V4, 256, 149760),
        (L.INDEXER_FP8, 64, 8448), (L.INDEXER_FP4, 64, 4352),
    ],
)
def test_cache_page_bytes(fmt: L.CacheFormat, page_size: int, expected: int) -> None:
    assert fmt.page_bytes(page_size) == expected


def test_model_constants() -> None:
    assert L.mtp_write_pad(4, 8) == 0 and L.mtp_write_pad(4, 16) == 10
    assert L.mtp_write_pad(128, 128) == 0 and L.mtp_write_pad(128, 256) == 130
    assert L.state_width(4, 512) == 2048 and L.state_width(128, 512) == 1024 and L.state_width(128, 512, True) == 1536
    assert L.select_cache_format(128, True, False) is L.INDEXER_FP4
    assert L.select_cache_format(512, False, True) is L.BF16_ROWS


CPP_PROBE = r"""
#include <cstdio>
#include <cstring>
#include "plan.cuh"
using namespace flashcompress;
static void dump(const char* name, const void* p, size_t n) {
  printf("%s ", name);
  for (size_t i = 0; i < n; ++i) printf("%02x", ((const unsigned char*)p)[i]);
  printf("\n");
}
int main() {
  printf("DecodePlan %zu seq_len=%zu write_loc=%zu read_page_0=%zu read_page_1=%zu\n", sizeof(DecodePlan),
         offsetof(DecodePlan, seq_len), offsetof(DecodePlan, write_loc), offsetof(DecodePlan, read_page_0),
         offsetof(DecodePlan, read_page_1));
  printf("CompressPlan %zu seq_len=%zu ragged_id=%zu buffer_len=%zu read_page_0=%zu read_page_1=%zu\n",
         sizeof(CompressPlan), offsetof(CompressPlan, seq_len), offsetof(CompressPlan, ragged_id),
         offsetof(CompressPlan, buffer_len), offsetof(CompressPlan, read_page_0), offsetof(CompressPlan, read_page_1));
  printf("WritePlan %zu ragged_id=%zu write_loc=%zu\n", sizeof(WritePlan), offsetof(WritePlan, ragged_id),
         offsetof(WritePlan, write_loc));
  CompressPlan c = invalid_compress_plan();
  WritePlan w = invalid_write_plan();
  dump("INVALID_COMPRESS_ROW", &c, sizeof c);
  dump("INVALID_WRITE_ROW", &w, sizeof w);
  printf("MAX_RAGGED_ID %lld\n", (long long)kMaxRaggedId);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_cpp_plan_structs_match_python(tmp_path: Path) -> None:
    header = JIT_KERNEL_DIR / "plan.cuh"
    assert header.is_file(), f"missing {header}"
    src = tmp_path / "probe.cpp"
    src.write_text(CPP_PROBE)
    exe = tmp_path / "probe"
    subprocess.run(["c++", "-std=c++17", f"-I{JIT_KERNEL_DIR}", str(src), "-o", str(exe)], check=True)
    lines = dict(line.split(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                               check=True).stdout.splitlines())
    for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
        expected = f"{layout.row_bytes} " + " ".join(f"{f.name}={f.offset}" for f in layout.fields)
        assert lines[layout.name] == expected
    assert bytes.fromhex(lines["INVALID_COMPRESS_ROW"]) == L.INVALID_COMPRESS_ROW
    assert bytes.fromhex(lines["INVALID_WRITE_ROW"]) == L.INVALID_WRITE_ROW
    assert int(lines["MAX_RAGGED_ID"]) == L.MAX_RAGGED_ID
