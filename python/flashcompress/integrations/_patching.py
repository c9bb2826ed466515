"""Reversible rebinding of names in an engine's imported modules (standard library only).

A framework binds an op into many namespaces: the package that exports it and
every module that ran ``from package import op``.  Replacing the op means
rebinding each of those names; reverting means putting the original object
back everywhere, including in modules imported while the replacement was
active (they bound the replacement).  Modules are found by object identity,
so aliases (``import op as other``) are covered too.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator, Mapping


@dataclass(frozen=True)
class Binding:
    """One rebound name: ``owner.name`` was ``original`` and becomes ``replacement``."""

    owner: object  # a module or a class
    name: str
    original: object
    replacement: object

    @property
    def where(self) -> str:
        """``module.name`` (or ``module.Class.name``) for messages and docs."""
        owner = self.owner
        if isinstance(owner, ModuleType):
            return f"{owner.__name__}.{self.name}"
        return f"{owner.__module__}.{owner.__qualname__}.{self.name}"  # type: ignore[attr-defined]


def engine_modules(prefix: str) -> Iterator[ModuleType]:
    """The imported modules of package ``prefix`` (the package itself included)."""
    for name, module in list(sys.modules.items()):
        if isinstance(module, ModuleType) and (name == prefix or name.startswith(prefix + ".")):
            yield module


def find_bindings(prefix: str, replacements: Mapping[int, tuple[object, object]]) -> list[Binding]:
    """Every module-level name under ``prefix`` bound to an original object.

    ``replacements`` maps ``id(original) -> (original, replacement)``.
    """
    found = []
    for module in engine_modules(prefix):
        for name, value in list(vars(module).items()):
            pair = replacements.get(id(value))
            if pair is not None and value is pair[0]:
                found.append(Binding(module, name, pair[0], pair[1]))
    return found


def rebind(prefix: str, bindings: list[Binding]) -> "Handle":
    """Set every binding's replacement; the returned handle undoes it."""
    for b in bindings:
        setattr(b.owner, b.name, b.replacement)
    return Handle(prefix, bindings)


class Handle:
    """What an ``apply()`` changed.  ``revert()`` (or leaving the ``with`` block) undoes it."""

    def __init__(self, prefix: str, bindings: list[Binding]) -> None:
        self._prefix = prefix
        self._bindings = tuple(bindings)
        self._active = True

    @property
    def bindings(self) -> tuple[Binding, ...]:
        """The names rebound when the handle was made, in patch order."""
        return self._bindings

    @property
    def active(self) -> bool:
        """True until ``revert()``."""
        return self._active

    def revert(self) -> None:
        """Restore every original object (a second call does nothing).

        Names bound while the handle was active (a module imported after
        ``apply()`` took the replacement) are restored too.
        """
        if not self._active:
            return
        for b in reversed(self._bindings):
            setattr(b.owner, b.name, b.original)
        back = {id(b.replacement): (b.replacement, b.original) for b in self._bindings}
        for late in find_bindings(self._prefix, back):
            setattr(late.owner, late.name, late.replacement)  # here: the original
        self._active = False

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        state = "active" if self._active else "reverted"
        return f"<flashcompress integration handle ({state}): {len(self._bindings)} names under {self._prefix}>"
