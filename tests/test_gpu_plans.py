"""GPU plan builders (the ``plan`` JIT family) against the PyTorch backend, byte for byte.

Run on a CUDA machine with ``pytest -m gpu``; skipped cleanly without one.  The
reference is always ``flashcompress.torch_backend.plans`` computed on CPU copies of
the inputs.  Covered: decode (paged / request ring, C4 / C128, rings 8/16/128/256,
CUDA-graph padding rows), online decode (state_slot_offset 0 and 9), prefill with
host stage 0 + GPU stage 1 (exact and use_cuda_graph padding), the deterministic
device planner (CUDA-graph path) incl. batches spanning several scan tiles, empty
batches, ragged and batch ids near 65535, graph capture + replay with new inputs,
side streams, the SGLang golden vectors and the binding's argument errors.
"""

from __future__ import annotations

import random

import pytest
import torch

from _golden import load_golden
from _plan_cases import MODES, assert_plan_bytes, make_world, mode_id, random_batch, random_decode_batch
from flashcompress.layouts import INVALID_COMPRESS_ROW, INVALID_WRITE_ROW
from flashcompress.torch_backend import plans as tp
from flashcompress.torch_backend.rows import pad_rows, words

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = torch.device("cuda") if torch.cuda.is_available() else None
POISON = 0xAB


@pytest.fixture(scope="module")
def pb():
    from flashcompress.cuda_ops import plans as plan_builder

    return plan_builder


@pytest.fixture(scope="module")
def world():
    return make_world(seed=11)


@pytest.fixture(scope="module")
def world_dev(world):
    return world.to(DEV)


def cuda(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEV) for t in tensors]


def ref_prefill(mode, rids, seq, ext, world, num_q, graph):
    ratio, ring, req_ring = mode
    return tp.prefill_plan(ratio, rids, seq, ext, world.req_to_token, world.full_to_state, 256, ring, num_q, graph,
                           req_ring)


# ----------------------------------------------------------------------------- decode


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_decode_matches_torch(pb, world, world_dev, mode) -> None:
    from flashcompress import CompressorDecodePlan

    ratio, ring, req_ring = mode
    rng = random.Random(MODES.index(mode))
    for trial in range(8):
        rids, seq = random_decode_batch(rng, world, rng.randint(1, 40), pad_rows=rng.choice([0, 3]))
        want = tp.decode_plan(ratio, rids, world.req_to_token, world.full_to_state, seq, 256, ring, req_ring)
        d_rids, d_seq = cuda(rids, seq)
        got = pb.decode_plan(ratio, d_rids, *world_dev, d_seq, 256, ring, req_ring)
        assert_plan_bytes(got, want, f"decode trial {trial}", kind="decode")
        api = CompressorDecodePlan.generate(ratio, d_rids, *world_dev, d_seq, 256, ring, req_ring)
        assert_plan_bytes(api[1], want, f"CompressorDecodePlan.generate trial {trial}", kind="decode")


@pytest.mark.parametrize("batch", [1, 255, 256, 257, 1024, 5000])
def test_decode_batch_sizes(pb, world, world_dev, batch) -> None:
    rng = random.Random(batch)
    rids, seq = random_decode_batch(rng, world, batch)
    for ratio, ring, req_ring in [(4, 8, False), (128, 256, False)]:
        want = tp.decode_plan(ratio, rids, world.req_to_token, world.full_to_state, seq, 256, ring, req_ring)
        got = pb.decode_plan(ratio, *cuda(rids), *world_dev, *cuda(seq), 256, ring, req_ring)
        assert_plan_bytes(got, want, f"decode B={batch} r={ratio}", kind="decode")


@pytest.mark.parametrize("offset", [0, 9])
def test_online_decode_matches_torch(pb, world, offset) -> None:
    rng = random.Random(offset)
    for batch in (1, 7, 300):
        rids, seq = random_decode_batch(rng, world, batch, pad_rows=2)
        want = tp.online_decode_plan(seq, rids, offset)
        got = pb.online_decode_plan(*cuda(seq, rids), offset)
        assert_plan_bytes(got, want, f"online decode B={batch}", kind="decode")


