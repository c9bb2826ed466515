"""Template rendering and source digests.

Templates (``templates/*.j2``) are rendered with Jinja2 ``StrictUndefined``
(a missing variable is an error before anything compiles), ``trim_blocks`` and
``lstrip_blocks`` (``{% ... %}`` lines leave no blank lines behind).  The
context is every parameter of the key plus ``module_name``, ``namespace``
(= ``module_name``), ``target_arch`` (``"90a"`` / ``"gfx942"``) and ``backend``.

Digests feed the cache key without rendering, so a cache hit never imports
Jinja2: ``template_digest`` hashes a family's template files and every template
they reference by a literal name (``{% include "x.j2" %}``, import, extends),
and ``headers_digest`` hashes the headers under ``jit_kernel/`` that those
templates include, transitively (``header_closure``: the static ``#include``
lines of the templates, then of each header found).  Anything the scanner
cannot follow (a computed ``#include MACRO``, a Jinja expression in an include
line, a quoted include that resolves nowhere, ``-include`` in the family's
flags) makes it hash every file under ``jit_kernel/`` instead (``tree_digest``).
All are computed once per process.

In the source tree, ``templates/`` and ``jit_kernel/`` sit at the repository
root; installed, they are ``flashcompress/templates`` and ``flashcompress/jit_kernel``.
"""

from __future__ import annotations

import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .family import Family
    from .variant import VariantKey

