"""Loader for the golden vectors copied into ``tests/data/golden`` (see its README)."""

from __future__ import annotations

from pathlib import Path

import torch

GOLDEN_DIR = Path(__file__).parent / "data" / "golden"


def load_golden(relpath: str) -> dict:
    """``torch.load`` of ``tests/data/golden/<relpath>`` (a flat dict of tensors and scalars)."""
    return torch.load(GOLDEN_DIR / relpath, weights_only=True)


def load_golden_gz(relpath: str) -> dict:
    """``torch.load`` of a gzipped golden file ``tests/data/golden/<relpath>`` (the V4.1 vectors)."""
    import gzip
    import io

    return torch.load(io.BytesIO(gzip.decompress((GOLDEN_DIR / relpath).read_bytes())), weights_only=True)