# ----------------------------------------------------------------------------- prefill, host stage 0


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_prefill_host_stage0_matches_torch(pb, world, world_dev, mode, graph) -> None:
    from flashcompress import CompressorPrefillPlan

    ratio, ring, req_ring = mode
    rng = random.Random(1000 + 10 * MODES.index(mode) + graph)
    for trial in range(8):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 12), rng.choice([4, 40, 700]))
        num_q = int(ext.sum())
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, num_q, graph)
        plan = CompressorPrefillPlan.generate(ratio, *cuda(rids), seq, ext, *world_dev, 256, ring, num_q, graph,
                                              req_ring)
        assert_plan_bytes(plan[1], want_c, f"plan_c trial {trial}")
        assert_plan_bytes(plan[2], want_w, f"plan_w trial {trial}")


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_stage1_sentinels_padding_rows(pb, world, world_dev, mode) -> None:
    """Rows past num_c / num_w hold garbage before stage 1 and sentinels after it."""
    ratio, ring, req_ring = mode
    rng = random.Random(7)
    rids, seq, ext = random_batch(rng, world, 6, 300)
    num_q = int(ext.sum())
    c0, w0 = tp.prefill_stage0(ratio, seq, ext, 256, ring, req_ring)
    nc, nw = c0.shape[0], w0.shape[0]
    plan_c = torch.full((num_q, 16), POISON, dtype=torch.uint8, device=DEV)
    plan_w = torch.full((num_q, 8), POISON, dtype=torch.uint8, device=DEV)
    plan_c[:nc] = c0.to(DEV)
    plan_w[:nw] = w0.to(DEV)
    pb.prefill_stage1(ratio, plan_c, plan_w, *cuda(rids), *world_dev, 256, ring, req_ring, num_c=nc, num_w=nw)
    want_c, want_w = ref_prefill(mode, rids, seq, ext, world, num_q, True)
    assert_plan_bytes(plan_c, want_c, "plan_c")
    assert_plan_bytes(plan_w, want_w, "plan_w")


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "graph_padded"])
@pytest.mark.parametrize("offset", [0, 9])
def test_online_prefill_host_stage0_matches_torch(pb, world, world_dev, offset, graph) -> None:
    from flashcompress import CompressorPrefillPlan

    rng = random.Random(offset * 7 + graph)
    for trial in range(8):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 12), rng.choice([3, 40, 700]))
        num_q = int(ext.sum())
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, graph, offset)
        plan = CompressorPrefillPlan.generate_online(seq, ext, *cuda(rids), world_dev[0], num_q, graph, offset)
        assert_plan_bytes(plan[1], want_c, f"online plan_c trial {trial}")
        assert_plan_bytes(plan[2], want_w, f"online plan_w trial {trial}")
        # the launcher directly, with poisoned padding rows past the real counts
        c0, w0 = tp.online_prefill_stage0(seq, ext)
        rows = num_q
        plan_c = torch.full((rows, 16), POISON, dtype=torch.uint8, device=DEV)
        plan_w = torch.full((rows, 16), POISON, dtype=torch.uint8, device=DEV)
        plan_c[: c0.shape[0]] = c0.to(DEV)
        plan_w[: w0.shape[0]] = w0.to(DEV)
        pb.online_prefill_stage1_both(plan_c, plan_w, *cuda(rids), offset, num_c=c0.shape[0], num_w=w0.shape[0])
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, rows, True, offset)
        assert_plan_bytes(plan_c, want_c, f"online stage1 plan_c trial {trial}")
        assert_plan_bytes(plan_w, want_w, f"online stage1 plan_w trial {trial}")


# ----------------------------------------------------------------------------- prefill, device planner


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_prefill_device_matches_torch(pb, world, world_dev, mode) -> None:
    from flashcompress import CompressorPrefillPlan

    ratio, ring, req_ring = mode
    rng = random.Random(2000 + MODES.index(mode))
    for trial in range(10):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 16), rng.choice([1, 3, 40, 700]))
        num_q = int(ext.sum()) + rng.choice([0, 0, 1, 100])
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, num_q, True)
        d_rids, d_seq, d_ext = cuda(rids, seq, ext)
        got_c, got_w = pb.prefill_plan_device(ratio, d_rids, d_seq, d_ext, *world_dev, 256, ring, num_q, req_ring)
        assert_plan_bytes(got_c, want_c, f"device plan_c trial {trial}")
        assert_plan_bytes(got_w, want_w, f"device plan_w trial {trial}")
        plan = CompressorPrefillPlan.generate(ratio, d_rids, d_seq, d_ext, *world_dev, 256, ring, num_q, False,
                                              req_ring)
        assert_plan_bytes(plan[1], want_c, f"generate(device lengths) plan_c trial {trial}")
        assert_plan_bytes(plan[2], want_w, f"generate(device lengths) plan_w trial {trial}")