__all__ = [
    "header_closure",
    "headers_digest",
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


def _template_closure(sources: tuple[tuple[str, str], ...]) -> dict[str, bytes]:
    """The family's templates and every template they reference (all templates when a name is computed)."""
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
    return seen


@lru_cache(maxsize=None)
def template_digest(sources: tuple[tuple[str, str], ...]) -> str:
    """sha256 over the family's templates and (transitively) every template they reference."""
    seen = _template_closure(sources)
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


# One `#include` line: the operand is "name", <name>, or anything else (computed: a macro).
_INCLUDE_LINE = re.compile(rb"[ \t]*#[ \t]*include(?:_next)?\b[ \t]*(.*?)[ \t]*(?://.*|/\*.*)?\r?")
_QUOTED = re.compile(rb'"([^"\n]+)"')
_ANGLED = re.compile(rb"<([^>\n]+)>")
# Flags that pull a header in without an #include line.
_FORCED_INCLUDE_FLAGS = ("-include", "--pre-include", "-imacros", "--include")


def _include_operands(text: bytes) -> list[bytes]:
    """The operand of every ``#include`` line (found with ``bytes.find``: a regex over every line
    of 70 kB of headers would cost a quarter of a millisecond on each first load)."""
    operands = []
    pos = text.find(b"include")
    while pos != -1:
        start = text.rfind(b"\n", 0, pos) + 1
        end = text.find(b"\n", pos)
        end = len(text) if end == -1 else end
        match = _INCLUDE_LINE.fullmatch(text, start, end)
        if match:
            operands.append(match.group(1))
        pos = text.find(b"include", end)
    return operands


def _includes(text: bytes) -> list[tuple[str, str]]:
    """``(kind, name)`` for every ``#include`` line: kind ``quoted``, ``angled`` or ``computed``."""
    found: list[tuple[str, str]] = []
    for operand in _include_operands(text):
        if b"{{" in operand or b"{%" in operand:  # a Jinja expression: the name is only known after rendering
            found.append(("computed", operand.decode("utf-8", "replace")))
            continue
        quoted = _QUOTED.fullmatch(operand)
        angled = _ANGLED.fullmatch(operand)
        if quoted:
            found.append(("quoted", quoted.group(1).decode("utf-8", "replace")))
        elif angled:
            found.append(("angled", angled.group(1).decode("utf-8", "replace")))
        else:
            found.append(("computed", operand.decode("utf-8", "replace")))
    return found


def _scan_closure(sources: tuple[tuple[str, str], ...], flags: tuple[str, ...],
                  base: Path) -> tuple[dict[str, bytes] | None, str]:
    """``({relative path: content}, "")`` of the headers the sources include, or ``(None, reason)``."""
    for flag in flags:
        if flag.startswith(_FORCED_INCLUDE_FLAGS):
            return None, f"flag {flag!r} includes a file without an #include line"
    root = os.path.abspath(base)
    prefix = root + os.sep
    rendered = {output for _, output in sources}
    pending: list[tuple[str | None, str, str, str]] = []  # (including header's dir, kind, name, from)
    for template, text in _template_closure(sources).items():
        for kind, name in _includes(text):
            pending.append((None, kind, name, f"templates/{template}"))
    closure: dict[str, bytes] = {}
    while pending:
        directory, kind, name, origin = pending.pop()
        if kind == "computed":
            return None, f"{origin}: computed #include {name}"
        if kind == "quoted" and directory is None and name in rendered:
            continue  # another rendered source of this family: hashed with the templates
        candidates = [os.path.join(directory, name)] if kind == "quoted" and directory is not None else []
        candidates.append(os.path.join(root, name))
        found = next((c for c in candidates if os.path.isfile(c)), None)
        if found is None:
            if kind == "angled":
                continue  # system / toolkit / tvm-ffi header
            return None, f'{origin}: #include "{name}" resolves nowhere under {base}'
        found = os.path.normpath(found)  # lexical: a symlink inside jit_kernel/ is hashed by content
        if not found.startswith(prefix):
            if kind == "angled":
                continue
            return None, f'{origin}: #include "{name}" resolves outside {base}'
        rel = found[len(prefix):].replace(os.sep, "/")
        if rel in closure:
            continue
        with open(found, "rb") as f:
            closure[rel] = data = f.read()
        for sub_kind, sub_name in _includes(data):
            pending.append((os.path.dirname(found), sub_kind, sub_name, f"jit_kernel/{rel}"))
    return closure, ""


@lru_cache(maxsize=None)
def _closure(sources: tuple[tuple[str, str], ...], flags: tuple[str, ...],
             root: Path | None) -> tuple[dict[str, bytes] | None, str]:
    return _scan_closure(sources, flags, kernel_include_dir() if root is None else root)


def header_closure(sources: tuple[tuple[str, str], ...], flags: tuple[str, ...] = (),
                   root: Path | None = None) -> tuple[tuple[str, ...] | None, str]:
    """The headers under ``jit_kernel/`` (relative paths, sorted) that a family's sources include.

    Starts from the static ``#include`` lines of the family's templates (and the
    templates they reference) and follows, recursively, every include that resolves
    inside ``jit_kernel/``: quoted names relative to the including header's
    directory, then to ``jit_kernel/`` (``-I``); angled names relative to
    ``jit_kernel/``.  A quoted name of another rendered source (``"config.h"``) is
    covered by the template digest.  Angled names found nowhere are system, toolkit
    or tvm-ffi headers (their versions are hashed separately).  Lines inside
    comments or ``#if`` branches count too (harmless over-inclusion).

    Returns ``(paths, "")``, or ``(None, reason)`` when the closure cannot be known
    statically (a computed include, a quoted name that resolves nowhere or outside
    ``jit_kernel/``, a forced-include flag): then every file counts.
    """
    closure, reason = _closure(sources, tuple(flags), root)
    return (None, reason) if closure is None else (tuple(sorted(closure)), "")


@lru_cache(maxsize=None)
def headers_digest(sources: tuple[tuple[str, str], ...], flags: tuple[str, ...] = (),
                   root: Path | None = None) -> str:
    """sha256 over the ``header_closure`` of a family (path + content), else over the whole tree."""
    closure, _ = _closure(sources, tuple(flags), root)
    if closure is None:
        return "tree:" + tree_digest(kernel_include_dir() if root is None else root)
    digest = hashlib.sha256()
    for rel in sorted(closure):
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256(closure[rel]).digest())
    return "closure:" + digest.hexdigest()


def clear_digest_memo() -> None:
    """Forget memoised digests (tests that edit headers or templates)."""
    template_digest.cache_clear()
    tree_digest.cache_clear()
    _closure.cache_clear()
    headers_digest.cache_clear()


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
