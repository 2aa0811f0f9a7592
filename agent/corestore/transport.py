"""The HTTP edge of the Corestore client: one aiohttp session, timeouts, safe retries.

`HttpTransport.send(request, credential)` sends one `RouteRequest` with the bearer it is given
(the client asks its node's credential per call; the transport holds none) and returns its
`Reply`, mapping every
transport failure (connection refused or reset, timeout) and every 5xx/408/429 answer to
`CorestoreUnavailable` (chained from the aiohttp or timeout error). It resends only requests
whose route is idempotent, while Corestore is unavailable, by the agent's one retry policy
(`agent.retry.retrying`: full-jitter exponential backoff, waits on the injected `Clock`, draws
from the injected `rng`). This is the only place a Corestore call is resent for availability:
the engine above it never wraps a call in a second loop (the client's one resend after a
refused credential is not for availability). What a 2xx or 4xx answer means is the client's
business (`client.py`).

Frames that raise hold no revealed secret and no raw answer text as a local variable, because
traceback renderers that show locals (structlog's default) would print them: the headers are
built inside the call that hands them to aiohttp, answer bodies travel in `Reply` (whose repr
leaves the body out), and aiohttp's exceptions lose their tracebacks (their frames hold the
request headers) before they are chained. aiohttp itself logs no header (its access log is a
server-side feature; the client logs none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from yarl import URL

from agent.clock import Clock
from agent.corestore import routes
from agent.corestore.routes import AnswerKind, RouteRequest
from agent.corestore.sanitize import sanitize_code, sanitize_text
from agent.errors import (
    CorestoreFull,
    CorestoreRefused,
    CorestoreUnavailable,
    InvalidState,
    LocalProtocolError,
    NodeWithoutCorestore,
    ShuttingDown,
)
from agent.observe import NULL_OBSERVER, CorestoreObserver
from agent.retry import RetryPolicy, retrying
from agent.secret import Secret

if TYPE_CHECKING:
    from agent.config import CorestoreConfig

__all__ = ["CorestoreTimeouts", "HttpTransport", "Reply", "check_credential"]


@dataclass(frozen=True, slots=True)
class CorestoreTimeouts:
    """Seconds. `control` bounds one attempt of a small call; `transfer` one that moves or hashes
    bulk bytes (chunk PUT, commit, verification)."""

    connect: float = 5.0
    control: float = 30.0
    transfer: float = 300.0

    def __post_init__(self) -> None:
        for name in ("connect", "control", "transfer"):
            if not getattr(self, name) > 0:
                raise InvalidState(f"{name} must be positive")

    @classmethod
    def from_config(cls, corestore: CorestoreConfig) -> CorestoreTimeouts:
        """The timeouts `[corestore]` asks for (`connect_timeout_s`, `request_timeout_s`,
        `transfer_timeout_s`)."""
        return cls(
            connect=corestore.connect_timeout_s,
            control=corestore.request_timeout_s,
            transfer=corestore.transfer_timeout_s,
        )


def _canonical_origin(endpoint: str) -> URL:
    try:
        url = URL(endpoint)
    except ValueError as exc:
        raise NodeWithoutCorestore("the corestore endpoint is not a parsable URL") from exc
    if (
        url.scheme not in ("http", "https")
        or not url.host
        or url.user is not None
        or url.password is not None
        or url.raw_path not in ("", "/")
        or url.query_string
        or url.fragment
    ):
        raise NodeWithoutCorestore("the corestore endpoint is not a canonical http(s) origin")
    return url.with_path("/")


def check_credential(credential: Secret) -> Secret:
    """`credential` if it can be sent as a bearer header value; LocalProtocolError if not."""
    value = credential.reveal()
    if not value or not value.isascii() or not value.isprintable() or " " in value:
        raise LocalProtocolError("the corestore control credential is not a header-safe token")
    return credential


def _scrub(exc: BaseException) -> BaseException:
    """`exc` with its tracebacks (and those of its causes) dropped: aiohttp's frames hold the
    request headers as local variables, which a traceback renderer showing locals would print."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]
    return exc


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer. The body is foreign text (it may echo anything): kept out of `repr`."""

    status: int
    body: bytes = field(repr=False)

    def error_code(self) -> str | None:
        """Corestore's error code, unsanitised (compare it, never print it)."""
        error = routes.parse_error(self.body)
        return error[0] if error else None


