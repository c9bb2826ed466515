"""Pack the V4.1 golden vectors (one ``.pt`` per op / case / layout) into one gzipped file per case.

Usage: ``python scripts/pack_v41_golden.py SRC_DIR tests/data/golden/v41``

The layouts of a case share their inputs, latent and ring state bit for bit
(the generator checks ``cross_layout_identical``), so a packed case keeps them
once and the cache per layout as ``cache_after[<LAYOUT>]``.  Fields describing
the generator's environment are dropped; every tensor is kept as recorded.
"""

from __future__ import annotations

import gzip
import io
import sys
from collections import defaultdict
from pathlib import Path

import torch

_DROP = {"schema", "file", "layout", "layout_enum", "module", "module_sha256", "kernel", "source", "dry_run",
         "cache_after", "checks"}


def pack(src: Path, dst: Path) -> None:
    cases: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(src.glob("*.pt")):
        record = torch.load(path, weights_only=True)
        cases[record.get("case_tag", path.stem)].append(record)
    dst.mkdir(parents=True, exist_ok=True)
    for tag, records in cases.items():
        packed = {k: v for k, v in records[0].items() if k not in _DROP}
        if "cache_after" in records[0]:
            packed["cache_after"] = {r["layout"]: r["cache_after"] for r in records}
        buf = io.BytesIO()
        torch.save(packed, buf)
        (dst / f"{tag}.pt.gz").write_bytes(gzip.compress(buf.getvalue(), 9, mtime=0))


if __name__ == "__main__":
    pack(Path(sys.argv[1]), Path(sys.argv[2]))