@pytest.mark.parametrize("batch", [1023, 1024, 1025, 2048, 3001])
def test_prefill_device_many_scan_tiles(pb, world, world_dev, batch) -> None:
    """Batches larger than one 1024-thread scan tile carry offsets across tiles."""
    rng = random.Random(batch)
    for mode in [(4, 8, False), (4, 16, True), (128, 256, False)]:
        ratio, ring, req_ring = mode
        rids, seq, ext = random_batch(rng, world, batch, 20, unique_rids=False)
        num_q = int(ext.sum()) + 5
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, num_q, True)
        got_c, got_w = pb.prefill_plan_device(ratio, *cuda(rids, seq, ext), *world_dev, 256, ring, num_q, req_ring)
        assert_plan_bytes(got_c, want_c, f"{mode_id(mode)} B={batch} plan_c")
        assert_plan_bytes(got_w, want_w, f"{mode_id(mode)} B={batch} plan_w")
    for offset in (0, 9):
        rids, seq, ext = random_batch(rng, world, batch, 20, unique_rids=False)
        num_q = int(ext.sum()) + 3
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, True, offset)
        got_c, got_w = pb.online_prefill_plan_device(*cuda(rids, seq, ext), num_q, offset)
        assert_plan_bytes(got_c, want_c, f"online B={batch} plan_c")
        assert_plan_bytes(got_w, want_w, f"online B={batch} plan_w")


@pytest.mark.parametrize("offset", [0, 9])
def test_online_prefill_device_matches_torch(pb, world, offset) -> None:
    rng = random.Random(3000 + offset)
    for trial in range(10):
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 16), rng.choice([1, 3, 40, 700]))
        num_q = int(ext.sum()) + rng.choice([0, 2])
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, True, offset)
        got_c, got_w = pb.online_prefill_plan_device(*cuda(rids, seq, ext), num_q, offset)
        assert_plan_bytes(got_c, want_c, f"online device plan_c trial {trial}")
        assert_plan_bytes(got_w, want_w, f"online device plan_w trial {trial}")


