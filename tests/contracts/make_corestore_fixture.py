"""Regenerates `fixtures/corestore_endpoint_cases.json` by asking the Node oracle.

Run from the repository root: `.venv/bin/python -m tests.contracts.make_corestore_fixture`.
The expectations come from seed 001's validator running in Node, never from the Python port.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.contracts.node_oracle import NodeOracle, node_executable

FIXTURE = Path(__file__).parent / "fixtures" / "corestore_endpoint_cases.json"

_LONG_HOST_2048 = "http://" + "a" * (2048 - len("http://"))


def _endpoint(url: str) -> dict[str, Any]:
    return {"endpoint": url}


# (name, value, path or None for the default)
CASES: list[tuple[str, Any, str | None]] = [
    # valid origins
    ("seed example", _endpoint("http://10.20.0.15:3000"), None),
    ("http without port", _endpoint("http://10.20.0.15"), None),
    ("https with domain", _endpoint("https://corestore.example.com"), None),
    ("https with port", _endpoint("https://corestore.example.com:8443"), None),
    ("http on port 443 is not a default port", _endpoint("http://10.20.0.15:443"), None),
    ("https on port 80 is not a default port", _endpoint("https://10.20.0.15:80"), None),
    ("port 0", _endpoint("http://10.20.0.15:0"), None),
    ("IPv6 canonical", _endpoint("http://[fd00::15]:3000"), None),
    ("IPv6 loopback", _endpoint("http://[::1]:3000"), None),
    ("punycode host", _endpoint("http://xn--bcher-kva.example:3000"), None),
    ("trailing dot host", _endpoint("http://corestore.:3000"), None),
    ("2048 characters", _endpoint(_LONG_HOST_2048), None),
    # not canonical
    ("IPv6 not compressed", _endpoint("http://[fd00:0:0:0:0:0:0:15]:3000"), None),
    ("IPv6 upper case", _endpoint("http://[FD00::15]:3000"), None),
    ("IPv4-mapped IPv6", _endpoint("http://[::ffff:10.20.0.15]:3000"), None),
    ("IDN host", _endpoint("http://bücher.example:3000"), None),
    ("emoji host", _endpoint("http://😀.example:3000"), None),
    ("upper-case scheme", _endpoint("HTTP://10.20.0.15:3000"), None),
    ("upper-case host", _endpoint("http://Corestore.Example:3000"), None),
    ("default port 80 on http", _endpoint("http://10.20.0.15:80"), None),
    ("default port 443 on https", _endpoint("https://corestore.example.com:443"), None),
    ("trailing slash", _endpoint("http://10.20.0.15:3000/"), None),
    ("path", _endpoint("http://10.20.0.15:3000/api"), None),
    ("query", _endpoint("http://10.20.0.15:3000?x=1"), None),
    ("empty query", _endpoint("http://10.20.0.15:3000?"), None),
    ("fragment", _endpoint("http://10.20.0.15:3000#top"), None),
    ("empty fragment", _endpoint("http://10.20.0.15:3000#"), None),
    ("port with leading zeros", _endpoint("http://10.20.0.15:03000"), None),
    ("empty port", _endpoint("http://10.20.0.15:"), None),
    ("IPv4 shorthand", _endpoint("http://10.20.15:3000"), None),
    ("IPv4 in hex", _endpoint("http://0x0a.20.0.15:3000"), None),
    ("no slashes after scheme", _endpoint("http:10.20.0.15:3000"), None),
    ("backslashes", _endpoint("http:\\\\10.20.0.15:3000"), None),
    ("leading space", _endpoint(" http://10.20.0.15:3000"), None),
    ("trailing newline", _endpoint("http://10.20.0.15:3000\n"), None),
    ("tab inside", _endpoint("http://10.20.0.15\t:3000"), None),
    # userinfo
    ("user and password", _endpoint("http://user:secret@10.20.0.15:3000"), None),
    ("user only", _endpoint("http://user@10.20.0.15:3000"), None),
    ("password only", _endpoint("http://:secret@10.20.0.15:3000"), None),
    ("empty userinfo", _endpoint("http://@10.20.0.15:3000"), None),
    # other schemes
    ("ws scheme", _endpoint("ws://10.20.0.15:3000"), None),
    ("wss scheme", _endpoint("wss://10.20.0.15:3000"), None),
    ("ftp scheme", _endpoint("ftp://10.20.0.15:3000"), None),
    ("file scheme", _endpoint("file:///var/run/corestore.sock"), None),
    ("file scheme with host", _endpoint("file://10.20.0.15/"), None),
    ("non-special scheme", _endpoint("corestore://10.20.0.15:3000"), None),
    ("blob of http origin", _endpoint("blob:http://10.20.0.15:3000"), None),
    ("blob of non-special", _endpoint("blob:corestore://x"), None),
    ("data URL", _endpoint("data:text/plain,http://10.20.0.15:3000"), None),
    ("javascript URL", _endpoint("javascript:alert(1)"), None),
    ("mailto URL", _endpoint("mailto:ops@example.com"), None),
    ("non-special with userinfo", _endpoint("corestore://u:p@10.20.0.15:3000"), None),
    # unparsable
    ("not a URL", _endpoint("not a url"), None),
    ("host only", _endpoint("10.20.0.15:3000"), None),
    ("scheme only", _endpoint("http://"), None),
    ("port out of range", _endpoint("http://10.20.0.15:65536"), None),
    ("unclosed IPv6", _endpoint("http://[fd00::15:3000"), None),
    ("space in host", _endpoint("http://core store:3000"), None),
    ("NUL in host", _endpoint("http://10.20.0.15\x00:3000"), None),
    ("lone surrogate in host", _endpoint("http://core\ud800store:3000"), None),
    ("invalid IPv4", _endpoint("http://10.20.0.256:3000"), None),
    # lone surrogates outside the host become U+FFFD (USVString) and parse
    ("lone surrogate in path", _endpoint("http://10.20.0.15:3000/\udc00"), None),
    ("lone surrogate in fragment", _endpoint("http://10.20.0.15:3000#\ud800"), None),
    # length
    ("empty endpoint", _endpoint(""), None),
    ("2049 characters", _endpoint(_LONG_HOST_2048 + "a"), None),
    ("2049 UTF-16 code units in 1029 code points", _endpoint("http://h/" + "😀" * 1020), None),
    (
        "2048 UTF-16 code units with astral characters",
        _endpoint("http://h/" + "😀" * 1019 + "a"),
        None,
    ),
    # wrong types and shapes
    ("endpoint is a number", {"endpoint": 3000}, None),
    ("endpoint is null", {"endpoint": None}, None),
    ("endpoint is a list", {"endpoint": ["http://10.20.0.15:3000"]}, None),
    ("endpoint is an object", {"endpoint": {"url": "http://10.20.0.15:3000"}}, None),
    ("endpoint is a boolean", {"endpoint": True}, None),
    ("null", None, None),
    ("string", "http://10.20.0.15:3000", None),
    ("number", 3000, None),
    ("true", True, None),
    ("false", False, None),
    ("array", [_endpoint("http://10.20.0.15:3000")], None),
    ("empty array", [], None),
    ("empty object", {}, None),
    ("extra key", {"endpoint": "http://10.20.0.15:3000", "token": "x"}, None),
    ("extra key first", {"token": "x", "endpoint": "http://10.20.0.15:3000"}, None),
    ("wrong key case", {"Endpoint": "http://10.20.0.15:3000"}, None),
    ("url key", {"url": "http://10.20.0.15:3000"}, None),
    # path in messages
    ("custom path, valid", _endpoint("http://10.20.0.15:3000"), "nodes[0].data.corestore"),
    ("custom path, shape", None, "nodes[0].data.corestore"),
    ("custom path, length", _endpoint(""), "nodes[0].data.corestore"),
    ("custom path, parse", _endpoint("nope"), "nodes[0].data.corestore"),
    ("custom path, all three", _endpoint("ftp://u:p@h/x"), "nodes[0].data.corestore"),
]


def main() -> int:
    """Asks the oracle about every case and writes the fixture."""
    node = node_executable()
    if node is None:
        print("node is not on PATH", file=sys.stderr)
        return 1
    oracle = NodeOracle(node)
    try:
        table = [
            {
                "name": name,
                "value": value,
                **({"path": path} if path is not None else {}),
                "expected": oracle.corestore(value, path),
            }
            for name, value, path in CASES
        ]
    finally:
        oracle.close()
    names = [entry["name"] for entry in table]
    assert len(names) == len(set(names)), "case names must be unique"
    FIXTURE.write_text(json.dumps(table, indent=2, ensure_ascii=True) + "\n", encoding="utf-8")
    print(f"wrote {len(table)} cases to {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
