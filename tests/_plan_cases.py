"""Plan-builder test cases shared by test_gpu_plans.py and test_plan_kernel_build.py.

A "world" is a small allocator state shaped like the golden vectors': every request
slot owns whole 256-token full pages in shuffled physical order, every full page maps
to its own SWA page (also shuffled, position-aligned), page 0 is the dummy page, slot 0
(the CUDA-graph padding slot) maps every position to full loc 0, and ``full_to_state``
ends with -1.  Batches mix fresh prompts, chunks resuming at page boundaries and random
chunks, so paged C4 exercises the page-tail rule and speculative rings the write pad.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from flashcompress.torch_backend.rows import words

SWA_PAGE = 256

# (ratio, ring_size, use_req_ring) of every non-online addressing mode.
MODES = [
    (4, 8, False),
    (4, 16, False),
    (4, 8, True),
    (4, 16, True),
    (128, 128, False),
    (128, 256, False),
]


def mode_id(mode: tuple[int, int, bool]) -> str:
    ratio, ring, req_ring = mode
    return f"c{ratio}_ring{ring}_{'reqring' if req_ring or ratio == 128 else 'paged'}"


@dataclass
class World:
    req_to_token: torch.Tensor  # int32 [slots, max_ctx] (CPU)
    full_to_state: torch.Tensor  # int64 [F] (CPU)

    @property
    def slots(self) -> int:
        return self.req_to_token.shape[0]

    @property
    def max_ctx(self) -> int:
        return self.req_to_token.shape[1]

    def to(self, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.req_to_token.to(device), self.full_to_state.to(device)


def make_world(seed: int, slots: int = 48, max_ctx: int = 4096) -> World:
    gen = torch.Generator().manual_seed(seed)
    pages_per_slot = max_ctx // SWA_PAGE
    full_pages = slots * pages_per_slot + 1  # + dummy page 0
    perm = torch.randperm(full_pages - 1, generator=gen) + 1
    offsets = torch.arange(SWA_PAGE)
    r2t = (perm.view(slots, pages_per_slot)[:, :, None] * SWA_PAGE + offsets).reshape(slots, max_ctx)
    r2t = r2t.to(torch.int32)
    r2t[0] = 0
    f2s = torch.zeros(full_pages * SWA_PAGE + SWA_PAGE + 1, dtype=torch.int64)
    f2s[-1] = -1
    swa_pages = torch.randperm(full_pages - 1, generator=gen) + 1
    full_locs = (torch.arange(1, full_pages)[:, None] * SWA_PAGE + offsets).reshape(-1)
    f2s[full_locs] = (swa_pages[:, None] * SWA_PAGE + offsets).reshape(-1)
    return World(r2t, f2s)


_INTERESTING_PREFIXES = (0, 3, 4, 7, 8, 127, 128, 129, 251, 252, 255, 256, 257, 509, 511, 512, 1000, 1023, 1024)


def random_batch(
    rng: random.Random, world: World, batch: int, max_extend: int, *, unique_rids: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(req_pool_indices, seq_lens, extend_lens), int64 CPU; 1 <= extend <= seq <= max_ctx."""
    if unique_rids and batch < world.slots:
        rids = rng.sample(range(1, world.slots), batch)
    else:
        rids = [rng.randrange(1, world.slots) for _ in range(batch)]
    seqs, exts = [], []
    for _ in range(batch):
        e = rng.randint(1, max_extend)
        kind = rng.random()
        if kind < 0.3:
            prefix = 0
        elif kind < 0.6:
            prefix = rng.choice(_INTERESTING_PREFIXES)
        else:
            prefix = rng.randint(0, world.max_ctx - 1)
        prefix = max(0, min(prefix, world.max_ctx - e))
        seqs.append(prefix + e)
        exts.append(e)
    return torch.tensor(rids, dtype=torch.int64), torch.tensor(seqs, dtype=torch.int64), torch.tensor(exts)


def random_decode_batch(rng: random.Random, world: World, batch: int, pad_rows: int = 0):
    """Decode (req_pool_indices, seq_lens) plus CUDA-graph padding rows (rid 0, seq_len 1)."""
    rids = [rng.randrange(1, world.slots) for _ in range(batch)]
    seqs = [rng.choice([1, 2, 4, 5, 8, 9, 128, 129, 256, 257, rng.randint(1, world.max_ctx)]) for _ in range(batch)]
    rids += [0] * pad_rows
    seqs += [1] * pad_rows
    return torch.tensor(rids, dtype=torch.int64), torch.tensor(seqs, dtype=torch.int64)


_FIELDS16 = {
    "decode": ("seq_len", "write_loc", "read_page_0", "read_page_1"),
    "compress": ("seq_len", "ragged_id | buffer_len << 16", "read_page_0", "read_page_1"),
}


def assert_plan_bytes(actual: torch.Tensor, expected: torch.Tensor, what: str, kind: str = "compress") -> None:
    """Byte equality; on mismatch name the first differing row and word with both values."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    assert actual.dtype == torch.uint8 and expected.dtype == torch.uint8, f"{what}: dtypes {actual.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs expected {tuple(expected.shape)}"
    if torch.equal(actual, expected):
        return
    a, e = words(actual.contiguous()), words(expected.contiguous())
    row, col = (a != e).nonzero()[0].tolist()
    names = _FIELDS16.get(kind, ("ragged_id", "write_loc")) if actual.shape[1] == 16 else ("ragged_id", "write_loc")
    bad_rows = int((a != e).any(1).sum())
    raise AssertionError(
        f"{what}: {bad_rows} row(s) differ; first at row {row}, word {col} ({names[col]}): "
        f"got {bytes(actual[row].tolist()).hex()} expected {bytes(expected[row].tolist()).hex()}"
    )
