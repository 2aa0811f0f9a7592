"""CloudlySession socket settings: TLS verification, no compression, big frames, dead peers."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.errors import SessionClosed
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from tests.session._helpers import is_connected, running

TOKEN = "machine-token-9d8c7b6a5f4e3d2c"
DOCUMENT = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})


@dataclass(frozen=True)
class _Pki:
    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> _Pki:
    """A private CA and a certificate for 127.0.0.1 signed by it."""
    folder = tmp_path_factory.mktemp("pki")
    now = datetime.datetime.now(datetime.UTC)
    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test CA"))
        .issuer_name(_name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("cloudly"))
        .issuer_name(ca.subject)
        .public_key(server_key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = _Pki(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pki


def _session(cloudly: StandInCloudly, status: AgentStatus, **overrides: Any) -> CloudlySession:
    values: dict[str, Any] = {
        "url": cloudly.url,
        "tag_name": "restore-agent",
        "tag_payload": {},
        "max_frame_bytes": 16 * 2**20,
        "close_timeout": 0.5,
        "call_timeout": 10.0,
    }
    values.update(overrides)
    return CloudlySession(SessionSettings(**values), Secret(TOKEN), status, rng=lambda: 0.0)


async def test_tls_with_the_configured_ca_connects(pki: _Pki) -> None:
    """wss:// with the CA file that signed Cloudly's certificate: verified and connected."""
    status = AgentStatus()
    async with StandInCloudly(
        token=TOKEN, cluster=DOCUMENT, ssl_context=pki.server_context()
    ) as cloudly:
        assert cloudly.url.startswith("https://")
        async with running(_session(cloudly, status, ca_file=pki.ca_file)):
            await status.wait_until(is_connected)
        assert cloudly.count("cluster-config-read") == 1


async def test_tls_without_a_trusted_ca_is_refused(pki: _Pki) -> None:
    """Without the CA the certificate does not verify: no session, the error is recorded."""
    status = AgentStatus()
    async with (
        StandInCloudly(token=TOKEN, cluster=DOCUMENT, ssl_context=pki.server_context()) as cloudly,
        running(_session(cloudly, status)),
    ):
        snapshot = await status.wait_until(lambda s: s.last_error is not None)
    assert snapshot.last_error is not None
    assert "TLS with Cloudly at 127.0.0.1" in snapshot.last_error
    assert "CERTIFICATE_VERIFY_FAILED" in snapshot.last_error
    assert cloudly.count("identity-issued") == 0


@pytest.mark.parametrize(("compression", "offered"), [(False, None), (True, "permessage-deflate")])
async def test_compression_is_offered_only_when_configured(
    compression: bool, offered: str | None
) -> None:
    """By default no permessage-deflate is offered (it costs more than it saves on chunks)."""
    status = AgentStatus()
    async with StandInCloudly(token=TOKEN, cluster=DOCUMENT) as cloudly:
        async with running(_session(cloudly, status, compression=compression)):
            await status.wait_until(is_connected)
        connected = await cloudly.wait_for("connected")
    extensions = connected.detail["extensions_offered"]
    if offered is None:
        assert extensions is None
    else:
        assert extensions.startswith(offered)


async def test_frames_above_the_library_default_are_accepted() -> None:
    """A 3 MiB frame (a chunk is ~4.8 MB per MiB in array form) passes with max_frame_bytes."""
    status = AgentStatus()
    big = dict(DOCUMENT, padding="x" * (3 * 2**20))
    async with StandInCloudly(token=TOKEN, cluster=DOCUMENT) as cloudly:
        async with running(_session(cloudly, status, max_frame_bytes=4 * 2**20)):
            await status.wait_until(is_connected)
            reply = await cloudly.push_cluster_config(big)
        assert reply == {}
        assert status.snapshot().reconnect_count == 0


async def test_frame_above_max_frame_bytes_ends_the_session() -> None:
    """A frame above `max_frame_bytes` closes the socket 1009; the session reconnects."""
    status = AgentStatus()
    big = dict(DOCUMENT, padding="x" * (2 * 2**20))
    async with StandInCloudly(token=TOKEN, cluster=DOCUMENT) as cloudly:
        async with running(_session(cloudly, status, max_frame_bytes=1 * 2**20)):
            await status.wait_until(is_connected)
            cloudly.cluster = big
            with pytest.raises(SessionClosed):
                await cloudly.push_cluster_config(timeout=5.0)
            closed = await cloudly.wait_for("disconnected")
        assert closed.detail["code"] == 1009


async def test_unanswered_pings_declare_the_connection_dead() -> None:
    """A Cloudly that stops answering pings is dropped after ping_timeout and reconnected."""
    status = AgentStatus()
    async with StandInCloudly(token=TOKEN, cluster=DOCUMENT) as cloudly:
        session = _session(cloudly, status, ping_interval=0.05, ping_timeout=0.2)
        async with running(session):
            await status.wait_until(is_connected)
            cloudly.stall_connections()
            snapshot = await status.wait_until(
                lambda s: s.state is SessionState.CONNECTED and s.reconnect_count >= 1
            )
    assert snapshot.last_error == (
        "session closed with code 1011: Cloudly answered no keepalive ping within 0.2 s"
    )
