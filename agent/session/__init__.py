"""The Cloudly session: `client` (the reconnect loop, one connection's lifecycle) over the
TypedRequest `peer` and the websockets `transport`; the sans-I/O `handshake`, the session's
`lifecycle` table and the pure loss decisions (`faults`, `outage`) it drives;
`authentication`, `cluster`, `keepalive`, `settings`.

Nothing is imported here on purpose; import from the submodules (`agent.session.client`).
"""
