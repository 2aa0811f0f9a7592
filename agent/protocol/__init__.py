"""Sans-I/O TypedRequest/VirtualStream core (typedrequest 3.3.0 wire format; wire.md §1, §4).

No asyncio here: every class takes `now` from an injected clock and ids from an injected
factory, and returns frames to send. Modules:
- `envelope`: the `Envelope` dataclass, JSON codec, dispatch rule, reply builders;
- `chunks`: binary `chunkData` forms and the closing bit;
- `markers`: stream markers inside payloads, the `_OBMITTED_VIRTUAL_STREAM` echo;
- `calls`: the table of outgoing calls (ids, deadlines, `retry`);
- `stream_frames`: the stream package inside `##VirtualStream##` frames;
- `stream_responder` / `stream_initiator`: one stream, seen from each role;
- `streams`: the registry routing stream frames of one connection;
- `ids`: `uni_` ids.
"""

from agent.protocol.calls import CallTable, Completed, Failed, Resend, Unmatched
from agent.protocol.chunks import (
    CLOSING,
    CLOSING_BIT,
    ChunkForm,
    Closing,
    decode_chunk,
    encode_chunk,
)
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
from agent.protocol.ids import new_uni_id
from agent.protocol.markers import find_stream_ids, marker
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_initiator import InitiatorStream
from agent.protocol.stream_registry import StreamRegistry
from agent.protocol.stream_responder import ResponderStream, Role

__all__ = [
    "CLOSING",
    "CLOSING_BIT",
    "STREAM_METHOD",
    "CallTable",
    "ChunkForm",
    "Closing",
    "Completed",
    "Correlation",
    "Envelope",
    "ErrorInfo",
    "Failed",
    "FrameKind",
    "InitiatorStream",
    "Resend",
    "ResponderStream",
    "RetryAdvice",
    "Role",
    "StreamRegistry",
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
