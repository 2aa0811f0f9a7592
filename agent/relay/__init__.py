"""The relay's duties of seed 001: service backup, restore and prune on an exact node, and the
database closures the agent streams to and from Cloudly (docs/relay.md).

Its job machine and request rule are the domain's (`agent.domain.job_machine`, the job's key
and row `agent.domain.jobs`); the store persists the jobs.

- `plan`: which snapshots a restore restores, the partial-restore rule (pure).
- `closures`: the two closure directions (Corestore export -> Cloudly, Cloudly -> Corestore
  import), bounded chunks, sha256 verified before anything counts.
- `runner`: `JobRunner`, the durable jobs and their owner (`run()`/`close()`); `service`:
  `RelayService`, the three requests and their work (it has a `JobRunner`: `runner`);
  `settings`: `RelaySettings`, its tunables.
- `routes`: the three typed routes Cloudly calls, bound to one service.
"""
