"""One shape for every registry of named parts (task families, report layouts, front ends, output
heads, attention kinds, trackers, bench sections, presets): register under a name once, look up by
name with a one-line error that names the choices, list the names.

A registry may be given a ``discover`` callable that imports the modules which register into it
(usually every family's modules of one name, through
:func:`headwise.families.import_family_modules`), so a part is found where it is written and no
shared file lists it. It runs once, before the first listing or the first lookup of a name not
registered yet: a name registered where the registry is made (a built-in part) is found without
importing every family, so checking a spec that uses only built-in parts stays light. A registry
of the model code names a ``discover_key`` instead, whose callable another module supplies
(:func:`supply_discovery`): the model code is carried into exported folders, which have no
families to discover, so it cannot name them itself.

This module imports only the standard library and :mod:`headwise.errors`: the exported model code
carries it beside the model modules that use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from headwise.errors import HeadwiseError

T = TypeVar("T")

#: discovery callables supplied from outside the registries that use them, by key (see the module docstring)
_SUPPLIED: dict[str, Callable[[], object]] = {}
#: the key of the model code's registries (front ends, output heads): :mod:`headwise.parts` supplies it
MODEL_CODE = "model code"


def supply_discovery(key: str, discover: Callable[[], object]) -> None:
    """Make ``discover`` the discovery of every registry made with ``discover_key=key``."""
    _SUPPLIED[key] = discover


class Registry(Generic[T]):
    """Named parts of one kind. ``what`` names the kind in messages ("attention kind")."""

    def __init__(self, what: str, discover: Callable[[], object] | None = None,
                 discover_key: str | None = None) -> None:
        self.what = what
        self._items: dict[str, T] = {}
        self._discover = discover
        self._key = discover_key
        self._discovering = False
        self._discovered = discover is None and discover_key is None

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, item: T) -> T: ...

    def register(self, name: str, item: T | None = None):
        """Register ``item`` under ``name`` (once: a second, different item is an error); returns
        it. Without ``item``, a decorator that registers what it decorates."""
        if item is None:
            return lambda thing: self.register(name, thing)
        old = self._items.get(name)
        if old is not None and old is not item:
            where = " and ".join(f"{getattr(x, '__module__', '?')}" for x in (old, item))
            raise HeadwiseError(f"{self.what} {name!r} is registered twice ({where})")
        self._items[name] = item
        return item

    def discover(self) -> None:
        """Run the registry's discovery, once (a listing, or a lookup of a name not registered
        yet, does this first)."""
        found = self._discover or _SUPPLIED.get(self._key or "")
        if self._discovered or self._discovering or found is None:  # none supplied (yet): nothing to do
            return
        self._discovering = True
        try:
            found()
            self._discovered = True
        finally:
            self._discovering = False

    def get(self, name: str) -> T:
        """The part registered as ``name``; an unknown name is a one-line :class:`HeadwiseError`
        naming the registered ones (and the closest, when one is close)."""
        if name not in self._items:
            self.discover()
        if name in self._items:
            return self._items[name]
        raise HeadwiseError(self.unknown(name))

    __getitem__ = get

    def unknown(self, name: object) -> str:
        """The one-line message for a name that is not registered."""
        names = self.names()
        hint = difflib.get_close_matches(str(name), names, n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"unknown {self.what} {name!r}{extra} (choices: {', '.join(names) or 'none registered'})"

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self.discover()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """(name, part) for every registered part, sorted by name."""
        self.discover()
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self.discover()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self.discover()
        return len(self._items)