def test_device_planner_does_not_synchronize(pb, world, world_dev) -> None:
    rng = random.Random(5)
    rids, seq, ext = cuda(*random_batch(rng, world, 8, 100))
    num_q = 2048
    pb.prefill_plan_device(4, rids, seq, ext, *world_dev, 256, 8, num_q, False)  # load the module first
    pb.online_prefill_plan_device(rids, seq, ext, num_q, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pb.prefill_plan_device(4, rids, seq, ext, *world_dev, 256, 8, num_q, False)
        pb.online_prefill_plan_device(rids, seq, ext, num_q, 0)
        pb.decode_plan(4, rids, *world_dev, seq, 256, 8, False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- empty batches


def test_empty_batches(pb, world, world_dev) -> None:
    from flashcompress import CompressorDecodePlan, CompressorPrefillPlan

    empty = torch.empty(0, dtype=torch.int64, device=DEV)
    assert pb.decode_plan(4, empty, *world_dev, empty, 256, 8, False).shape == (0, 16)
    assert pb.online_decode_plan(empty, empty, 0).shape == (0, 16)
    c, w = pb.prefill_plan_device(4, empty, empty, empty, *world_dev, 256, 8, 0, False)
    assert c.shape == (0, 16) and w.shape == (0, 8)
    c, w = pb.online_prefill_plan_device(empty, empty, empty, 0, 0)
    assert c.shape == (0, 16) and w.shape == (0, 16)
    z16 = torch.empty((0, 16), dtype=torch.uint8, device=DEV)
    z8 = torch.empty((0, 8), dtype=torch.uint8, device=DEV)
    pb.prefill_stage1(4, z16, z8, empty, *world_dev, 256, 8, False)
    pb.online_prefill_stage1_both(z16, z16.clone(), empty, 0)
    # B = 0 with padded rows: every row is a sentinel
    c, w = pb.prefill_plan_device(128, empty, empty, empty, *world_dev, 256, 128, 5, False)
    assert_plan_bytes(c, pad_rows(z16.cpu(), 5, INVALID_COMPRESS_ROW), "B=0 plan_c")
    assert_plan_bytes(w, pad_rows(z8.cpu(), 5, INVALID_WRITE_ROW), "B=0 plan_w")
    c, w = pb.online_prefill_plan_device(empty, empty, empty, 3, 9)
    assert_plan_bytes(w, pad_rows(z16.cpu(), 3, INVALID_COMPRESS_ROW), "online B=0 plan_w")
    # the public API
    assert CompressorDecodePlan.generate(4, empty, *world_dev, empty, 256, 8)[1].shape == (0, 16)
    assert CompressorDecodePlan.generate_online(empty, empty, world_dev[0], 0)[1].shape == (0, 16)
    plan = CompressorPrefillPlan.generate(4, empty, empty, empty, *world_dev, 256, 8, 0, True)
    assert plan[1].shape == (0, 16) and plan[2].shape == (0, 8)
    cpu_empty = empty.cpu()
    plan = CompressorPrefillPlan.generate_online(cpu_empty, cpu_empty, empty, world_dev[0], 0, True, 0)
    assert plan[1].shape == (0, 16) and plan[2].shape == (0, 16)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- u16 limits


def test_ragged_ids_near_65535(pb) -> None:
    """65536 ragged tokens: the last rows carry ragged_id 65535."""
    world = make_world(seed=3, slots=8, max_ctx=32768)
    wd = world.to(DEV)
    rids = torch.tensor([1, 3, 5, 7])
    ext = torch.tensor([16768, 16000, 16384, 16384])
    seq = torch.tensor([16768, 16384, 16384, 32768])
    assert int(ext.sum()) == 65536
    for mode in [(4, 8, False), (4, 16, True), (128, 256, False)]:
        ratio, ring, req_ring = mode
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, 65536, True)
        got_c, got_w = pb.prefill_plan_device(ratio, *cuda(rids, seq, ext), *wd, 256, ring, 65536, req_ring)
        assert_plan_bytes(got_c, want_c, f"{mode_id(mode)} plan_c")
        assert_plan_bytes(got_w, want_w, f"{mode_id(mode)} plan_w")
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, 65536, False)
        c0, w0 = tp.prefill_stage0(ratio, seq, ext, 256, ring, req_ring)
        c, w = c0.to(DEV), w0.to(DEV)
        pb.prefill_stage1(ratio, c, w, *cuda(rids), *wd, 256, ring, req_ring)
        assert_plan_bytes(c, want_c, f"{mode_id(mode)} stage1 plan_c")
        assert_plan_bytes(w, want_w, f"{mode_id(mode)} stage1 plan_w")
        assert int((words(got_c.cpu())[:, 1] & 0xFFFF).max()) == 65535  # the last token closes a window
    want_c, want_w = tp.online_prefill_plan(seq, ext, rids, 65536, True, 9)
    got_c, got_w = pb.online_prefill_plan_device(*cuda(rids, seq, ext), 65536, 9)
    assert_plan_bytes(got_c, want_c, "online plan_c")
    assert_plan_bytes(got_w, want_w, "online plan_w")


