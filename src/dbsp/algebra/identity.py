"""A cache keyed by the identity of an immutable object (a ``pa.Schema``), in front of one keyed
by its value: hashing a schema wraps and hashes every field (some 15-30K instructions), where an
operator passes the same schema object step after step. The object is kept with its value, so
its id is not reused while the entry lives."""
from __future__ import annotations

from typing import Any, Hashable


class IdentityCache:
    """``obj`` (plus a hashable ``extra``) -> value, by ``id(obj)``; cleared when full."""

    __slots__ = ("_d", "_cap")

    def __init__(self, cap: int = 4096):
        self._d: dict = {}
        self._cap = cap

    def get(self, obj: Any, extra: Hashable = None) -> Any:
        """The value kept for this very object (and ``extra``), else None."""
        got = self._d.get((id(obj), extra))
        return got[1] if got is not None and got[0] is obj else None

    def put(self, obj: Any, value: Any, extra: Hashable = None) -> Any:
        """Keep ``value`` for ``obj`` (and ``extra``); returns it."""
        if len(self._d) >= self._cap:
            self._d.clear()
        self._d[(id(obj), extra)] = (obj, value)
        return value
