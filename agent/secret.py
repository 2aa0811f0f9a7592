"""`Secret`: a value that cannot be logged, printed, pickled or dumped by accident.

Grants, the machine token, JWTs and the Corestore control credential travel inside the agent as
`Secret`. Every way Python turns an object into text (`str`, `repr`, `format`, f-strings, pydantic
JSON dumps) yields `**********`; the value comes out only through `reveal()`, which is greppable
and used only where the value leaves the process for the party it is meant for.
"""

from __future__ import annotations

import hmac
from typing import Any, NoReturn, final

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["MASK", "Secret"]

MASK = "**********"


@final
class Secret:
    """An opaque secret string."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("a Secret wraps a str")
        self._value = value

    def reveal(self) -> str:
        """The secret itself. Call only where it is handed to the party it is meant for."""
        return self._value

    def __len__(self) -> int:
        return len(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return f"Secret('{MASK}')"

    def __str__(self) -> str:
        return MASK

    def __format__(self, format_spec: str) -> str:
        return format(MASK, format_spec)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    __hash__ = None  # type: ignore[assignment]  # equal secrets must not leak through hashing

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret cannot be pickled")

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secret:
        return self

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source_type: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """Validate from a `str` (or a `Secret`); every dump shows the mask."""
        from_str = core_schema.no_info_after_validator_function(cls, core_schema.str_schema())
        return core_schema.json_or_python_schema(
            json_schema=from_str,
            python_schema=core_schema.union_schema(
                [core_schema.is_instance_schema(cls), from_str],
            ),
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda _value: MASK, when_used="always"
            ),
        )
