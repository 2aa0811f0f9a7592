"""Start-up: what runs before the agent serves, in the order `app` runs it.

- `preflight`: the checks `run` and `check-config` share (one preflight): secrets, CA file,
  state directory, key file, the shutdown budget; what start-up tightens.
- `opening`: opening the state, waiting out a disk that refuses writes (not ready, serving
  health) instead of exiting.
- `reconcile`: after a salvaged or reset state, what each node's Corestore holds that the state
  does not know is taken into cleanup.
"""
