"""The worked examples of spec/compressor.md §8, reproduced row by row through the public API."""

from __future__ import annotations

import torch

from flashcompress import CompressorDecodePlan, CompressorPrefillPlan, compress_forward
from flashcompress.layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW
from flashcompress.torch_backend.rows import compress_fields, decode_fields, write_fields

RID = 3


def paged_world_c4() -> tuple[torch.Tensor, torch.Tensor]:
    """§8.1: req_to_token[3][p] = 2048 + p and full_to_swa[2048 + p] = 512 + p."""
    req_to_token = torch.zeros(4, 4096, dtype=torch.int32)
    req_to_token[RID] = 2048 + torch.arange(4096, dtype=torch.int32)
    full_to_state = torch.zeros(8192 + 256 + 1, dtype=torch.int64)
    full_to_state[2048 : 2048 + 1024] = 512 + torch.arange(1024)
    full_to_state[-1] = -1
    return req_to_token, full_to_state


def rows_as_lists(fields: dict[str, torch.Tensor], names: list[str]) -> list[tuple[int, ...]]:
    return [tuple(int(fields[n][i]) for n in names) for i in range(fields[names[0]].shape[0])]


def test_c4_prefill_10_tokens_then_decode() -> None:
    req_to_token, full_to_state = paged_world_c4()
    rpi = torch.tensor([RID])
    plan = CompressorPrefillPlan.generate(
        4, rpi, torch.tensor([10]), torch.tensor([10]), req_to_token, full_to_state, 256, 8, 10
    )
    c = compress_fields(plan[1])
    assert rows_as_lists(c, ["seq_len", "ragged_id", "buffer_len", "read_page_0", "read_page_1"]) == [
        (4, 3, 4, 4, 4),
        (8, 7, 0, -1, 0),
    ]
    assert bytes(plan[1][0].tolist()) == bytes.fromhex("04000000030004000400000004000000")
    assert bytes(plan[1][1].tolist()) == bytes.fromhex("0800000007000000ffffffff00000000")
    w = write_fields(plan[2])
    assert rows_as_lists(w, ["ragged_id", "write_loc"]) == [(4, 20), (5, 21), (6, 22), (7, 23), (8, 16), (9, 17)]
    assert bytes(plan[2][0].tolist()) == bytes.fromhex("0400000014000000")

    graph = CompressorPrefillPlan.generate(
        4, rpi, torch.tensor([10]), torch.tensor([10]), req_to_token, full_to_state, 256, 8, 10, use_cuda_graph=True
    )
    assert graph[1].shape == (10, 16) and graph[2].shape == (10, 8)
    assert all(bytes(r.tolist()) == INVALID_COMPRESS_ROW for r in graph[1][2:])
    assert all(bytes(r.tolist()) == INVALID_WRITE_ROW for r in graph[2][6:])
    assert torch.equal(graph[1][:2], plan[1]) and torch.equal(graph[2][:6], plan[2])

    expected = {11: (18, 5, 4), 12: (19, 5, 4), 13: (20, 4, 5)}
    for seq_len, (write_loc, page0, page1) in expected.items():
        d = CompressorDecodePlan.generate(4, rpi, req_to_token, full_to_state, torch.tensor([seq_len]), 256, 8)
        f = decode_fields(d[1])
        assert (int(f["seq_len"][0]), int(f["write_loc"][0]), int(f["read_page_0"][0]), int(f["read_page_1"][0])) == (
            seq_len, write_loc, page0, page1,
        )
    d11 = CompressorDecodePlan.generate(4, rpi, req_to_token, full_to_state, torch.tensor([11]), 256, 8)
    assert bytes(d11[1][0].tolist()) == bytes.fromhex("0b000000120000000500000004000000")


def test_c4_worked_example_state_rows() -> None:
    """After prefill + 3 decodes, state rows 16..23 hold positions 8, 9, 10, 11, 12, 5, 6, 7."""
    H = 128
    req_to_token, full_to_state = paged_world_c4()
    rpi = torch.tensor([RID])
    state = torch.full((32, 4 * H), -1.0)
    tokens = torch.arange(13, dtype=torch.float32)[:, None].expand(13, 4 * H).contiguous()  # row p holds value p
    ape = torch.zeros(8, H)
    plan = CompressorPrefillPlan.generate(4, rpi, torch.tensor([10]), torch.tensor([10]), req_to_token,
                                          full_to_state, 256, 8, 10)
    compress_forward(state, tokens[:10], ape, plan, head_dim=H, compress_ratio=4)
    for p in (10, 11, 12):
        d = CompressorDecodePlan.generate(4, rpi, req_to_token, full_to_state, torch.tensor([p + 1]), 256, 8)
        compress_forward(state, tokens[p : p + 1], ape, d, head_dim=H, compress_ratio=4)
    assert state[16:24, 0].tolist() == [8, 9, 10, 11, 12, 5, 6, 7]
    assert bool((state[18:20] >= 0).all())


