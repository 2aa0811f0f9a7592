"""The README's main job: `restore-agent demo` runs one isolated restore end to end and says so."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_demo_restores_verifies_and_cleans_up() -> None:
    """`python -m agent demo --json` exits 0; its events reach `cleaned` with nothing left over."""
    done = subprocess.run(
        [sys.executable, "-m", "agent", "demo", "--size", "2MiB", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    statuses = [event["status"] for event in events if event["event"] == "state"]
    assert statuses[-1] == "cleaned"
    assert "ready" in statuses
    assert {"event": "clean", "leftovers": 0} in events
    summary = events[-1]
    assert summary["event"] == "summary"
    assert (summary["objects"], summary["resources"]) == (9, 3)
