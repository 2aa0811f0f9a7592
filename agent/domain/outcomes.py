"""What a relay job ends with, and what a restore run will do, as typed values (pure).

Past the JSON edge (the store's columns, the wire response) a job's outcome is a `JobResult`:

- `Succeeded(response, report)`: the response Cloudly is answered with (its wire object, as the
  contract model dumped it) and the `JobReport` recorded and logged next to it;
- `JobFailed(code, message, retryable, data)`: the error Cloudly is answered with (`data`: the
  error's own wire facts, e.g. `run` of `restore-in-progress`).

A restore run's `RunPlan` is fixed when the run starts and kept with its row: its destructive
effects on the node, each under the idempotency key Corestore applies once
(`RestoreEffects`: the database's closure import, the archive restore of object storage and
volumes), and the outcome the run has once every effect is applied (`planned`). A resumed run
keeps its plan, so Corestore recognises what it already applied; a run found `running` after
the agent died is reconciled by its keys (docs/relay.md, "Jobs and repeats").

`to_json()`/`from_json()` are the one JSON form of each (the store writes nothing else);
`from_json` raises `InvalidState` for anything else.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeAlias, cast

from agent.errors import AgentError, InvalidState

__all__ = [
    "ClosureFacts",
    "JobFailed",
    "JobReport",
    "JobResult",
    "Json",
    "JsonObject",
    "RestoreEffects",
    "RunPlan",
    "Succeeded",
    "result_from_json",
]

Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"
JsonObject: TypeAlias = "dict[str, Json]"


def _object(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise InvalidState(f"{what} must be a JSON object")
    return value


def _json_object(value: object, what: str) -> JsonObject:
    """`value` as a JSON object (checked to the leaves: only JSON values)."""
    checked = _object(value, what)
    pending: list[object] = [checked]
    while pending:
        item = pending.pop()
        if isinstance(item, Mapping):
            if not all(isinstance(key, str) for key in item):
                raise InvalidState(f"{what} holds a key that is no string")
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif not (item is None or isinstance(item, bool | int | float | str)):
            raise InvalidState(f"{what} holds a value JSON cannot hold")
    return cast(JsonObject, dict(checked))  # checked above, to the leaves


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidState(f"{what} must be a string")
    return value


def _count(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidState(f"{what} must be a whole number >= 0")
    return value


@dataclass(frozen=True, slots=True)
class ClosureFacts:
    """The database closure that moved: its size and sha256."""

    size: int
    sha256: str

    def to_json(self) -> JsonObject:
        return {"size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, value: object) -> ClosureFacts:
        data = _object(value, "closure")
        return cls(_count(data.get("size"), "closure.size"), _text(data.get("sha256"), "sha256"))


@dataclass(frozen=True, slots=True)
class JobReport:
    """What the agent records and logs of a job besides its response (never a document or a
    byte of a closure): a backup's snapshot count and uncaptured resources, a restore's types
    and whether it was partial, the closure either moved."""

    snapshots: int | None = None
    uncaptured: tuple[JsonObject, ...] = ()
    resource_types: tuple[str, ...] | None = None
    partial: bool = False
    closure: ClosureFacts | None = None

    def with_closure(self, closure: ClosureFacts) -> JobReport:
        """This report with the closure that moved."""
        return replace(self, closure=closure)

    def to_json(self) -> JsonObject:
        """The stored form (camelCase keys; what is absent is left out)."""
        data: JsonObject = {}
        if self.snapshots is not None:
            data["snapshots"] = self.snapshots
            data["uncaptured"] = [dict(item) for item in self.uncaptured]
        if self.resource_types is not None:
            data["resourceTypes"] = list(self.resource_types)
        if self.partial:
            data["partial"] = True
        if self.closure is not None:
            data["closure"] = self.closure.to_json()
        return data

    def log_fields(self) -> dict[str, object]:
        """The report as log fields."""
        return dict(self.to_json())

    @classmethod
    def from_json(cls, value: object) -> JobReport:
        data = _object(value, "report")
        snapshots = data.get("snapshots")
        uncaptured = data.get("uncaptured", [])
        types = data.get("resourceTypes")
        closure = data.get("closure")
        if not isinstance(uncaptured, list):
            raise InvalidState("report.uncaptured must be a list")
        if types is not None and not (
            isinstance(types, list) and all(isinstance(t, str) for t in types)
        ):
            raise InvalidState("report.resourceTypes must be a list of strings")
        return cls(
            snapshots=None if snapshots is None else _count(snapshots, "report.snapshots"),
            uncaptured=tuple(_json_object(item, "report.uncaptured[]") for item in uncaptured),
            resource_types=None if types is None else tuple(types),
            partial=data.get("partial") is True,
            closure=None if closure is None else ClosureFacts.from_json(closure),
        )


@dataclass(frozen=True, slots=True)
class Succeeded:
    """A job that did its work: the response Cloudly gets, and its report."""

    response: JsonObject
    report: JobReport = field(default_factory=JobReport)

    def to_json(self) -> JsonObject:
        return {"response": dict(self.response), "report": self.report.to_json()}


@dataclass(frozen=True, slots=True)
class JobFailed:
    """A job that failed: the error Cloudly gets (its wire code, text, whether to retry, and
    the error's own facts that travel in `error.data` beside them)."""

    code: str
    message: str
    retryable: bool
    data: JsonObject = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, error: AgentError) -> JobFailed:
        """The record of `error`, its wire facts included (JSON: `InvalidState` otherwise)."""
        return cls(
            error.code, error.message, error.retryable, _json_object(error.data, "error.data")
        )

    def error(self) -> AgentError:
        """The error to answer with again: the same code, text, retryability and facts."""
        return _recorded_class(self.code, self.retryable)(self.message, **self.data)

    def to_json(self) -> JsonObject:
        error: JsonObject = {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.data:
            error["data"] = dict(self.data)
        return {"error": error}


JobResult: TypeAlias = "Succeeded | JobFailed"


def result_from_json(value: object) -> JobResult:
    """A stored outcome back: `{"response", "report"}` or `{"error": {code, message,
    retryable, data?}}` (a record without `data` is one whose error had no facts of its own)."""
    data = _object(value, "result")
    if "error" in data:
        error = _object(data["error"], "result.error")
        retryable = error.get("retryable")
        if not isinstance(retryable, bool):
            raise InvalidState("result.error.retryable must be a boolean")
        return JobFailed(
            _text(error.get("code"), "result.error.code"),
            _text(error.get("message"), "result.error.message"),
            retryable,
            _json_object(error.get("data", {}), "result.error.data"),
        )
    return Succeeded(
        _json_object(data.get("response"), "result.response"),
        JobReport.from_json(data.get("report", {})),
    )


@functools.cache
def _recorded_class(code: str, retryable: bool) -> type[AgentError]:
    """The error class of a recorded failure: the record's wire code and retryability."""
    return type("RecordedFailure", (AgentError,), {"code": code, "retryable": retryable})


@dataclass(frozen=True, slots=True)
class RestoreEffects:
    """A restore run's destructive effects on the node, each under its idempotency key (None:
    the run has no such effect): the closure import that replaces the database, the archive
    restore of object storage and volumes."""

    closure_import: str | None = None
    archive_restore: str | None = None

    def to_json(self) -> JsonObject:
        return {"closureImport": self.closure_import, "archiveRestore": self.archive_restore}

    @classmethod
    def from_json(cls, value: object) -> RestoreEffects:
        data = _object(value, "effects")
        keys = [data.get("closureImport"), data.get("archiveRestore")]
        if not all(key is None or isinstance(key, str) for key in keys):
            raise InvalidState("an effect's key must be a string or null")
        closure_import, archive_restore = keys
        return cls(closure_import, archive_restore)  # type: ignore[arg-type]  # checked above


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What a restore run does (its effects, their keys) and ends with once all are applied
    (`planned`: its response and report, without the closure's facts, which Corestore's
    committed import gives)."""

    effects: RestoreEffects
    planned: Succeeded

    def to_json(self) -> JsonObject:
        return {"effects": self.effects.to_json(), "planned": self.planned.to_json()}

    @classmethod
    def from_json(cls, value: object) -> RunPlan:
        data = _object(value, "plan")
        planned = result_from_json(data.get("planned"))
        if not isinstance(planned, Succeeded):
            raise InvalidState("a plan's outcome is a success")
        return cls(RestoreEffects.from_json(data.get("effects")), planned)
