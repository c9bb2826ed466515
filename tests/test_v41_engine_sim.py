"""Engine simulation of V4.1-Flash's four source layers (spec v41.md §13 item 13).

``flashcompress.testing.simulator_v41`` drives the public V4.1 ops as an engine does
(chunked prefill, decode, verify with rollback, CUDA-graph padding, request-slot reuse)
over the three ratio-2 and the ratio-1 source layers, and checks the pair rings after
every step against a ring model, every accepted latent and every byte of the main and
index-K caches against each request run as one unchunked prefill.  The checks must fail
on an injected engine bug (corrupted ring row, wrong extend lengths, unmarked padding)
and on an op that parks rows the fused kernels do not park.  The ``gpu`` test runs the
same simulations on CUDA and compares every buffer and latent with the CPU run.
"""

from __future__ import annotations

import pytest
import torch

from flashcompress.testing import simulator_v41 as S
from flashcompress.v41.layouts import KVLayout

ALL_LAYOUTS = [m.value for m in KVLayout]
# (scenario, seed): every layout with verify + rollback, no speculation, slot reuse, short requests
SCENARIOS = [(S.V41Scenario(layout=lay, draft_len=3, num_requests=3, max_len=200), 1) for lay in ALL_LAYOUTS] + [
    (S.V41Scenario(), 2),
    (S.V41Scenario(draft_len=5, num_requests=5, num_slots=2, layout="v41_fp4"), 3),
    (S.V41Scenario(draft_len=7, min_len=1, max_len=24, num_requests=6, num_slots=3), 4),
    (S.V41Scenario(layout="v41_fp4_new", index_page_size=128, max_len=600, num_requests=3), 5),
]
GPU_SCENARIOS = [(S.V41Scenario(layout=lay, draft_len=3), 1) for lay in ("v4", "v41_fp4", "v41_fp4_new")] + \
    SCENARIOS[len(ALL_LAYOUTS):]


def _id(case) -> str:
    sc, seed = case
    return f"{sc.layout}-d{sc.draft_len}-r{sc.num_requests}s{sc.num_slots or sc.num_requests}-p{sc.index_page_size}-{seed}"


@pytest.fixture(autouse=True)
def _one_thread():
    """The ops run on small tensors: one thread is fastest, and far faster than two on a busy box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", SCENARIOS, ids=_id)
def test_simulation_matches_unchunked_ground_truth(case) -> None:
    sc, seed = case
    res = S.simulate_v41(sc, seed=seed)
    assert res.ok, res.summary()
    # the schedule exercised what it claims
    assert res.steps["extend"] > 0 and res.steps["decode"] > 0 and res.steps["padded"] > 0, res.summary()
    if sc.draft_len:
        assert res.steps["verify"] > 0 and res.steps["rejected rows"] > 0, res.summary()
    assert [(r.layer, r.ratio) for r in res.reports] == list(S.SOURCE_LAYERS)
    for r in res.reports:
        want = sum(n if r.ratio == 1 else n // 2 for n in res.request_lengths)
        assert r.entries == r.index_entries == r.latent_rows == want, res.summary()
        if r.ratio == 2:
            assert r.ring_checks == sum(res.steps[k] for k in ("extend", "decode", "verify")) and r.zero_rows > 0


@pytest.mark.parametrize("draft_len", [0, 3])
@pytest.mark.parametrize("fault", S.FAULTS)
def test_injected_engine_bugs_are_detected(fault: str, draft_len: int) -> None:
    res = S.simulate_v41(S.V41Scenario(fault=fault, draft_len=draft_len), seed=1)
    assert not res.ok
    text = "\n".join(res.failures())
    if fault == "ring":  # the ring model shares the damage: only the ground truth can see it
        assert "differs from the unchunked prefill" in text and "main cache" in text and "index-K cache" in text
    elif fault == "chunking":
        assert "pair ring row" in text and "differs from the ring model" in text
    else:  # padding rows that are not marked write the dummy page
        assert "page 0" in text and all(f"L{layer} " in text for layer, _ in S.SOURCE_LAYERS)


def test_a_decode_op_that_parks_odd_rows_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's Triton decode pool parks every row (spec §14.5); the caches cannot see it, the ring check does."""
    from flashcompress.torch_backend import v41 as T

    real = T.c2_decode

    def park_every_row(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache, *,
                       page_size, ring_size, draft_len, layout, out):
        real(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
             page_size=page_size, ring_size=ring_size, draft_len=draft_len, layout=layout, out=out)
        live = (raw_out_loc != 0).nonzero().squeeze(1)
        kv_state[req[live] * ring_size + positions[live].long() % ring_size] = kv_input[live]

    monkeypatch.setattr(T, "c2_decode", park_every_row)
    res = S.simulate_v41(S.V41Scenario(), seed=2)
    text = "\n".join(res.failures())
    assert not res.ok and "differs from the ring model" in text
    assert "cache" not in text and "latent" not in text  # only even ring rows are ever read


