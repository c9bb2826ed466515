"""Byte layouts: Python definitions, the bytes the backend packs, and the C++ mirror agree."""

from __future__ import annotations

import json
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


# Prints every fact of jit_kernel/layout.h as JSON, straight from its definitions.
CPP_PROBE = r"""
#include <cstdio>
#include "layout.h"
using namespace flashcompress;
static void hex(const char* key, const void* p, size_t n) {
  printf(", \"%s\": \"", key);
  for (size_t i = 0; i < n; ++i) printf("%02x", ((const unsigned char*)p)[i]);
  printf("\"");
}
#define FIELD(Row, f, sep) printf("%s\"" #f "\": [%zu, %zu]", sep, offsetof(Row, f), sizeof(Row::f))
int main() {
  printf("{\"formats\": [");
  const char* sep = "";
  for (StoreFormat fmt : kCacheFormats) {
    const CacheFormatBytes f = cache_format(fmt);
    printf("%s{\"name\": \"%s\", \"head_dim\": %lld, \"data_bytes\": %lld, \"scale_bytes\": %lld, "
           "\"page_align\": %lld, \"interleaved\": %s, \"page_bytes\": [", sep, f.name, (long long)f.head_dim,
           (long long)f.data_bytes, (long long)f.scale_bytes, (long long)f.page_align,
           f.interleaved ? "true" : "false");
    const long long sizes[] = {1, 2, 3, 4, 64, 256};
    for (int i = 0; i < 6; ++i) printf("%s%lld", i ? ", " : "", (long long)cache_page_bytes(fmt, sizes[i]));
    printf("]}");
    sep = ", ";
  }
  printf("], \"layer_kinds\": [");
  sep = "";
  for (const LayerKind& k : kLayerKinds) {
    printf("%s[%lld, %lld, %s, %lld, %lld, %lld]", sep, (long long)k.ratio, (long long)k.head_dim,
           k.online ? "true" : "false", (long long)state_width(k.ratio, k.head_dim, k.online),
           (long long)input_width(k.ratio, k.head_dim), (long long)ape_rows(k.ratio));
    sep = ", ";
  }
  printf("], \"window\": [%lld, %lld], \"mtp_write_pad\": [%lld, %lld, %lld, %lld]",
         (long long)window_size(4), (long long)window_size(128), (long long)mtp_write_pad(4, 8),
         (long long)mtp_write_pad(4, 16), (long long)mtp_write_pad(128, 128), (long long)mtp_write_pad(128, 256));
  printf(", \"DecodePlan\": [%zu, %zu, {", sizeof(DecodePlan), alignof(DecodePlan));
  FIELD(DecodePlan, seq_len, ""); FIELD(DecodePlan, write_loc, ", ");
  FIELD(DecodePlan, read_page_0, ", "); FIELD(DecodePlan, read_page_1, ", ");
  printf("}], \"CompressPlan\": [%zu, %zu, {", sizeof(CompressPlan), alignof(CompressPlan));
  FIELD(CompressPlan, seq_len, ""); FIELD(CompressPlan, ragged_id, ", "); FIELD(CompressPlan, buffer_len, ", ");
  FIELD(CompressPlan, read_page_0, ", "); FIELD(CompressPlan, read_page_1, ", ");
  printf("}], \"WritePlan\": [%zu, %zu, {", sizeof(WritePlan), alignof(WritePlan));
  FIELD(WritePlan, ragged_id, ""); FIELD(WritePlan, write_loc, ", ");
  printf("}], \"row_bytes\": [%lld, %lld, %lld, %lld, %lld]", (long long)kDecodePlanBytes,
         (long long)kCompressPlanBytes, (long long)kWritePlanBytes, (long long)write_row_bytes(false),
         (long long)write_row_bytes(true));
  const CompressPlan c = invalid_compress_plan();
  const WritePlan w = invalid_write_plan();
  hex("invalid_compress_row", &c, sizeof c);
  hex("invalid_write_row", &w, sizeof w);
  printf(", \"invalid_u32\": %u, \"max_ragged_id\": %lld}\n", kInvalidU32, (long long)kMaxRaggedId);
  return 0;
}
"""


@pytest.fixture(scope="module")
def cpp_layout(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every fact of ``jit_kernel/layout.h``, from a host program compiled against it."""
    if shutil.which("c++") is None:
        pytest.skip("no host C++ compiler")
    header = JIT_KERNEL_DIR / "layout.h"
    assert header.is_file(), f"missing {header}"
    work = tmp_path_factory.mktemp("layout_probe")
    (work / "probe.cpp").write_text(CPP_PROBE)
    subprocess.run(["c++", "-std=c++17", "-Wall", "-Werror", f"-I{JIT_KERNEL_DIR}", "probe.cpp", "-o", "probe"],
                   cwd=work, check=True)
    return json.loads(subprocess.run([str(work / "probe")], capture_output=True, text=True, check=True).stdout)


def test_cpp_cache_formats_match_python(cpp_layout: dict) -> None:
    page_sizes = (1, 2, 3, 4, 64, 256)
    want = [{"name": f.name, "head_dim": f.head_dim, "data_bytes": f.data_bytes, "scale_bytes": f.scale_bytes,
             "page_align": f.page_align, "interleaved": f.interleaved,
             "page_bytes": [f.page_bytes(p) for p in page_sizes]}
            for f in L.CACHE_FORMATS.values()]
    assert cpp_layout["formats"] == want
    for f in L.CACHE_FORMATS.values():  # the kvcache tensor's row is one C++ page
        assert [f.cache_row_bytes(p) for p in page_sizes] == [f.page_bytes(p) for p in page_sizes]


def test_cpp_layer_kinds_match_python(cpp_layout: dict) -> None:
    want = [[k.ratio, k.head_dim, k.online, k.state_width, k.input_width, k.ape_rows] for k in L.LAYER_KINDS.values()]
    assert cpp_layout["layer_kinds"] == want
    assert cpp_layout["window"] == [L.window_size(4), L.window_size(128)]
    assert cpp_layout["mtp_write_pad"] == [L.mtp_write_pad(4, 8), L.mtp_write_pad(4, 16), L.mtp_write_pad(128, 128),
                                           L.mtp_write_pad(128, 256)]


def test_cpp_plan_rows_match_python(cpp_layout: dict) -> None:
    for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
        size, align, fields = cpp_layout[layout.name]
        assert size == align == layout.row_bytes, layout.name
        assert fields == {f.name: [f.offset, f.size] for f in layout.fields}, layout.name
    assert cpp_layout["row_bytes"] == [L.DECODE_PLAN.row_bytes, L.PLAN_ROW_BYTES, L.WRITE_ROW_BYTES,
                                       L.WRITE_ROW_BYTES, L.PLAN_ROW_BYTES]
    assert bytes.fromhex(cpp_layout["invalid_compress_row"]) == L.INVALID_COMPRESS_ROW
    assert bytes.fromhex(cpp_layout["invalid_write_row"]) == L.INVALID_WRITE_ROW
    assert cpp_layout["invalid_u32"] == L.INVALID_U32
    assert cpp_layout["max_ragged_id"] == L.MAX_RAGGED_ID
