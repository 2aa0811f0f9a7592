"""`WebsocketTransport`: the `FrameTransport` over one `websockets` (17, asyncio API) connection.

Thin adapter, both roles (the agent's client socket and the stand-in Cloudly's server socket):

- `recv()` reads with `decode=False`, so a text frame arrives as the raw UTF-8 bytes: chunk
  frames are several MB of JSON and decoding them to `str` first would copy them for nothing.
- `send(frame)` sends the UTF-8 JSON bytes as ONE text frame (`text=True`), as TypedSocket does.
- The library's `ConnectionClosed` becomes `SessionClosed(code, reason)`, chained.
- `ping()` sends one ping and returns its `Pong` once the pong came: the round trip. The
  session runs the keepalive itself (on its injected clock, recording each pong in the
  status, delivering answers by the ping rule: `agent.protocol.delivery`), so the library's
  own keepalive is switched off (`ping_interval=None`).
- `send_then_ping(frames)` writes frames and a ping behind them in ONE write to the socket
  (one call to the asyncio transport, where the library makes one per frame): a delivery's
  confirming ping leaves with the answers it confirms and reaches the peer in the same
  segments unless the network splits them (or a full socket buffer does).

`connect_transport()` opens the agent's client connection and translates every way opening can
fail (refused, DNS, TLS, handshake, timeout) into `SessionError`, chained (the session classifies
the cause, `agent.session.faults`; an upgrade answered with an HTTP status is `UpgradeRefused`,
carrying it); `tls_context()` turns the CA file into what a wss:// URL needs
(`agent.session.settings.websocket_url` maps the configured Cloudly URL to the one dialled).
`CloseCode` names the close codes the agent sends or reads.
`quiet_websocket_logger()` is the logger handed to the library: websockets logs whole frames at
DEBUG, and frames carry the machine token and the JWT, so that logger never goes below INFO.

Beyond the library's public API, `_PingingConnection` fills `pending_pings` and writes through
`send_context`, `loop` and the asyncio `transport`, and `install_piece_reader` swaps the
protocol's `reader` and restarts its `parser`. Those are websockets' internals:
pyproject.toml bounds the dependency to the release they were checked against, and
tests/session/test_websockets_internals.py names each one, so a websockets that moved one
fails the tests before it reaches a node.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import Protocol, State
from websockets.streams import StreamReader

from agent.errors import ConfigError, InvalidState, SessionClosed, SessionError, UpgradeRefused
from agent.session.pieces import PieceReader

__all__ = [
    "CloseCode",
    "PendingPong",
    "Pong",
    "WebsocketTransport",
    "connect_transport",
    "install_piece_reader",
    "quiet_websocket_logger",
    "tls_context",
]


class CloseCode(enum.IntEnum):
    """The websocket close codes the agent sends or reads (RFC 6455, section 7.4.1)."""

    NORMAL_CLOSURE = 1000  # the session ends on purpose (a probe done, a loss to reconnect)
    GOING_AWAY = 1001  # the agent shuts down
    ABNORMAL_CLOSURE = 1006  # never sent: the connection ended without a close frame
    INTERNAL_ERROR = 1011  # a bug ended the session, or Cloudly stopped answering pings


def quiet_websocket_logger(name: str = "websockets.client") -> logging.Logger:
    """A stdlib logger for `websockets` that never logs frame contents (level >= INFO)."""
    logger = logging.getLogger(name)
    if logger.level < logging.INFO:  # NOTSET (0) would inherit a DEBUG root
        logger.setLevel(logging.INFO)
    return logger


def _close_details(exc: ConnectionClosed) -> tuple[int, str]:
    """The close code and reason the peer sent, else ours, else 1006 (no close frame)."""
    frame = exc.rcvd if exc.rcvd is not None else exc.sent
    if frame is None:
        return int(CloseCode.ABNORMAL_CLOSURE), ""
    return int(frame.code), frame.reason


@dataclass(frozen=True, slots=True)
class Pong:
    """A ping's answer: its round trip."""

    seconds: float


class PendingPong:
    """A ping written, its pong still to come: `answer()` waits for it."""

    def __init__(self, waiter: Awaitable[float]) -> None:
        self._waiter = waiter

    async def answer(self) -> Pong:
        """The pong; `SessionClosed` if the connection closes first."""
        try:
            seconds = await self._waiter
        except ConnectionClosed as exc:
            raise SessionClosed(*_close_details(exc)) from exc
        return Pong(seconds)


class _PingingConnection(ClientConnection):
    """The agent's client connection: reads through a `PieceReader` and writes frames with a
    ping behind them in one write."""

    def __init__(self, protocol: ClientProtocol, *args: Any, **kwargs: Any) -> None:
        install_piece_reader(protocol)
        super().__init__(protocol, *args, **kwargs)

    async def send_then_ping(self, frames: Sequence[bytes], data: bytes) -> Awaitable[float]:
        """Queue `frames` (text) and a ping carrying `data`, hand all of it to the socket in
        one write, and return the pong's waiter, as `ping()` does.

        `ping()` and `send()` write each frame on their own: a peer's websocket may read the
        answer in one read and the ping in a later one. The ping is kept the library's way
        (`pending_pings`, in the order pings go out, with the time sent), so its pong settles
        it and every earlier one; nothing is awaited before the write, so no other frame can
        come between the frames and the ping."""
        async with self.send_context():  # checks the state; drains on the way out
            for frame in frames:
                self.protocol.send_text(frame)
            pong: asyncio.Future[float] = self.loop.create_future()
            self.pending_pings[data] = (pong, self.loop.time())
            self.protocol.send_ping(data)
            # One call, one send while the socket has room: scatter-gather where asyncio has
            # it (3.12+); 3.11 joins the pieces (one more copy of this flush's frames).
            self.transport.writelines(self.protocol.data_to_send())
        return pong