def test_c128_two_chunks_alias_the_ring() -> None:
    """§8.2: 300 tokens as 200 + 100; chunk B reads 72 rows of chunk A, then overwrites them."""
    H = 512
    req_to_token = torch.zeros(4, 1024, dtype=torch.int32)
    full_to_state = torch.zeros(1, dtype=torch.int64)
    rpi = torch.tensor([RID])
    a = CompressorPrefillPlan.generate(128, rpi, torch.tensor([200]), torch.tensor([200]), req_to_token,
                                       full_to_state, 256, 128, 200)
    assert rows_as_lists(compress_fields(a[1]), ["seq_len", "ragged_id", "buffer_len", "read_page_0", "read_page_1"]) == [
        (128, 127, 0, -1, 0)
    ]
    wa = write_fields(a[2])
    assert wa["ragged_id"].tolist() == list(range(128, 200))
    assert wa["write_loc"].tolist() == list(range(384, 456))

    b = CompressorPrefillPlan.generate(128, rpi, torch.tensor([300]), torch.tensor([100]), req_to_token,
                                       full_to_state, 256, 128, 100)
    assert rows_as_lists(compress_fields(b[1]), ["seq_len", "ragged_id", "buffer_len", "read_page_0", "read_page_1"]) == [
        (256, 55, 72, 3, 3)
    ]
    wb = write_fields(b[2])
    assert wb["ragged_id"].tolist() == list(range(56, 100))
    assert wb["write_loc"].tolist() == list(range(384, 428))

    # Numerics of the aliasing case: entry 1 must pool positions 128..255 even though the
    # write pass of the same call overwrites rows 384..427 (positions 128..171).
    torch.manual_seed(0)
    seq = torch.randn(300, 2 * H)
    ape = torch.randn(128, H) * 0.5
    state = torch.zeros(4 * 128, 2 * H)
    compress_forward(state, seq[:200].contiguous(), ape, a, head_dim=H, compress_ratio=128)
    out = compress_forward(state, seq[200:].contiguous(), ape, b, head_dim=H, compress_ratio=128)
    window = seq[128:256].double()
    w = torch.softmax(window[:, H:] + ape.double(), dim=0)
    expected = (w * window[:, :H]).sum(0)
    torch.testing.assert_close(out[0].double(), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(state[384:428], seq[256:300])


def test_c128_online_segments() -> None:
    """§8.2, online: chunk A -> compress {128,127,128} + write {200,199,72}; chunk B -> {256,55,56} + {300,99,44}."""
    req_to_token = torch.zeros(4, 1024, dtype=torch.int32)
    rpi = torch.tensor([RID])
    names = ["seq_len", "ragged_id", "buffer_len", "read_page_0", "read_page_1"]
    a = CompressorPrefillPlan.generate_online(torch.tensor([200]), torch.tensor([200]), rpi, req_to_token, 200)
    assert rows_as_lists(compress_fields(a[1]), names) == [(128, 127, 128, RID, RID)]
    assert rows_as_lists(compress_fields(a[2]), names) == [(200, 199, 72, RID, RID)]
    b = CompressorPrefillPlan.generate_online(torch.tensor([300]), torch.tensor([100]), rpi, req_to_token, 100,
                                              state_slot_offset=9)
    assert rows_as_lists(compress_fields(b[1]), names) == [(256, 55, 56, RID + 9, RID)]
    assert rows_as_lists(compress_fields(b[2]), names) == [(300, 99, 44, RID + 9, RID)]
    d = CompressorDecodePlan.generate_online(torch.tensor([301]), rpi, req_to_token, 9)
    assert rows_as_lists(decode_fields(d[1]), ["seq_len", "write_loc", "read_page_0", "read_page_1"]) == [
        (301, RID + 9, RID + 9, -1)
    ]