def test_a_prefill_whose_write_back_overtakes_the_pool_pass_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spec §4.5: a chunk that starts odd and ends even reads and rewrites one ring row, so the
    write-back must follow the pool pass; doing it first breaks chunked prefill only."""
    from flashcompress.torch_backend import v41 as T

    real = T.c2_prefill

    def write_back_first(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache,
                         extend_start_loc, extend_seq_lens, *, page_size, ring_size, layout, out):
        for start, n in zip(extend_start_loc.tolist(), extend_seq_lens.tolist()):
            for i in range(max(start, start + n - ring_size), start + n):
                if int(raw_out_loc[i]):
                    kv_state[int(req[i]) * ring_size + int(positions[i]) % ring_size] = kv_input[i]
        real(kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs_cis, k_cache, extend_start_loc,
             extend_seq_lens, page_size=page_size, ring_size=ring_size, layout=layout, out=out)

    monkeypatch.setattr(T, "c2_prefill", write_back_first)
    res = S.simulate_v41(S.V41Scenario(num_requests=6), seed=2)
    text = "\n".join(res.failures())
    assert not res.ok and "differs from the unchunked prefill" in text and "main cache" in text, res.summary()
    assert "L20" not in text  # ratio 1 has no ring


def test_a_wrong_pooling_in_the_reference_is_caught_by_the_float64_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine and ground truth share the ops; the float64 model of spec §2.1 does not."""
    from flashcompress.torch_backend import v41 as T

    real = T.pool_pairs
    monkeypatch.setattr(T, "pool_pairs", lambda k0, s0, k1, s1: real(k0, s1, k1, s0))  # scores swapped
    res = S.simulate_v41(S.V41Scenario(max_len=60), seed=2)
    text = "\n".join(res.failures())
    assert not res.ok and "float64 model" in text and "L20" not in text  # ratio 1 does not pool
    assert "main cache" not in text and "ring" not in text


def test_model_latents_pool_and_norm() -> None:
    x = torch.zeros(2, 1024)
    x[0, :512], x[1, :512] = 1.0, -3.0
    x[0, 512:], x[1, 512:] = 30.0, 0.0  # the even token dominates the softmax
    w = torch.full((512,), 2.0).to(torch.bfloat16)
    lat = S.model_latents(x, 2, w, 1e-20)
    assert lat.shape == (1, 512) and torch.allclose(lat.float(), torch.full((1, 512), 2.0))
    assert torch.equal(S.model_latents(x[:1, :512].to(torch.bfloat16), 1, w, 1e-20).float(), torch.full((1, 512), 2.0))
    assert S.model_latents(x[:1], 2, w, 1e-20).shape == (0, 512)  # a lone even token has no latent yet


def test_scenario_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="fault"):
        S.V41Simulator(S.V41Scenario(fault="nosuch"))
    with pytest.raises(ValueError, match="draft_len"):
        S.V41Simulator(S.V41Scenario(draft_len=1))
    assert S.V41Scenario().ring == 2 and S.V41Scenario(draft_len=3).ring == 8 and S.V41Scenario(draft_len=7).ring == 16


def test_runs_are_deterministic() -> None:
    sc = S.V41Scenario(draft_len=3, max_len=80)
    a, b = S.simulate_v41(sc, seed=7), S.simulate_v41(sc, seed=7)
    assert a.ok and b.ok and a.steps == b.steps
    _assert_same_bytes(a, b)


def test_demo_runs_the_v41_model(capsys: pytest.CaptureFixture[str]) -> None:
    from flashcompress.testing import demo

    assert demo.main(["--model", "deepseek-v4.1-flash", "--requests", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "ring 8, verify draft_len 3" in out and out.rstrip().splitlines()[-1].startswith("PASS")


def _assert_same_bytes(a: S.V41SimResult, b: S.V41SimResult) -> None:
    assert a.buffers.keys() == b.buffers.keys()
    for layer, bufs in a.buffers.items():
        for name, t in bufs.items():
            other = b.buffers[layer][name]
            same = torch.equal(t.view(torch.int32), other.view(torch.int32)) if name == "ring" else torch.equal(t, other)
            assert same, f"layer {layer} {name} differs between the runs"
    assert len(a.latents) == len(b.latents)
    for (sa, la, xa), (sb, lb, xb) in zip(a.latents, b.latents):
        assert (sa, la) == (sb, lb) and torch.equal(xa.view(torch.int16), xb.view(torch.int16)), (sa, la)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_SCENARIOS, ids=_id)
def test_gpu_simulation_matches_the_cpu_run(case) -> None:
    """The same schedule through the v41 kernels: checked against the CPU ground truth, and every ring,
    cache and latent byte equal to the CPU run's."""
    sc, seed = case
    cpu = S.simulate_v41(sc, seed=seed)
    gpu = S.simulate_v41(sc, device="cuda", seed=seed)
    print(gpu.summary())
    assert cpu.ok, cpu.summary()
    assert gpu.ok, gpu.summary()
    assert gpu.steps == cpu.steps
    _assert_same_bytes(gpu, cpu)
