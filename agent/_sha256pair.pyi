"""Type stub of the optional native digests (agent/_sha256pair.c): both sha256s in one pass."""

def available() -> bool:
    """Whether this CPU runs `Sha256Pair` (it has the SHA extensions)."""

class Sha256Pair:
    """A running sha256 that also gives each piece's own sha256 in the same pass."""

    def __init__(self) -> None: ...
    def update(self, data: bytes | bytearray | memoryview, /) -> None:
        """Add `data` to the running digest."""

    def update_piece(self, data: bytes | bytearray | memoryview, /) -> bytes:
        """Add `data` to the running digest; the sha256 of `data` alone."""

    def digest(self) -> bytes:
        """The sha256 of every byte added so far (the object goes on)."""
