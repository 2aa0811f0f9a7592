"""Sans-I/O TypedRequest/VirtualStream core (typedrequest 3.3.0 wire format; wire.md §1, §4).

No asyncio here: every action takes `now` from its driver and ids from an injected factory,
and returns frames to send. The face, what the rest of the agent uses:
- `connection`: `Connection`, THE protocol object (frames, time and actions in; bytes, events
  and deadlines out; streams named by id);
- `events`: the values it hands out (`RequestReceived`, `Completed`, `CallErrored`,
  `StreamChanged`, `StreamEnded`, `StreamBroke`, `ChunkToDecode`);
- `settings`: `ConnectionSettings` and `StreamSettings`, every knob with its one default;
- `handlers`: what a handler is and sees (`Route`, `Routes`, `RequestContext`, `ByteSource`,
  `ByteSink`, `Producer`).
Inside, in the order the bytes go:
- `envelope`: the `Envelope` dataclass, JSON codec, dispatch rule, reply builders;
- `calls`: the table of outgoing calls (ids, deadlines, `retry`);
- `markers`: stream markers inside payloads, the `_OBMITTED_VIRTUAL_STREAM` echo;
- `stream_frames`: the stream package inside `##VirtualStream##` frames;
- `chunks`: binary `chunkData` forms and the closing bit; `chunk_frames` cuts a chunk's
  payload out of its frame undecoded; `bytearrays` turns the payload into bytes (the native
  codec or the pure path);
- `admission`: the seats of each request class (control, stream; a node's share of the
  stream seats), the connection's intake rule 4;
- `receive_budget`: the bytes the connection's answers invite at once; `stream_charges`: what
  each stream we receive on holds of the agent's byte budget (`pool`), drawn and given back;
- `stream_registry`: the streams of one connection and the routing of stream frames (and which
  frame is a chunk a stream keeps, drawn for first);
- `stream_responder` / `stream_initiator`: one stream, seen from each role, its life one table
  (an `agent.table.TransitionTable`, the agent's one table type). These machines and
  the registry are the connection's own: nothing outside this package imports them
  (tests/test_layers.py);
- `ids`: `uni_` ids.
"""

from agent.protocol.calls import CallErrored, CallTable, Completed, Resend, Unmatched
from agent.protocol.chunks import (
    CLOSING,
    CLOSING_BIT,
    ChunkForm,
    Closing,
    decode_chunk,
    encode_chunk,
)
from agent.protocol.connection import MAX_CHUNK, Connection, ConnectionState
from agent.protocol.envelope import (
    STREAM_METHOD,
    Correlation,
    Envelope,
    ErrorInfo,
    FrameKind,
    RetryAdvice,
    classify,
    decode_envelope,
    encode_envelope,
)
from agent.protocol.events import (
    ChunkToDecode,
    ChunkToken,
    Event,
    RequestReceived,
    StreamBroke,
    StreamChanged,
    StreamEnded,
)
from agent.protocol.handlers import (
    ByteSink,
    ByteSource,
    Handler,
    Producer,
    RequestContext,
    Route,
    Routes,
)
from agent.protocol.ids import new_uni_id
from agent.protocol.intake import UNKNOWN_METHOD_TEXT
from agent.protocol.markers import find_stream_ids, marker
from agent.protocol.settings import ConnectionSettings, StreamSettings

__all__ = [
    "CLOSING",
    "CLOSING_BIT",
    "MAX_CHUNK",
    "STREAM_METHOD",
    "UNKNOWN_METHOD_TEXT",
    "ByteSink",
    "ByteSource",
    "CallErrored",
    "CallTable",
    "ChunkForm",
    "ChunkToDecode",
    "ChunkToken",
    "Closing",
    "Completed",
    "Connection",
    "ConnectionSettings",
    "ConnectionState",
    "Correlation",
    "Envelope",
    "ErrorInfo",
    "Event",
    "FrameKind",
    "Handler",
    "Producer",
    "RequestContext",
    "RequestReceived",
    "Resend",
    "RetryAdvice",
    "Route",
    "Routes",
    "StreamBroke",
    "StreamChanged",
    "StreamEnded",
    "StreamSettings",
    "Unmatched",
    "classify",
    "decode_chunk",
    "decode_envelope",
    "encode_chunk",
    "encode_envelope",
    "find_stream_ids",
    "marker",
    "new_uni_id",
]
