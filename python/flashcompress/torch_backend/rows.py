"""Vectorised packing and unpacking of plan rows as torch tensors.

Plan tensors are ``uint8 [rows, 16]`` (or ``[rows, 8]`` for WritePlan).  These
helpers view them as little-endian int32 words so that every backend reads and
writes the fields of ``flashcompress.layouts`` without per-row Python.
"""

from __future__ import annotations

import torch

U32_MASK = 0xFFFFFFFF


def words(plan: torch.Tensor) -> torch.Tensor:
    """View a ``uint8 [rows, 4*k]`` plan as ``int32 [rows, k]`` words (host order = little-endian)."""
    return plan.view(torch.int32)


def u32(word: torch.Tensor) -> torch.Tensor:
    """An int32 word read as unsigned, widened to int64."""
    return word.to(torch.int64) & U32_MASK


def pack_words(*cols: torch.Tensor) -> torch.Tensor:
    """Stack int64 columns (values taken modulo 2**32) into a ``uint8 [rows, 4*len(cols)]`` plan."""
    stacked = torch.stack([c.to(torch.int64) & U32_MASK for c in cols], dim=1)
    # values in [2**31, 2**32) wrap to the negative int32 with the same bits
    stacked = torch.where(stacked >= 2**31, stacked - 2**32, stacked)
    return stacked.to(torch.int32).contiguous().view(torch.uint8)


def decode_fields(plan_d: torch.Tensor) -> dict[str, torch.Tensor]:
    """DecodePlan rows -> int64 columns seq_len, write_loc, read_page_0, read_page_1."""
    w = words(plan_d)
    return {
        "seq_len": u32(w[:, 0]),
        "write_loc": w[:, 1].to(torch.int64),
        "read_page_0": w[:, 2].to(torch.int64),
        "read_page_1": w[:, 3].to(torch.int64),
    }


def compress_fields(plan_c: torch.Tensor) -> dict[str, torch.Tensor]:
    """CompressPlan rows -> int64 columns (seq_len, ragged_id, buffer_len, pages, valid)."""
    w = words(plan_c)
    seq_len = u32(w[:, 0])
    packed = u32(w[:, 1])
    return {
        "seq_len": seq_len,
        "ragged_id": packed & 0xFFFF,
        "buffer_len": packed >> 16,
        "read_page_0": w[:, 2].to(torch.int64),
        "read_page_1": w[:, 3].to(torch.int64),
        "valid": seq_len != U32_MASK,
    }


def write_fields(plan_w: torch.Tensor) -> dict[str, torch.Tensor]:
    """WritePlan rows -> int64 columns ragged_id, write_loc, valid."""
    w = words(plan_w)
    ragged = u32(w[:, 0])
    return {
        "ragged_id": ragged,
        "write_loc": w[:, 1].to(torch.int64),
        "valid": ragged != U32_MASK,
    }


def pack_compress_rows(
    seq_len: torch.Tensor,
    ragged_id: torch.Tensor,
    buffer_len: torch.Tensor,
    read_page_0: torch.Tensor,
    read_page_1: torch.Tensor,
) -> torch.Tensor:
    """int64 columns -> ``uint8 [rows, 16]`` CompressPlan rows."""
    return pack_words(seq_len, ragged_id | (buffer_len << 16), read_page_0, read_page_1)


def pad_rows(rows: torch.Tensor, num_rows: int, sentinel: bytes) -> torch.Tensor:
    """Append sentinel rows until ``rows`` has ``num_rows`` rows."""
    missing = num_rows - rows.shape[0]
    if missing <= 0:
        return rows
    pad = torch.tensor(list(sentinel), dtype=torch.uint8, device=rows.device).expand(missing, -1)
    return torch.cat([rows, pad], dim=0).contiguous()


def store_targets(
    plan_rows: torch.Tensor, is_decode: bool, ratio: int, out_loc: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which plan rows are stored, where and at which RoPE position: ``(valid, dest, positions)``.

    Decode rows are stored iff ``seq_len % ratio == 0``, at ``out_loc[row]``;
    prefill rows iff valid, at ``out_loc[ragged_id]``.  Position = ``seq_len - ratio``.
    """
    if is_decode:
        seq_len = decode_fields(plan_rows)["seq_len"]
        valid = torch.remainder(seq_len, ratio) == 0
        dest = out_loc
    else:
        fields = compress_fields(plan_rows)
        seq_len, valid = fields["seq_len"], fields["valid"]
        dest = out_loc[torch.where(valid, fields["ragged_id"], 0)]
    return valid, dest, seq_len - ratio
