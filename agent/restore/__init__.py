"""The isolated-restore engine: Cloudly's five requests on a node, driven to its Corestore.

Its state machine, plan and replay rule are the domain's (`agent.domain.restore_machine`,
`agent.domain.restores`, `agent.domain.replay`); the store persists what it decides.

- `state`: the node state's pure transforms; `grants`, `routing`: request checks (pure);
  `settings`: the engine's tunables.
- `engine`: `IsolatedRestoreEngine`, the five operations (it has a `WorkOwner`: `owner`);
  `staging`: stream -> chunks -> Corestore (resumable); `work`: the prepare/execute/cleanup
  background work, step by step; `background`: `WorkOwner`, the owner of the engine's tasks
  and its per-restore locks.
- `routes`: the five typed routes, bound to an engine.
"""
