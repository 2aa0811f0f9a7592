"""The value types the configuration's sections share: paths resolved against the file's
directory (or naming a systemd credential), bounded durations, and the checks more than one
section makes (a Cloudly URL that would go out in cleartext, a value JSON can carry); and
`part_default`, how a section reads a default its part writes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "CREDENTIALS_PREFIX",
    "CREDENTIALS_VARIABLE",
    "FilePath",
    "KiB",
    "MiB",
    "NonNegativeSeconds",
    "PollSeconds",
    "Seconds",
    "is_cleartext_remote",
    "part_default",
    "require_json_value",
    "spoken_number",
]

KiB: Final = 1024
MiB: Final = 1024 * KiB

# Durations above one day are typos, not intentions.
_MAX_SECONDS: Final = 86_400.0

_CLEARTEXT_SCHEMES: Final = frozenset({"http", "ws"})

# A secret file named `${CREDENTIALS_DIRECTORY}/NAME` is the systemd credential NAME.
CREDENTIALS_VARIABLE: Final = "CREDENTIALS_DIRECTORY"
CREDENTIALS_PREFIX: Final = "${" + CREDENTIALS_VARIABLE + "}"

_T = TypeVar("_T")


def part_default(settings: type[DataclassInstance], name: str, kind: type[_T]) -> _T:
    """The default the settings dataclass `settings` gives its field `name`: a knob's default
    is written once, by the part it tunes, and the section that configures it reads it here."""
    (found,) = (field for field in dataclasses.fields(settings) if field.name == name)
    factory = found.default_factory
    value = found.default if factory is dataclasses.MISSING else factory()
    if not isinstance(value, kind):
        raise TypeError(f"{settings.__name__}.{name} has no default of type {kind.__name__}")
    return value


def _refuse_empty_path(value: object) -> object:
    # Path("") is Path("."): refuse it before it silently means "this directory".
    if value == "":
        raise ValueError("must not be empty")
    return value


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    if value.parts and value.parts[0] == CREDENTIALS_PREFIX:
        if len(value.parts) != 2 or value.parts[1] in (".", ".."):
            raise ValueError(f"must be {CREDENTIALS_PREFIX}/NAME, one credential name")
        return value  # resolved when the secret is read (`credential_path`)
    if "${" in str(value):
        raise ValueError(f"may name no variable but {CREDENTIALS_PREFIX}, as its first part")
    base = info.context.get("base_dir") if isinstance(info.context, dict) else None
    if not value.is_absolute() and isinstance(base, Path):
        return base / value
    return value


# Paths come from TOML strings, which strict mode would refuse for `Path`.
FilePath = Annotated[
    Path,
    Field(strict=False),
    BeforeValidator(_refuse_empty_path),
    AfterValidator(_resolve_path),
]
Seconds = Annotated[float, Field(gt=0, le=_MAX_SECONDS, allow_inf_nan=False)]
# Polling Corestore more often than 100 times a second only loads it; less often than once a
# minute only delays every resource restore.
PollSeconds = Annotated[float, Field(ge=0.01, le=60.0, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, Field(ge=0, le=_MAX_SECONDS, allow_inf_nan=False)]


def is_cleartext_remote(url: str) -> bool:
    """An http:// or ws:// URL whose host is not loopback (`localhost`, 127.0.0.0/8, ::1)."""
    parts = urlsplit(url)
    if parts.scheme not in _CLEARTEXT_SCHEMES:
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: where it resolves to is not ours to trust


def require_json_value(value: Any, where: str) -> None:
    """Refuse what TOML can say but JSON cannot carry (dates and times, inf, nan)."""
    at = f" at {where}" if where else ""
    if isinstance(value, datetime | date | time):
        # pydantic turns only ValueError into a validation error.
        raise ValueError(f"holds a TOML date/time{at}, which JSON cannot carry")  # noqa: TRY004
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"holds {value}{at}, which JSON cannot carry")
    if isinstance(value, Mapping):
        for key, item in value.items():
            require_json_value(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            require_json_value(item, f"{where}[{index}]")


def spoken_number(value: object) -> object:
    """`60` rather than `60.0` for a whole float bound."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