def install_piece_reader(protocol: Protocol) -> None:
    """Read `protocol`'s socket through a `PieceReader` (one copy per frame, not three).

    Only before the first byte is read: the parser is started again on the new reader (it had
    only started waiting for the handshake's answer). `InvalidState` if the protocol has begun
    reading, or its reader is not the library's."""
    reader = protocol.reader
    if (
        protocol.state is not State.CONNECTING
        or type(reader) is not StreamReader
        or reader.buffer
        or reader.eof
    ):
        raise InvalidState("the piece reader goes in before the connection reads a byte")
    protocol.reader = PieceReader()  # type: ignore[assignment]  # the same interface
    protocol.parser = protocol.parse()
    next(protocol.parser)


class WebsocketTransport:
    """One websocket connection as a `FrameTransport`."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._pings = count(1)

    async def send(self, frame: bytes) -> None:
        """Send `frame` (UTF-8 JSON) as one text frame."""
        try:
            await self._connection.send(frame, text=True)
        except ConnectionClosed as exc:
            raise SessionClosed(*_close_details(exc)) from exc

    async def recv(self) -> bytes:
        """The next frame as bytes; raises `SessionClosed` once the connection is closed."""
        try:
            data = await self._connection.recv(decode=False)
        except ConnectionClosed as exc:
            raise SessionClosed(*_close_details(exc)) from exc
        assert isinstance(data, bytes)  # decode=False always yields bytes
        return data

    async def ping(self) -> Pong:
        """Send a ping; its `Pong` once answered. Raises `SessionClosed` if the connection
        closes first (bound the wait from outside)."""
        return await (await self.start_ping()).answer()

    async def start_ping(self) -> PendingPong:
        """Write a ping now, behind every frame sent before (no frame can come between: the
        write happens before anything is awaited); its pong, to await. `send_then_ping` with no
        frames: the same write, the same numbering."""
        return await self.send_then_ping(())

    async def send_then_ping(self, frames: Sequence[bytes]) -> PendingPong:
        """Write `frames` (each one text frame) and a ping behind them in ONE write to the
        socket; the ping's pong, to await. The peer's websocket reads the ping with the last
        frame unless the network splits the bytes. The agent's client connection only
        (`InvalidState` otherwise, as `start_ping`); `SessionClosed` once the connection is
        gone."""
        pinging = self._pinging()
        data = b"agent-%d" % next(self._pings)
        try:
            waiter = await pinging.send_then_ping(frames, data)
        except ConnectionClosed as exc:
            raise SessionClosed(*_close_details(exc)) from exc
        return PendingPong(waiter)

    def _pinging(self) -> _PingingConnection:
        pinging = self._connection
        if not isinstance(pinging, _PingingConnection):
            raise InvalidState("only the agent's client connection writes frames with a ping")
        return pinging

    async def close(self, code: int = CloseCode.GOING_AWAY, reason: str = "") -> None:
        """Close the connection with `code` (bounded by the connection's close timeout)."""
        await self._connection.close(code, reason)


def tls_context(url: str, ca_file: Path | None) -> ssl.SSLContext | None:
    """A verifying TLS context for wss:// (system trust, or `ca_file` when given), else None."""
    if not url.startswith("wss://"):
        return None
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("cloudly.ca_file", f"cannot load the CA file: {exc}") from exc


def _host_of(url: str) -> str:
    # Only the authority goes into error texts: a URL path or query could one day carry
    # something that is not ours to log.
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0].rsplit("@", 1)[-1]


async def connect_transport(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None,
    max_size: int,
    compression: Literal["deflate"] | None,
    ping_interval: float | None,
    ping_timeout: float | None,
    open_timeout: float,
    close_timeout: float,
    logger: logging.Logger | None = None,
) -> WebsocketTransport:
    """Open a client websocket to `url` (ws:// or wss://); raises `SessionError` on failure."""
    try:
        connection: ClientConnection = await connect(
            url,
            ssl=ssl_context,
            max_size=max_size,
            compression=compression,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            open_timeout=open_timeout,
            close_timeout=close_timeout,
            # No proxy from the environment: where the agent connects is configuration only.
            proxy=None,
            logger=logger or quiet_websocket_logger(),
            create_connection=_PingingConnection,
        )
    except InvalidURI as exc:
        raise SessionError(f"the Cloudly URL is not a websocket URL: {exc}") from exc
    except InvalidStatus as exc:
        raise UpgradeRefused(
            f"Cloudly at {_host_of(url)} refused the websocket: {exc}",
            http_status=exc.response.status_code,
        ) from exc
    except InvalidHandshake as exc:
        raise SessionError(f"Cloudly at {_host_of(url)} refused the websocket: {exc}") from exc
    except ssl.SSLError as exc:
        raise SessionError(f"TLS with Cloudly at {_host_of(url)} failed: {exc}") from exc
    except TimeoutError as exc:
        raise SessionError(
            f"Cloudly at {_host_of(url)} did not open a websocket within {open_timeout:g} s"
        ) from exc
    except OSError as exc:
        raise SessionError(f"could not reach Cloudly at {_host_of(url)}: {exc}") from exc
    return WebsocketTransport(connection)
