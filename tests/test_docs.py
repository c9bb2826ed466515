"""The user docs under ``docs/`` are true.

* Every fenced ```python block directly preceded by a ``<!-- test -->`` line runs (CPU).
  The runnable blocks of one file share a namespace, in order, so a later block may use
  what an earlier one defined (the guide's worked step uses its ``freq_cis`` builder).
* Every ``FLASHCOMPRESS_*`` name in ``docs/`` is a setting of the generated settings table
  (``flashcompress.jit.settings``), as the README's table is tested in ``test_cli.py``.
* The guide's RoPE table builder equals the float64 model's table, and every relative
  link in ``docs/`` points at an existing file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))

_BLOCK_RE = re.compile(r"^<!-- test -->[ \t]*\n```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def runnable_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each runnable block of ``path``."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK_RE.finditer(text)]


def run_doc(path: Path) -> dict:
    ns: dict = {"__name__": f"docs.{path.stem}"}
    for line, code in runnable_blocks(path):
        try:
            exec(compile(code, f"{path.relative_to(REPO)}:{line}", "exec"), ns)
        except Exception as exc:  # name the block in the failure
            raise AssertionError(f"runnable block at {path.relative_to(REPO)} line {line} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    return ns


def test_docs_exist() -> None:
    names = {p.name for p in DOC_FILES}
    assert {"engine-guide.md", "layouts.md"} <= names, names
    assert runnable_blocks(DOCS / "engine-guide.md"), "the guide has no runnable block"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_runnable_blocks(path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 4))
    try:
        run_doc(path)
    finally:
        torch.set_num_threads(threads)


def test_every_test_marker_precedes_a_python_block() -> None:
    for path in DOC_FILES:
        text = path.read_text()
        assert text.count("<!-- test -->") == len(runnable_blocks(path)), (
            f"{path.name}: a <!-- test --> marker is not directly followed by a ```python block")


def test_settings_named_in_docs_exist() -> None:
    from flashcompress.jit import settings

    known = {s.env for s in settings.SCHEMA} | {settings.CONFIG_ENV}
    table = settings.markdown_table()
    assert all(f"`{name}`" in table for name in known)
    for path in DOC_FILES:
        named = set(re.findall(r"FLASHCOMPRESS_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
        unknown = sorted(named - known)
        assert not unknown, f"{path.name} names settings that do not exist: {unknown}"


def test_guide_freq_cis_matches_the_model() -> None:
    try:
        from flashcompress.testing import oracle
    except ImportError:
        from flashcompress import oracle  # type: ignore[no-redef]
    ns = run_doc(DOCS / "engine-guide.md")
    assert torch.equal(ns["deepseek_v4_freq_cis"](3000), oracle.deepseek_v4_freq_cis(3000))


def test_relative_links_resolve() -> None:
    for path in DOC_FILES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"
        assert "shared/" not in path.read_text(), f"{path.name} refers to material outside the repo"


def test_guide_page_count_formula_is_the_helpers() -> None:
    """§4 states one page-count formula; the runnable ``cache_pages`` helper computes that formula,
    and its caches hold the entry of every full-KV location, the padding page's included."""
    import math

    text = (DOCS / "engine-guide.md").read_text()
    assert "pages = ceil((full_size + 256) / r / P)" in text
    ns = run_doc(DOCS / "engine-guide.md")
    for full_size in (1024, 4096, 65536, 3 * 256):
        for ratio, page in ((4, 64), (128, 2), (4, 1)):
            pages = ns["cache_pages"](full_size, ratio, page)
            assert pages == math.ceil((full_size + 256) / ratio / page)
            last_slot = (full_size + 256 - 1) // ratio  # out_loc of the last location's window
            assert last_slot // page == pages - 1


def test_guide_works_every_layer_kind() -> None:
    """Worked examples for C4, C128 and online C128 (second chunk, MTP bank) exist and run."""
    text = (DOCS / "engine-guide.md").read_text()
    for heading in ("### 8.1 C4", "### 8.2 C128", "### 8.3 Online C128"):
        assert heading in text
    ns = run_doc(DOCS / "engine-guide.md")
    assert ns["cache128"].any() and ns["cache_on"].any()  # both stored entries
    assert ns["online"].shape == (10, 1536) and ns["logical"] == 5
