"""Template rendering and source digests.

Templates (``templates/*.j2``) are rendered with Jinja2 ``StrictUndefined``
(a missing variable is an error before anything compiles), ``trim_blocks`` and
``lstrip_blocks`` (``{% ... %}`` lines leave no blank lines behind).  The
context is every parameter of the key plus ``module_name``, ``namespace``
(= ``module_name``), ``target_arch`` (``"90a"`` / ``"gfx942"``) and ``backend``.

Digests feed the cache key without rendering, so a cache hit never imports
Jinja2: ``template_digest`` hashes a family's template files and every template
they reference by a literal name (``{% include "x.j2" %}``, import, extends),
and ``tree_digest`` hashes every file under ``jit_kernel/``.  Both are computed
once per process.

In the source tree, ``templates/`` and ``jit_kernel/`` sit at the repository
root; installed, they are ``flashcompress/templates`` and ``flashcompress/jit_kernel``.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .family import Family
    from .variant import VariantKey

__all__ = [
    "kernel_include_dir",
    "render_context",
    "render_sources",
    "template_dir",
    "template_digest",
    "tree_digest",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _resource_dir(name: str) -> Path:
    installed = _PACKAGE_DIR / name
    if installed.is_dir():
        return installed
    source_tree = _PACKAGE_DIR.parent.parent / name
    if source_tree.is_dir():
        return source_tree
    raise FileNotFoundError(f"flashcompress resource directory {name!r} not found next to {_PACKAGE_DIR}")


@lru_cache(maxsize=None)
def template_dir() -> Path:
    """Directory of the Jinja2 templates."""
    return _resource_dir("templates")


@lru_cache(maxsize=None)
def kernel_include_dir() -> Path:
    """Directory of the shared kernel headers (``-I`` for every translation unit)."""
    return _resource_dir("jit_kernel")


_REFERENCE = re.compile(r"\{%-?\s*(?:include|import|extends|from)\s+([^\s%]+)")


def _referenced(text: str) -> tuple[list[str], bool]:
    """Literal template names referenced by ``text``; the flag is True when one is not literal."""
    names, dynamic = [], False
    for token in _REFERENCE.findall(text):
        if token[:1] in "\"'" and token[-1:] == token[:1]:
            names.append(token[1:-1])
        else:
            dynamic = True
    return names, dynamic


@lru_cache(maxsize=None)
def template_digest(sources: tuple[tuple[str, str], ...]) -> str:
    """sha256 over the family's templates and (transitively) every template they reference."""
    root = template_dir()
    pending = [template for template, _ in sources]
    seen: dict[str, bytes] = {}
    whole_dir = False
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = root / name
        data = path.read_bytes() if path.is_file() else b"<missing>"
        seen[name] = data
        refs, dynamic = _referenced(data.decode("utf-8", "replace"))
        whole_dir |= dynamic
        pending.extend(refs)
    if whole_dir:  # a computed include name: hash every template to stay safe
        for path in sorted(root.rglob("*")):
            if path.is_file():
                seen.setdefault(path.relative_to(root).as_posix(), path.read_bytes())
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + hashlib.sha256(seen[name]).digest())
    return digest.hexdigest()


@lru_cache(maxsize=None)
def tree_digest(root: Path | None = None) -> str:
    """sha256 over every file (relative path + content) under ``jit_kernel/``."""
    base = kernel_include_dir() if root is None else root
    digest = hashlib.sha256()
    for path in sorted(base.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            digest.update(path.relative_to(base).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def clear_digest_memo() -> None:
    """Forget memoised digests (tests that edit headers or templates)."""
    template_digest.cache_clear()
    tree_digest.cache_clear()


def render_context(key: "VariantKey") -> dict[str, Any]:
    """Template variables for ``key``."""
    from .variant import target_arch

    context: dict[str, Any] = dict(key.params)
    context.update(
        module_name=key.module_name,
        namespace=key.module_name,
        target_arch=target_arch(key.target),
        backend=key.backend,
    )
    return context


_ENVIRONMENT: Any = None


def _environment() -> Any:
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        import jinja2

        _ENVIRONMENT = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(template_dir())),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
            auto_reload=True,
        )
    return _ENVIRONMENT


def render_sources(key: "VariantKey", family: "Family") -> dict[str, str]:
    """Render every source of ``family`` for ``key``: rendered file name -> text."""
    env = _environment()
    context = render_context(key)
    rendered: dict[str, str] = {}
    for template, output in family.sources:
        header = f"// Generated by flashcompress from templates/{template} for {key.describe()}. Do not edit.\n"
        rendered[output] = header + env.get_template(template).render(**context)
    return rendered
