"""Loading the configuration file: `load_config(path)` turns every way a file can be wrong
(missing, not TOML, unknown key, wrong type, out of range) into one `ConfigError` naming the
dotted key (`cloudly.url`) and the reason, in words that never echo a string (it might be a
pasted secret). Relative paths in the file are resolved against the file's directory.
"""

from __future__ import annotations

import tomllib
from datetime import date, datetime, time
from pathlib import Path
from typing import Final

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from agent.config.fields import spoken_number
from agent.config.sections import Config
from agent.errors import ConfigError

__all__ = ["load_config"]

# Keys that were renamed: an old file fails naming the new key (they mean the same).
_RENAMED: Final = {"streams.keepalive_timeout_s": "streams.idle_timeout_s"}


def load_config(path: Path) -> Config:
    """Read and validate the TOML file at `path`; raise `ConfigError` naming what is wrong."""
    try:
        # A UTF-8 byte order mark (some Windows editors write one) is not TOML, but it is
        # no mistake of the content either: it is dropped, not refused.
        data = tomllib.loads(path.read_bytes().decode("utf-8").removeprefix("\ufeff"))
    except FileNotFoundError as exc:
        raise ConfigError("", f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ConfigError("", f"{path}: is a directory, not a file") from exc
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"{path}: is not UTF-8 text") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{path}: is not valid TOML ({exc})") from exc
    try:
        config = Config.model_validate(data, context={"base_dir": path.parent.absolute()})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A misspelt key is also a missing one; the unknown key is the cause worth naming.
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        key = _dotted_key(error["loc"])
        if error["type"] == "extra_forbidden" and key in _RENAMED:
            raise ConfigError(key, f"renamed to {_RENAMED[key]} (same meaning)") from None
        raise ConfigError(key, _reason(error)) from None
    _check_budget(config)
    return config


def _check_budget(config: Config) -> None:
    """The byte budget must hold what one transfer needs to move: a chunk frame as large as the
    session accepts (with its decoded bytes) and a few Corestore chunks."""
    budget = config.memory.budget_bytes
    frame, chunk = config.cloudly.max_frame_bytes, config.corestore.chunk_size
    if budget < 2 * frame or budget < 4 * chunk:
        raise ConfigError(
            "memory.budget_bytes",
            f"must be at least twice cloudly.max_frame_bytes ({2 * frame}) and four times "
            f"corestore.chunk_size ({4 * chunk})",
        )


def _dotted_key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else part)
    return key


_EXPECTED: Final = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "path_type": "a path (string)",
    "is_instance_of": "a path (string)",
    "model_type": "a table",
    "dict_type": "a table",
}
_BOUNDS: Final = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _reason(error: ErrorDetails) -> str:
    """One clause saying what is wrong, without echoing strings (they might be pasted secrets)."""
    kind = error["type"]
    value = error["input"]
    ctx = error.get("ctx", {})
    if kind == "missing":
        return (
            "required section is missing" if len(error["loc"]) == 1 else "required key is missing"
        )
    if kind == "extra_forbidden":
        return "unknown section" if isinstance(value, dict) else "unknown key"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_toml_type(value)}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        return f"must be {_BOUNDS[kind]} {spoken_number(bound)}, got {value}"
    if kind == "finite_number":
        return f"must be a finite number, got {value}"
    if kind == "literal_error":
        got = "" if isinstance(value, str) else f", got {_toml_type(value)}"
        return f"must be {ctx['expected']}{got}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"].replace("Input should be", "must be")


def _toml_type(value: object) -> str:
    names: list[tuple[type | tuple[type, ...], str]] = [
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (dict, "a table"),
        (list, "an array"),
        ((datetime, date, time), "a date/time"),
    ]
    return next((name for kind, name in names if isinstance(value, kind)), type(value).__name__)
