"""Exact Python mirrors of the `@serve.zone/interfaces` contracts the agent sends or receives.

Field names are the seeds' camelCase names on the wire (`model.to_wire()`), snake_case in Python.
Modules: `base` (conventions), `cluster` (cluster/node documents, the Corestore endpoint rule,
identities), `backup` (archive manifest, snapshots, partial restore), `isolatedrestore` (node
state and the five isolated-restore methods), `relay` (service backup/restore/prune and the
database-closure methods).
"""