def test_batch_ids_near_65535(pb) -> None:
    """65535 one-token requests: stage-0 write rows pack batch ids up to 65534 in the high half."""
    world = make_world(seed=4, slots=8, max_ctx=4096)
    wd = world.to(DEV)
    gen = torch.Generator().manual_seed(4)
    batch = 65535
    rids = torch.randint(1, 8, (batch,), generator=gen)
    seq = torch.randint(1, 4097, (batch,), generator=gen)
    ext = torch.ones(batch, dtype=torch.int64)
    for mode in [(4, 8, False), (4, 16, True), (128, 128, False)]:
        ratio, ring, req_ring = mode
        c0, w0 = tp.prefill_stage0(ratio, seq, ext, 256, ring, req_ring)
        c, w = c0.to(DEV), w0.to(DEV)
        pb.prefill_stage1(ratio, c, w, *cuda(rids), *wd, 256, ring, req_ring)
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, batch, False)
        assert_plan_bytes(c, want_c, f"{mode_id(mode)} stage1 plan_c")
        assert_plan_bytes(w, want_w, f"{mode_id(mode)} stage1 plan_w")
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, 65536, True)
        got_c, got_w = pb.prefill_plan_device(ratio, *cuda(rids, seq, ext), *wd, 256, ring, 65536, req_ring)
        assert_plan_bytes(got_c, want_c, f"{mode_id(mode)} device plan_c")
        assert_plan_bytes(got_w, want_w, f"{mode_id(mode)} device plan_w")
    c0, w0 = tp.online_prefill_stage0(seq, ext)
    c, w = c0.to(DEV), w0.to(DEV)
    pb.online_prefill_stage1_both(c, w, *cuda(rids), 9)
    want_c, want_w = tp.online_prefill_plan(seq, ext, rids, batch, False, 9)
    assert_plan_bytes(c, want_c, "online stage1 plan_c")
    assert_plan_bytes(w, want_w, "online stage1 plan_w")


# ----------------------------------------------------------------------------- CUDA graphs and streams


@pytest.mark.parametrize("mode", [(4, 8, False), (4, 16, True), (128, 256, False)], ids=mode_id)
def test_device_planner_graph_capture_replay(pb, world, world_dev, mode) -> None:
    ratio, ring, req_ring = mode
    rng = random.Random(77)
    batch, num_q = 8, 2048
    rids, seq, ext = random_batch(rng, world, batch, 200)
    s_rids, s_seq, s_ext = cuda(rids, seq, ext)  # static input buffers
    pb.prefill_plan_device(ratio, s_rids, s_seq, s_ext, *world_dev, 256, ring, num_q, req_ring)  # load + warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_c, out_w = pb.prefill_plan_device(ratio, s_rids, s_seq, s_ext, *world_dev, 256, ring, num_q, req_ring)
        out_d = pb.decode_plan(ratio, s_rids, *world_dev, s_seq, 256, ring, req_ring)
    for trial in range(6):
        rids, seq, ext = random_batch(rng, world, batch, rng.choice([1, 50, 250]))
        s_rids.copy_(rids)
        s_seq.copy_(seq)
        s_ext.copy_(ext)
        for t in (out_c, out_w, out_d):
            t.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        want_c, want_w = ref_prefill(mode, rids, seq, ext, world, num_q, True)
        assert_plan_bytes(out_c, want_c, f"replay {trial} plan_c")
        assert_plan_bytes(out_w, want_w, f"replay {trial} plan_w")
        want_d = tp.decode_plan(ratio, rids, world.req_to_token, world.full_to_state, seq, 256, ring, req_ring)
        assert_plan_bytes(out_d, want_d, f"replay {trial} plan_d", kind="decode")


def test_online_planners_graph_capture_replay(pb, world) -> None:
    rng = random.Random(78)
    batch, num_q = 5, 1024
    rids, seq, ext = random_batch(rng, world, batch, 150)
    s_rids, s_seq, s_ext = cuda(rids, seq, ext)
    pb.online_prefill_plan_device(s_rids, s_seq, s_ext, num_q, 9)
    pb.online_decode_plan(s_seq, s_rids, 9)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_c, out_w = pb.online_prefill_plan_device(s_rids, s_seq, s_ext, num_q, 9)
        out_d = pb.online_decode_plan(s_seq, s_rids, 9)
    for trial in range(4):
        rids, seq, ext = random_batch(rng, world, batch, rng.choice([1, 150]))
        s_rids.copy_(rids)
        s_seq.copy_(seq)
        s_ext.copy_(ext)
        for t in (out_c, out_w, out_d):
            t.fill_(POISON)
        graph.replay()
        torch.cuda.synchronize()
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, True, 9)
        assert_plan_bytes(out_c, want_c, f"replay {trial} plan_c")
        assert_plan_bytes(out_w, want_w, f"replay {trial} plan_w")
        assert_plan_bytes(out_d, tp.online_decode_plan(seq, rids, 9), f"replay {trial} plan_d", kind="decode")


