"""The HTTP edge of the Corestore client: one aiohttp session, timeouts, safe retries.

`HttpTransport.send(request, credential)` sends one `RouteRequest` with the bearer it is given
(the client asks its node's credential per call; the transport holds none) and returns its
`Reply`, mapping every
transport failure (connection refused or reset, timeout) and every 5xx/408/429 answer to
`CorestoreUnavailable` (chained from the aiohttp or timeout error). Every answer is classified
here, once (`Reply.kind`, and Corestore's error code and text, parsed only for a status >= 300):
the client reads that and parses nothing again. It resends only requests whose route is
idempotent, while Corestore is unavailable, by the agent's one retry policy
(`agent.retry.retrying`: full-jitter exponential backoff, waits on the injected `Clock`, draws
from the injected `rng`): `attempts` sends at least, and more while the node's outage
(`outage.Outage`: since the first attempt without a usable answer) is younger than the
policy's `tolerance`, so a Corestore that restarts or blips for a minute or two is ridden out.
Its start and end are logged (`corestore_unavailable`, `corestore_available_again`), a call
giving up on an outage older than the tolerance logs an error once per outage
(`corestore_outage_outlasted_tolerance`), and the observer hears each
(`corestore_unavailable(node, since)`: status and metrics say since when). This is the only
place a Corestore call is resent for availability: the engine above it never wraps a call in a
second loop (the client's one resend after a refused credential is not for availability). What
a 2xx or 4xx answer means is the client's business (`client.py`).

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

import aiohttp
import structlog
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import Payload
from yarl import URL

from agent.clock import Clock
from agent.corestore import routes
from agent.corestore.outage import Outage
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

__all__ = ["CorestoreTimeouts", "HttpTransport", "Reply", "check_credential"]

_log = structlog.get_logger("agent.corestore.transport")


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
    """One HTTP answer, classified once: its `kind` for the route, and for a status >= 300
    Corestore's `(code, message)` when the body is its error shape (None otherwise). The body and
    the error are foreign text (they may echo anything): kept out of `repr`."""

    status: int
    body: bytes = field(repr=False)
    kind: AnswerKind = AnswerKind.OK
    error: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def classify(cls, spec: routes.RouteSpec, status: int, body: bytes) -> Reply:
        """The answer `status` with `body` to a call of `spec`: parsed and judged once."""
        error = routes.parse_error(body) if status >= 300 else None
        kind = routes.classify_answer(spec, status, error[0] if error else None)
        return cls(status, body, kind, error)

    def error_code(self) -> str | None:
        """Corestore's error code, unsanitised (compare it, never print it)."""
        return self.error[0] if self.error else None


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
        node: str = "",
    ) -> None:
        """`node` names the node whose Corestore this is, in logs and to the observer (the
        endpoint when empty)."""
        self._origin = _canonical_origin(endpoint)
        self._observer = observer
        self._node = node or endpoint
        self._outage = Outage()
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
        idempotent = request.spec.idempotent
        attempts = self._retry.attempts if idempotent else 1
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
                patience=self._patient if idempotent else None,
            )
        except CorestoreUnavailable as exc:
            self._gave_up(request.spec.name)
            raise CorestoreUnavailable(f"{exc} (attempt {sent} of {sent})", **exc.data) from exc

    @property
    def unavailable_since(self) -> float | None:
        """Since when (epoch seconds) this Corestore gave no usable answer; None: it answers."""
        return self._outage.since_wall

    def _patient(self) -> bool:
        """Whether an idempotent call may still be resent: the outage is younger than the
        policy's tolerance."""
        return self._outage.age(self._clock.monotonic()) < self._retry.tolerance

    def _unavailable(self) -> None:
        if self._outage.failed(monotonic=self._clock.monotonic(), wall=self._clock.time()):
            _log.warning("corestore_unavailable", node=self._node, endpoint=self._endpoint)
            self._observer.corestore_unavailable(node=self._node, since=self._outage.since_wall)

    def _available(self) -> None:
        lasted = self._outage.answered(monotonic=self._clock.monotonic())
        if lasted is not None:
            _log.info(
                "corestore_available_again",
                node=self._node,
                endpoint=self._endpoint,
                unavailable_s=round(lasted, 3),
            )
            self._observer.corestore_unavailable(node=self._node, since=None)

    def _gave_up(self, route: str) -> None:
        outage = self._outage
        if outage.since is None or outage.outlasted or self._patient():
            return
        outage.outlasted = True
        _log.error(
            "corestore_outage_outlasted_tolerance",
            node=self._node,
            endpoint=self._endpoint,
            route=route,
            unavailable_s=round(outage.age(self._clock.monotonic()), 3),
            tolerance_s=self._retry.tolerance,
        )

    async def _observed(self, request: RouteRequest, credential: Secret | None) -> Reply:
        """One attempt, its latency and answer kind reported to the observer: the kind of the
        answer Corestore gave (`unavailable` for a 5xx, 408 or 429), `error` for none."""
        spec = request.spec
        started, outcome = self._clock.monotonic(), "error"
        try:
            try:
                reply = await self._attempt(request, credential)
            except CorestoreUnavailable:
                self._unavailable()
                raise
            outcome = reply.kind.value
            if reply.kind is AnswerKind.STORAGE_FULL:
                # Not a CorestoreUnavailable: a full disk does not empty between two resends.
                # Corestore answered, so it is available.
                self._available()
                raise CorestoreFull(
                    f"Corestore at {self._endpoint} answered {spec.name} with {reply.status} "
                    f"{sanitize_code(reply.error_code())}: its disk is full",
                    httpStatus=reply.status,
                )
            if reply.kind is AnswerKind.UNAVAILABLE:
                self._unavailable()
                raise CorestoreUnavailable(
                    f"Corestore at {self._endpoint} answered {spec.name} with {reply.status} "
                    f"{sanitize_code(reply.error_code())}",
                    httpStatus=reply.status,
                )
            self._available()
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
            return Reply.classify(request.spec, response.status, await _read(response, request))

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
