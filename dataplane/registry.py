"""The one registry idiom of the variation points (policy losses, tasks, broadcast strategies, the fault suite):
a name -> entry mapping filled by class decorators, with one way to refuse a name taken twice, one way to say which
names exist when a lookup fails, and one way to import every module of a folder so that a new variant is its file
alone (docs/architecture.md "How to extend").

A :class:`Registry` is a ``dict``: code and tests read it as one (``dict(TASKS)``, ``monkeypatch.setitem``), and
tests iterate it instead of naming its contents, so adding a variant breaks no unrelated test."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Iterable
from typing import TypeVar

T = TypeVar("T")


class Registry(dict[str, T]):
    """Entries of one ``kind`` (``"policy loss"``, ``"task"``, ...) by name, in registration order."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def add(self, name: str, entry: T, *, same: object = None) -> T:
        """Register ``entry`` under ``name``; ValueError for an empty name or one already taken (``same``: what
        counts as the registered entry again, e.g. its class, so that re-importing a module is no error)."""
        if not name:
            raise ValueError(f"{self.kind} {entry!r} has no name")
        if name in self and (same is None or _identity(self[name]) is not same):
            raise ValueError(f"{self.kind} {name!r} is already registered ({_identity(self[name]).__name__})")
        self[name] = entry
        return entry

    def lookup(self, name: str) -> T:
        """The entry registered as ``name``; ValueError naming the registered ones otherwise."""
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; one of {', '.join(self)}") from None


def _identity(entry: object) -> type:
    return entry if isinstance(entry, type) else type(entry)


def import_modules(package: str, path: Iterable[str], *, shared: Collection[str] = ()) -> None:
    """Import every module of the folder ``path`` of ``package`` but the ``shared`` ones (which hold no variant):
    each variant registers itself when imported. Sorted by name, so registration order is the same everywhere."""
    for name in sorted(m.name for m in pkgutil.iter_modules(path)):
        if name not in shared:
            importlib.import_module(f"{package}.{name}")