def test_public_generate_is_capturable(world, world_dev) -> None:
    """CompressorPrefillPlan.generate with device lengths captures (no host sync in the API layer)."""
    from flashcompress import CompressorPrefillPlan

    rng = random.Random(79)
    batch, num_q = 6, 1536
    rids, seq, ext = random_batch(rng, world, batch, 200)
    s_rids, s_seq, s_ext = cuda(rids, seq, ext)
    args = (4, s_rids, s_seq, s_ext, *world_dev, 256, 8, num_q, True, False)
    CompressorPrefillPlan.generate(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = CompressorPrefillPlan.generate(*args)
    rids, seq, ext = random_batch(rng, world, batch, 200)
    s_rids.copy_(rids)
    s_seq.copy_(seq)
    s_ext.copy_(ext)
    graph.replay()
    torch.cuda.synchronize()
    want_c, want_w = ref_prefill((4, 8, False), rids, seq, ext, world, num_q, True)
    assert_plan_bytes(plan[1], want_c, "plan_c")
    assert_plan_bytes(plan[2], want_w, "plan_w")


def test_runs_on_the_current_stream(pb, world, world_dev) -> None:
    """The planner must be ordered after earlier work on the caller's (side) stream."""
    rng = random.Random(80)
    rids, seq, ext = random_batch(rng, world, 10, 300)
    num_q = int(ext.sum())
    src_rids, src_seq, src_ext = cuda(rids, seq, ext)
    d_rids, d_seq, d_ext = (torch.zeros_like(t) for t in (src_rids, src_seq, src_ext))  # stale inputs
    big = torch.randn(4096, 4096, device=DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(8):  # keep the side stream busy for a while ...
            big = big @ big / 64
        for dst, src in ((d_rids, src_rids), (d_seq, src_seq), (d_ext, src_ext)):
            dst.copy_(src)  # ... before the real inputs arrive
        out_c, out_w = pb.prefill_plan_device(4, d_rids, d_seq, d_ext, *world_dev, 256, 8, num_q, False)
        snap_c, snap_w = out_c.clone(), out_w.clone()
    side.synchronize()
    want_c, want_w = ref_prefill((4, 8, False), rids, seq, ext, world, num_q, True)
    assert_plan_bytes(snap_c, want_c, "plan_c")
    assert_plan_bytes(snap_w, want_w, "plan_w")


# ----------------------------------------------------------------------------- golden vectors


@pytest.mark.parametrize("relpath", ["plans/plan_c4.pt", "plans/plan_c128.pt", "plans/plan_c128_online.pt"])
def test_golden_vectors(pb, relpath) -> None:
    """SGLang 0.5.23's plan bytes (CPU stage 0 + GPU stage 1), rebuilt by our kernels."""
    d = load_golden(relpath)
    r2t, f2s = cuda(d["req_to_token"], d["full_to_state"])
    online = "online" in relpath
    calls = sorted({k.split(".")[0] for k in d if "." in k})
    for call in calls:
        g = lambda n: d[f"{call}.{n}"]  # noqa: E731
        rids, seq = g("req_pool_indices"), g("seq_lens")
        if g("api").startswith("CompressorDecodePlan"):
            if online:
                got = pb.online_decode_plan(*cuda(seq, rids), g("state_slot_offset"))
            else:
                got = pb.decode_plan(g("compress_ratio"), *cuda(rids), r2t, f2s, *cuda(seq), g("swa_page_size"),
                                     g("ring_size"), g("use_req_ring"))
            assert_plan_bytes(got, g("plan_d"), f"{call}.plan_d", kind="decode")
            continue
        ext, num_q, graph = g("extend_lens"), g("num_q_tokens"), g("use_cuda_graph")
        if online:
            c0, w0 = tp.online_prefill_stage0(seq, ext)
            w_sentinel = INVALID_COMPRESS_ROW
        else:
            ratio = g("compress_ratio")
            c0, w0 = tp.prefill_stage0(ratio, seq, ext, g("swa_page_size"), g("ring_size"), g("use_req_ring"))
            w_sentinel = INVALID_WRITE_ROW
        rows_c = num_q if graph else c0.shape[0]
        rows_w = num_q if graph else w0.shape[0]
        plan_c = torch.full((rows_c, 16), POISON, dtype=torch.uint8, device=DEV)
        plan_w = torch.full((rows_w, w0.shape[1]), POISON, dtype=torch.uint8, device=DEV)
        plan_c[: c0.shape[0]] = c0.to(DEV)
        plan_w[: w0.shape[0]] = w0.to(DEV)
        if online:
            pb.online_prefill_stage1_both(plan_c, plan_w, *cuda(rids), g("state_slot_offset"), num_c=c0.shape[0],
                                     num_w=w0.shape[0])
            dev_c, dev_w = pb.online_prefill_plan_device(*cuda(rids, seq, ext), num_q, g("state_slot_offset"))
        else:
            world = (r2t, f2s, g("swa_page_size"), g("ring_size"))
            pb.prefill_stage1(ratio, plan_c, plan_w, *cuda(rids), *world, g("use_req_ring"), num_c=c0.shape[0],
                              num_w=w0.shape[0])
            dev_c, dev_w = pb.prefill_plan_device(ratio, *cuda(rids, seq, ext), *world, num_q, g("use_req_ring"))
        assert_plan_bytes(plan_c, g("plan_c"), f"{call}.plan_c (stage 1)")
        assert_plan_bytes(plan_w, g("plan_w"), f"{call}.plan_w (stage 1)")
        assert_plan_bytes(dev_c, pad_rows(g("plan_c"), num_q, INVALID_COMPRESS_ROW), f"{call}.plan_c (device)")
        assert_plan_bytes(dev_w, pad_rows(g("plan_w"), num_q, w_sentinel), f"{call}.plan_w (device)")


# ----------------------------------------------------------------------------- binding errors


def test_binding_argument_errors(pb, world_dev) -> None:
    mod = pb._module(4, False)
    r2t, f2s = world_dev
    rids = torch.tensor([1, 2], dtype=torch.int64, device=DEV)
    seq = torch.tensor([5, 9], dtype=torch.int64, device=DEV)
    out = torch.empty((2, 16), dtype=torch.uint8, device=DEV)
    with pytest.raises(TypeError, match="seq_lens: expected dtype int64, got int32"):
        mod.decode(out, rids, r2t, f2s, seq.int(), 256, 8, False)
    with pytest.raises(ValueError, match=r"seq_lens: expected shape \[2\], got \[1\]"):
        mod.decode(out, rids, r2t, f2s, seq[:1], 256, 8, False)
    with pytest.raises(ValueError, match="req_pool_indices: expected device cuda:0, got cpu:0"):
        mod.decode(out, rids.cpu(), r2t, f2s, seq, 256, 8, False)
    with pytest.raises(ValueError, match="out: expected a cuda tensor"):
        mod.decode(out.cpu(), rids, r2t, f2s, seq, 256, 8, False)
    with pytest.raises(ValueError, match=r"out: expected shape \[\*, 16\]"):
        mod.decode(torch.empty((2, 8), dtype=torch.uint8, device=DEV), rids, r2t, f2s, seq, 256, 8, False)
    with pytest.raises(ValueError, match="ring_size"):
        mod.decode(out, rids, r2t, f2s, seq, 256, 0, False)
    misaligned = torch.empty(2 * 16 + 8, dtype=torch.uint8, device=DEV)[8:].view(2, 16)
    with pytest.raises(ValueError, match="out: data must be 16-byte aligned"):
        mod.decode(misaligned, rids, r2t, f2s, seq, 256, 8, False)
    plan_c = torch.empty((4, 16), dtype=torch.uint8, device=DEV)
    plan_w = torch.empty((4, 8), dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="num_c"):
        mod.prefill_stage1(plan_c, plan_w, 5, 0, rids, r2t, f2s, 256, 8, False)
    ws = pb.prefill_workspace(2, DEV)
    with pytest.raises(ValueError, match=r"plan_w: expected shape \[4, 8\]"):
        mod.prefill_device(plan_c, plan_w[:3], ws, rids, seq, seq, r2t, f2s, 256, 8, False)
    with pytest.raises(ValueError, match="workspace"):
        mod.prefill_device(plan_c, plan_w, ws[:-1], rids, seq, seq, r2t, f2s, 256, 8, False)
    big_c = torch.empty((65537, 16), dtype=torch.uint8, device=DEV)
    big_w = torch.empty((65537, 8), dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="num_q_tokens"):
        mod.prefill_device(big_c, big_w, ws, rids, seq, seq, r2t, f2s, 256, 8, False)

