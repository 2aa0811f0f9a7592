"""Conventions every contract model follows.

- `WireModel`: exact schema (`extra="forbid"`), strict types (no bool-as-int, no str-as-int),
  frozen, snake_case attributes with the seeds' camelCase names as aliases. `to_wire()` dumps
  by alias and omits absent optional fields: the contracts use `field?: T`, never `T | null`,
  for what may be missing, so `None` in Python always means "absent on the wire".
- `PassThroughModel`: for documents the agent only reads and passes on (`IService`, cluster and
  node documents): the fields the agent needs are typed, everything else is kept verbatim, an
  explicit `null` included (it is a value the sender chose, not an absent optional).
- Parse wire data with `Model.from_wire(data)`: it accepts the camelCase names only. Python code
  may construct models by their snake_case names; the wire may not use them ("requests are exact").
- `SafeInt`: an integer JavaScript represents exactly (|n| <= 2^53 - 1).
- `PathSegmentId`: THE rule for ids that become path segments elsewhere (Corestore URL paths,
  directory names in the reference Corestore, SQLite keys): 1 to 256 characters, ASCII letters,
  digits and `.`, `_`, `:`, `-` only, starting with a letter or a digit. So never `.`, `..`, a
  `/` or `\\`, whitespace, control or non-ASCII characters. `path_segment_id_problem()` is its
  plain form (the Corestore routes and the reference server use it too).
- `StreamMarker`: the wire form of a VirtualStream inside a payload.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationError,
    model_serializer,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "MAX_PATH_SEGMENT_ID_LENGTH",
    "MAX_SAFE_INTEGER",
    "NonNegativeSafeInt",
    "PassThroughModel",
    "PathSegmentId",
    "SafeInt",
    "StreamMarker",
    "WireModel",
    "first_problem",
    "path_segment_id_problem",
]

MAX_SAFE_INTEGER = 2**53 - 1

SafeInt = Annotated[int, Strict(), Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
NonNegativeSafeInt = Annotated[int, Strict(), Field(ge=0, le=MAX_SAFE_INTEGER)]

MAX_PATH_SEGMENT_ID_LENGTH: Final = 256
# The first character excludes the dot so that `.` and `..` (and hidden names) cannot occur.
_PATH_SEGMENT_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def path_segment_id_problem(value: str) -> str | None:
    """Why `value` cannot be an id that becomes a path segment elsewhere, or None."""
    if not 0 < len(value) <= MAX_PATH_SEGMENT_ID_LENGTH:
        return f"must be 1 to {MAX_PATH_SEGMENT_ID_LENGTH} characters"
    if _PATH_SEGMENT_ID.fullmatch(value) is None:
        return (
            "must be ASCII letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
        )
    return None


def _check_path_segment_id(value: str) -> str:
    problem = path_segment_id_problem(value)
    if problem is not None:
        raise ValueError(problem)  # names the rule, never quotes the value
    return value


PathSegmentId = Annotated[str, AfterValidator(_check_path_segment_id)]


class WireModel(BaseModel):
    """An exact contract shape."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
        serialize_by_alias=True,
    )

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        """Validate wire data (camelCase names only); raises pydantic's ValidationError."""
        return cls.model_validate(data, by_alias=True, by_name=False)

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict as it goes on the wire (camelCase, absent fields omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class PassThroughModel(WireModel):
    """A tolerant document: unknown fields are kept and passed on unchanged."""

    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _keep_null_extras(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if info.exclude_none:
            for key, value in (self.model_extra or {}).items():
                if value is None:
                    data[key] = None
        return data


class StreamMarker(WireModel):
    """`{"_isVirtualStream": true, "streamId": "..."}`: a VirtualStream inside a payload."""

    is_virtual_stream: Literal[True] = Field(alias="_isVirtualStream")
    stream_id: str = Field(alias="streamId", min_length=1, max_length=256)


def first_problem(exc: ValidationError, *, root: str = "request") -> tuple[str, str]:
    """The first offending field path (dotted, as on the wire) and pydantic's reason for it.

    Schema-internal steps (`function-after[...]`, `is-instance[Secret]`) are dropped from the
    path: they name validators, not fields. The reason never quotes the input, which may hold a
    secret.
    """
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    if not errors:
        return root, "invalid"
    parts = [str(part) for part in errors[0]["loc"] if not _is_schema_step(part)]
    return ".".join(parts) or root, errors[0]["msg"]


def _is_schema_step(part: int | str) -> bool:
    return isinstance(part, str) and "[" in part and part.endswith("]")
