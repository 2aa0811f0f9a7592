"""The domain: what the engines decide and the store persists, as plain data (pure).

Both the engines (`agent.restore`, `agent.relay`) and the revision store (`agent.store`) build
on this package; it builds on neither, nor on any I/O (only `agent.contracts`, `agent.errors`
and the ground floor's table type `agent.table.TransitionTable`; `tests/test_layers.py` holds
it to that).

- `restore_machine`: the isolated-restore node-status table (`RESTORE_TABLE`, `Op`).
- `restores`: `RestoreKey`, `PreparedPlan`, `StoredState`.
- `replay`: request digests and the exact-replay rule for `expectedRevision`.
- `job_machine`: the relay job table (`JOB_TABLE`, `JobOp`) and the rule that answers a
  repeated request (`REQUESTS`).
- `jobs`: `JobKey`, `StoredJob`.
"""