class HttpTransport:
    """One node's Corestore over one aiohttp session (created on first use, in the loop)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeouts: CorestoreTimeouts,
        retry: RetryPolicy,
        clock: Clock,
        rng: Callable[[], float],
        observer: CorestoreObserver = NULL_OBSERVER,
    ) -> None:
        self._origin = _canonical_origin(endpoint)
        self._observer = observer
        self._endpoint = endpoint
        self._timeouts = timeouts
        self._retry = retry
        self._clock = clock
        self._rng = rng
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def close(self) -> None:
        """Close the session; later sends raise `ShuttingDown`."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, request: RouteRequest, credential: Secret | None) -> Reply:
        """Send `request` with `credential` as its bearer (None for a route that sends none),
        resending an idempotent route while Corestore is unavailable."""
        if request.spec.authenticated:
            if credential is None:
                raise LocalProtocolError(f"{request.spec.name} needs the control credential")
            check_credential(credential)
        attempts = self._retry.attempts if request.spec.idempotent else 1
        sent = 0

        async def attempt() -> Reply:
            nonlocal sent
            sent += 1
            if sent > 1:
                self._observer.corestore_resend(route=request.spec.name)
            return await self._observed(request, credential)

        try:
            return await retrying(
                attempt,
                policy=replace(self._retry, attempts=attempts),
                retry_on=CorestoreUnavailable,
                clock=self._clock,
                rng=self._rng,
                what=f"corestore {request.spec.name} at {self._endpoint}",
            )
        except CorestoreUnavailable as exc:
            raise CorestoreUnavailable(
                f"{exc} (attempt {attempts} of {attempts})", **exc.data
            ) from exc

    async def _observed(self, request: RouteRequest, credential: Secret | None) -> Reply:
        """One attempt, its latency and answer kind reported to the observer: the kind of the
        answer Corestore gave (`unavailable` for a 5xx, 408 or 429), `error` for none."""
        spec = request.spec
        started, outcome = self._clock.monotonic(), "error"
        try:
            reply = await self._attempt(request, credential)
            kind = routes.classify_answer(spec, reply.status, reply.error_code())
            outcome = kind.value
            if kind is AnswerKind.STORAGE_FULL:
                # Not a CorestoreUnavailable: a full disk does not empty between two resends.
                raise CorestoreFull(
                    f"Corestore at {self._endpoint} answered {spec.name} with {reply.status} "
                    f"{sanitize_code(reply.error_code())}: its disk is full",
                    httpStatus=reply.status,
                )
            if kind is AnswerKind.UNAVAILABLE:
                raise CorestoreUnavailable(
                    f"Corestore at {self._endpoint} answered {spec.name} with {reply.status} "
                    f"{sanitize_code(reply.error_code())}",
                    httpStatus=reply.status,
                )
            return reply
        finally:
            seconds = self._clock.monotonic() - started
            self._observer.corestore_answer(route=spec.name, outcome=outcome, seconds=seconds)

    async def _attempt(self, request: RouteRequest, credential: Secret | None) -> Reply:
        """One exchange; `CorestoreUnavailable` when Corestore gave no answer."""
        spec = request.spec
        total = self._timeouts.transfer if spec.transfer else self._timeouts.control
        try:
            reply = await self._exchange(request, credential, total)
        except TimeoutError as exc:
            raise CorestoreUnavailable(
                f"Corestore at {self._endpoint} did not answer {spec.name} within {total:g} s"
            ) from _scrub(exc)
        except (aiohttp.ClientError, OSError) as exc:
            # aiohttp's parser errors quote what the server sent, which may echo our headers.
            secrets = [secret for secret in (credential, request.grant) if secret is not None]
            text = sanitize_text(str(exc), secrets)
            raise CorestoreUnavailable(
                f"Corestore at {self._endpoint} did not answer {spec.name}: "
                f"{type(exc).__name__}" + (f": {text}" if text else "")
            ) from _scrub(exc)
        return reply

    async def _exchange(
        self, request: RouteRequest, credential: Secret | None, total: float
    ) -> Reply:
        async with (
            asyncio.timeout(total),
            self._http().request(
                request.spec.method,
                self._origin.with_path(request.path, encoded=True),
                params=dict(request.query) or None,
                data=None if request.body is None else BodyPayload(request.body),
                headers=routes.request_headers(request, credential),
                allow_redirects=False,
            ) as response,
        ):
            return Reply(response.status, await _read(response, request))

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ShuttingDown(f"the Corestore client of {self._endpoint} is closed")
        if self._session is None:
            # Created on first use: a ClientSession belongs to the running loop.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self._timeouts.connect, sock_connect=self._timeouts.connect
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,  # no proxy or .netrc from the environment
                raise_for_status=False,
            )
        return self._session


class BodyPayload(Payload):
    """A request body written from the caller's own buffer, in slices of `SLICE` bytes: no copy
    of it is made. (`io.BytesIO` copied every 64 KiB it read out, and a `bytes` body of more
    than 1 MiB makes aiohttp warn.) The slices go to the socket as they are; the transport
    copies only what the socket did not take at once."""

    SLICE = 256 * 1024
    _autoclose = True

    def __init__(self, body: bytes | bytearray | memoryview) -> None:
        super().__init__(body, content_type=None)
        self._view = memoryview(body).cast("B")
        self._size = self._view.nbytes

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._view).decode(encoding, errors)

    async def write(self, writer: AbstractStreamWriter) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        view = self._view if content_length is None else self._view[:content_length]
        for start in range(0, view.nbytes, self.SLICE):
            await writer.write(view[start : start + self.SLICE])


async def _read(response: aiohttp.ClientResponse, request: RouteRequest) -> bytes:
    body = bytearray()
    async for piece in response.content.iter_chunked(64 * 1024):
        body += piece
        if len(body) > request.spec.answer_limit:
            body.clear()  # foreign text out of this frame before it appears in a traceback
            raise CorestoreRefused(
                f"Corestore answered {request.spec.name} with more than "
                f"{request.spec.answer_limit} bytes"
            )
    return bytes(body)
