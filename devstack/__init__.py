"""Embedded stand-ins for the parties the agent talks to, used by tests, benchmarks and the demo.

- `corestore`  a reference Corestore control API (aiohttp on 127.0.0.1, bytes on disk, switchable
               faults); implements exactly the routes of `agent/corestore/routes.py`
- `cloudly`    a stand-in Cloudly (websockets server speaking TypedRequest)

Nothing in the agent's production path imports this package.
"""
