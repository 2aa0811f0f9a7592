"""Regenerate fixtures/hpke_rfc9180_base_x25519.json from the RFC 9180 source text.

    python tests/credentials/make_hpke_vectors.py PATH/draft-irtf-cfrg-hpke.md

The markdown is the CFRG's source of RFC 9180 (github.com/cfrg/draft-irtf-cfrg-hpke, HEAD
b1f7cb0c); Appendix A.1 and A.2 are its base-mode vectors for DHKEM(X25519, HKDF-SHA256),
HKDF-SHA256 with AES-128-GCM and ChaCha20Poly1305. RFC 9180 publishes none for AES-256-GCM; that
entry is the CFRG test-vectors.json one (kem_id 32, kdf_id 1, aead_id 2, mode 0, sequence 0) as
BoringSSL and Tink carry it (pkRm, skEm, info, aad, pt, ct), written here verbatim.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_SECTIONS = {
    "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM": "RFC 9180 Appendix A.1.1",
    "DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20Poly1305": "RFC 9180 Appendix A.2.1",
}
_SETUP_KEYS = (
    "mode",
    "kem_id",
    "kdf_id",
    "aead_id",
    "info",
    "ikmE",
    "pkEm",
    "skEm",
    "ikmR",
    "pkRm",
    "skRm",
    "enc",
    "shared_secret",
    "key_schedule_context",
    "secret",
    "key",
    "base_nonce",
    "exporter_secret",
)

AES_256_GCM = {
    "source": "CFRG test-vectors.json (kem_id 32, kdf_id 1, aead_id 2, mode 0), as carried by "
    "BoringSSL's hpke_test_vectors.txt and Tink's hpke_test_util.cc; RFC 9180 Appendix A has "
    "no AES-256-GCM vector for DHKEM(X25519, HKDF-SHA256)",
    "mode": 0,
    "kem_id": 32,
    "kdf_id": 1,
    "aead_id": 2,
    "info": "4f6465206f6e2061204772656369616e2055726e",
    "pkRm": "ac66bae9ffa270cf4a89ed9f274e30c0456babae2572aaaf002ff0d8884ab018",
    "skEm": "28e212563a8b6f068af7ff17400ff1baf23612b7a738bbaf5dfb321b2b5b431a",
    "encryptions": [
        {
            "sequence_number": 0,
            "pt": "4265617574792069732074727574682c20747275746820626561757479",
            "aad": "436f756e742d30",
            "ct": "23ded2d5d90ea89d975dac4792b297240f194952d7421aacbff0474100052b6bb8aa58d1"
            "8ef6c42b6960e2e28f",
        }
    ],
}


def _blocks(text: str) -> list[str]:
    return re.findall(r"~~~\n(.*?)~~~", text, flags=re.DOTALL)


def _fields(block: str) -> dict[str, str]:
    """`key: value` lines, a value continued on the following lines until the next key."""
    fields: dict[str, str] = {}
    key = None
    for line in block.splitlines():
        match = re.fullmatch(r"([A-Za-z_ ]+):\s*(.*)", line)
        if match:
            key = match.group(1)
            fields[key] = match.group(2).strip()
        elif key is not None and line.strip():
            fields[key] += line.strip()
    return fields


def _section(text: str, title: str, source: str) -> dict[str, object]:
    start = text.index(f"## {title}\n")
    setup, encryptions = _blocks(text[start:])[:2]
    fields = _fields(setup)
    vector: dict[str, object] = {"source": source}
    for key in _SETUP_KEYS:
        value = fields[key]
        vector[key] = int(value) if key in ("mode", "kem_id", "kdf_id", "aead_id") else value
    assert vector["mode"] == 0
    vector["encryptions"] = [
        {
            "sequence_number": int(entry["sequence number"]),
            "pt": entry["pt"],
            "aad": entry["aad"],
            "nonce": entry["nonce"],
            "ct": entry["ct"],
        }
        for entry in map(_fields, encryptions.strip().split("\n\n"))
    ]
    return vector


def main() -> None:
    text = Path(sys.argv[1]).read_text()
    vectors = [_section(text, title, source) for title, source in _SECTIONS.items()]
    vectors.append(AES_256_GCM)
    target = Path(__file__).parent / "fixtures" / "hpke_rfc9180_base_x25519.json"
    target.write_text(json.dumps(vectors, indent=1) + "\n")


if __name__ == "__main__":
    main()
