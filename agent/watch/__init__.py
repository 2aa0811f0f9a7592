"""The operator's face: what the agent shows of itself and how it is watched.

- `status`: `AgentStatus`, the daemon's state as plain data (the session and start-up write it);
  `sessionstate`: the session state it shows and its one table; `statushooks`: the observer hooks
  that name its conditions; `outagetext`: times and the outage in words.
- `overview`: readiness reasons, restore and job rows with their transfers (pure): it builds the
  status document, `document` (with `docrows`, `docfields`), typed once, which `statusview`
  reads back.
- `health`: the aiohttp health server (`/healthz`, `/readyz`, `/metrics`, `/v1/...`).
- `metrics`: every metric on the app's own registry (the only prometheus_client user).
- `notify`: sd_notify (READY=1, STATUS=, WATCHDOG=1, STOPPING=1); `loopwatch`: event-loop lag,
  WATCHDOG=1 only from a healthy loop.
- `statusview`: `restore-agent status`: reads the health endpoint and prints it.
"""
