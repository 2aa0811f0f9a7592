"""Serving one request for `Peer`: the handler's `RequestContext` and the reply it earns.

`answer()` runs a handler and maps every outcome to the reply frame: the response, or
`error {text, data}` for an `AgentError` (its `wire_error_data`), a pydantic `ValidationError`
(`invalid-request` naming the first field path) or anything else (`internal`, generic text,
traceback logged, never the request body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from pydantic import ValidationError

from agent.contracts.base import StreamMarker
from agent.errors import AgentError, LocalProtocolError, wire_error_data
from agent.protocol.envelope import Envelope, encode_envelope, error_reply, reply
from agent.protocol.markers import marker
from agent.session.peer_streams import PeerSink, PeerSource, StreamHandle
from agent.session.peer_types import (
    ByteSink,
    ByteSource,
    Handler,
    Producer,
    invalid_request,
    response_dict,
)

__all__ = ["RequestContext", "answer"]

log = structlog.get_logger("agent.session.peer")


class RequestContext:
    """What a handler may do beyond reading its request."""

    def __init__(
        self,
        method: str,
        request_streams: list[str],
        source: Callable[[str], PeerSource],
        open_send: Callable[[], StreamHandle],
        sink: Callable[[StreamHandle], PeerSink],
    ) -> None:
        self.method = method
        self.request_streams = request_streams
        self.send_streams: list[tuple[StreamHandle, Producer | None]] = []
        self._opened: set[str] = set()
        self._source = source
        self._open_send = open_send
        self._sink = sink

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Open the stream `marker` (a field of this request) for reading; once per stream."""
        stream_id = marker.stream_id
        if stream_id not in self.request_streams or stream_id in self._opened:
            raise LocalProtocolError(
                f"stream {stream_id} is not an unopened stream of this request"
            )
        self._opened.add(stream_id)
        return self._source(stream_id)

    def open_send_stream(self, producer: Producer | None = None) -> tuple[dict[str, Any], ByteSink]:
        """A new stream for the response: put the marker dict into it.

        The peer reads only after it got the response, so a handler can queue at most
        `stream_window` chunks before returning. Pass `producer` to write more: the Peer runs
        `await producer(sink)` in a task it owns once the response is sent (and closes the
        sink after it, aborts it if it raises).
        """
        handle = self._open_send()
        self.send_streams.append((handle, producer))
        return marker(handle.stream_id), self._sink(handle)


async def answer(
    env: Envelope, handler: Handler, ctx: RequestContext
) -> tuple[bytes, dict[str, Any] | None]:
    """Run `handler`; the encoded reply frame and the response (None if it failed)."""
    try:
        response = response_dict(env.method, await handler(env.request, ctx))
        return encode_envelope(reply(env, response)), response
    except AgentError as exc:
        log.info("request_refused", method=env.method, code=exc.code)
        refusal = exc
    except ValidationError as exc:
        refusal = invalid_request(exc)
        log.info("request_refused", method=env.method, code=refusal.code)
    except Exception:
        log.exception("handler_failed", method=env.method)
        text = f"the agent failed to handle {env.method}"
        data = {"code": "internal", "retryable": True}
        return encode_envelope(error_reply(env, text, data)), None
    return encode_envelope(error_reply(env, str(refusal), wire_error_data(refusal))), None
