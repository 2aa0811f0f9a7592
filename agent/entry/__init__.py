"""The door and the composition root: how the agent is started and what starts it.

- `cli`: `restore-agent` (the console script and `python -m agent`): parses the command line
  and runs one command; the only importer of `app`.
- `app`: THE composition root: builds every part, runs them in one TaskGroup, shuts them down
  in order.
- `exits`: the exit codes and the one fatal line; `statecommands`: `state salvage|reset|
  rollback`, run while the agent is stopped.
"""
