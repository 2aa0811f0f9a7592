"""The serve.zone relay-side restore agent.

`__version__` is what the build wrote into `agent/_version.py` (setup.py, from git): the release
below, then the commits and the commit it was built from (`0.1.0+412.g85e71b5c0a1d`, `.dirty`
when the tree had changes; the release alone when `v<release>` is tagged at a clean HEAD), so
every build that ships names its code and pip never takes a new build for the one installed. A
checkout nobody built has the release alone.

Nothing else is imported here on purpose: `import agent` must stay cheap and side-effect free.
"""

import importlib

__all__ = ["RELEASE", "__version__"]

RELEASE = "0.1.0"
"""The last release (a tag `v<RELEASE>` marks it); builds after it carry their commit."""


def _built() -> str:
    """The version the build wrote; the release alone in a checkout nobody built."""
    try:
        written = importlib.import_module("agent._version")
    except ImportError:
        return RELEASE
    return str(written.VERSION)


__version__ = _built()
