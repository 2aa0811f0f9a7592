"""`Fields`: one JSON object of the status document, read leniently (pure).

The status document is written by another process, possibly an older or a newer agent: a field
missing, or of another type than the reader asks for, reads as None (an object that is not one
reads as empty), and a field the reader does not ask for is ignored. Nothing here raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

__all__ = ["Fields", "Wire"]

Wire: TypeAlias = dict[str, object]
"""One JSON object as the endpoint serves it."""


class Fields:
    """The fields of one JSON object (anything else reads as an empty object)."""

    __slots__ = ("_data",)

    def __init__(self, data: object) -> None:
        self._data: Mapping[object, object] = data if isinstance(data, Mapping) else {}

    @classmethod
    def of(cls, value: object) -> Fields | None:
        """`value`'s fields when it is an object, else None."""
        return cls(value) if isinstance(value, Mapping) else None

    def has(self, key: str) -> bool:
        """Whether the object names `key` at all (its value may be null)."""
        return key in self._data

    def text(self, key: str) -> str | None:
        """A string, else None."""
        value = self._data.get(key)
        return value if isinstance(value, str) else None

    def whole(self, key: str) -> int | None:
        """An integer (a JSON `true` is not one), else None."""
        value = self._data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def number(self, key: str) -> float | None:
        """An integer or a fraction (kept as it came), else None."""
        value = self._data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return value

    def flag(self, key: str) -> bool | None:
        """`true` or `false`, else None."""
        value = self._data.get(key)
        return value if isinstance(value, bool) else None

    def texts(self, key: str) -> tuple[str, ...] | None:
        """A list's strings (anything else in it is left out); None when it is no list."""
        value = self._data.get(key)
        if not isinstance(value, list):
            return None
        return tuple(item for item in value if isinstance(item, str))

    def record(self, key: str) -> Fields | None:
        """A nested object, None when it is none (missing, null or another type)."""
        return Fields.of(self._data.get(key))

    def records(self, key: str) -> list[Fields]:
        """The objects of a list (anything else in it is left out; no list reads as empty)."""
        value = self._data.get(key)
        items = value if isinstance(value, list) else []
        return [Fields(item) for item in items if isinstance(item, Mapping)]

    def entries(self) -> list[tuple[str, object]]:
        """Every field with a string name, with its value as it came, in the order written."""
        return [(key, value) for key, value in self._data.items() if isinstance(key, str)]
