"""`python -m agent`: the same entry point as the `restore-agent` console script."""

from agent.entry.cli import main

raise SystemExit(main())
