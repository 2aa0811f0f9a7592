"""Type stub of the optional native codec (agent/_bufferform.c): JSON int arrays <-> bytes."""

def decode(text: bytes | bytearray | memoryview, /) -> bytes | None:
    """A plain JSON array of ints 0..255 as bytes; None for any other text."""

def encode(data: bytes | bytearray | memoryview, /) -> bytes:
    """The JSON array text of the bytes (`[1,2,3]`)."""
