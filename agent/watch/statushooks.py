"""`StatusHooks`: the observer hooks (`agent.observe`) that name the node's conditions on an
`AgentStatus` (`agent.watch.status`, whose docstring lists each condition's key and meaning).

The composition root hands them out beside the metrics (`tee.Tee`); each hook keeps what it
needs to say the whole condition again (every node whose Corestore is full or unavailable),
since a condition is one sentence, not one per node.
"""

from __future__ import annotations

from agent.watch.outagetext import utc_text
from agent.watch.status import DUPLICATE_AGENT, STATE_UNWRITABLE, AgentStatus

__all__ = ["StatusHooks"]


class StatusHooks:
    """The observer hooks (`agent.observe`) that name conditions on an `AgentStatus`: the state
    disk refusing writes, a node's Corestore full or unavailable, a salvaged or reset state still
    being reconciled. The composition root hands them out beside the metrics (`tee.Tee`)."""

    def __init__(self, status: AgentStatus) -> None:
        self._status = status
        self._full: set[str] = set()
        self._down: dict[str, float] = {}  # node -> since when its Corestore is unavailable
        self._recovered: tuple[str, float] | None = None
        self.unwritable_cause: str | None = None
        """The cause of the state disk's last refusal while it holds (None: writable)."""

    def state_write_failed(self, *, cause: str) -> None:
        """`state-unwritable`: the agent is not ready while it holds."""
        self.unwritable_cause = cause
        self._status.set_condition(
            STATE_UNWRITABLE, f"the node's state cannot be written ({cause})"
        )

    def state_writable(self) -> None:
        """The state disk takes writes again."""
        self.unwritable_cause = None
        self._status.clear_condition(STATE_UNWRITABLE)

    def corestore_full(self, *, node: str, full: bool) -> None:
        """`corestore-full` names every node whose Corestore said its disk is full."""
        if full:
            self._full.add(node)
        else:
            self._full.discard(node)
        if self._full:
            nodes = ", ".join(sorted(self._full))
            self._status.set_condition(
                "corestore-full", f"the Corestore of {nodes} answered that its disk is full"
            )
        else:
            self._status.clear_condition("corestore-full")

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """`corestore-unavailable` names every node whose Corestore gives no usable answer, and
        since when; it begins when the first of them did."""
        if since is None:
            self._down.pop(node, None)
        else:
            self._down[node] = since
        if not self._down:
            self._status.clear_condition("corestore-unavailable")
            return
        nodes = ", ".join(f"{n} since {utc_text(at)}" for n, at in sorted(self._down.items()))
        self._status.set_condition(
            "corestore-unavailable",
            f"the Corestore of {nodes} gives no usable answer (no answer, or 5xx, 408, 429); "
            "its calls ride the outage out up to [corestore] outage_tolerance_s",
            since=min(self._down.values()),
        )

    def state_recovered(self, *, how: str, at: float) -> None:
        """Remember how the state was recovered (named while reconciliation is pending)."""
        self._recovered = (how, at)

    def reconcile_pending(self, *, pending: bool) -> None:
        """`state-recovered` while reconciliation with the nodes' Corestore is due."""
        if pending and self._recovered is not None:
            how, _ = self._recovered
            self._status.set_condition(
                "state-recovered",
                f"the state was {how}; reconciling with each node's Corestore (what it holds "
                "that the state does not know is taken into cleanup)",
            )
        else:
            self._status.clear_condition("state-recovered")

    def recipient_retired(self) -> None:
        """A retirement alone names nothing (the watch decides when it is a second agent)."""

    def duplicate_agent(self, *, text: str | None) -> None:
        """`duplicate-agent` while another agent seems to use the same token: not ready."""
        if text is None:
            self._status.clear_condition(DUPLICATE_AGENT)
        else:
            self._status.set_condition(DUPLICATE_AGENT, text)
