"""Each node's Corestore control credential, sealed by Cloudly to the agent's own X25519 key.

Seed 001: the bearer "is obtained from Cloudly through `getCorestoreControlCredentialMaterial`,
sealed to the X25519 recipient the relay enrolled with `beginSecretRecipientEnrollment` and
`completeSecretRecipientEnrollment`" (bodies: `agent.contracts.credentials`; everything else:
docs/credentials.md).

- `hpke`       RFC 9180 base mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM /
               AES-256-GCM / ChaCha20Poly1305 (pure; checked against the RFC's vectors)
- `binding`    the canonical `info` binding material to cluster, node and recipient; opening
               (and, for Cloudly's side, sealing) material (pure)
- `keys`       the recipient key and the enrollment record in the state directory (0600, atomic
               writes, a lock while the agent runs); `rotate_key()` for `restore-agent rotate-key`
- `enrollment` the begin/complete exchange, run by the session on connect when not enrolled
- `provider`   `SealedCredentials`: the per-node `CredentialSource` the Corestore clients ask

Nothing is imported here, so importing a pure module does not load the async ones.
"""

__all__: list[str] = []
