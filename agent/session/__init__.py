"""The asyncio side of the Cloudly session: the TypedRequest peer (`peer`) and its adapters.

Nothing is imported here on purpose; import from the submodules (`agent.session.peer`).
"""
