"""The layering rules, checked on the source: pure core, I/O at the edges, one composition root.

- The pure core (contracts, the protocol, the restore state machine and its pure helpers, the
  Corestore route descriptions, errors, secrets, config) imports no I/O library and no asyncio.
- Each I/O library has one adapter home: aiohttp in `agent/corestore/transport.py`, websockets in
  `agent/session/transport.py`, aiosqlite in `agent/store/`.
- Only the CLI imports the composition root `agent.app`.
- The product holds only the daemon: nothing in `agent/` imports the stand-ins (`devstack`) or
  the tests' helpers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parent.parent / "agent"

PURE = [
    *sorted((AGENT / "contracts").glob("*.py")),
    *sorted((AGENT / "protocol").glob("*.py")),
    *(
        AGENT / "restore" / name
        for name in ("machine.py", "replay.py", "state.py", "grants.py", "routing.py")
    ),
    *(AGENT / "corestore" / name for name in ("routes.py", "shapes.py", "models.py")),
    AGENT / "errors.py",
    AGENT / "secret.py",
    AGENT / "config.py",
]

IO_LIBRARIES = {"asyncio", "aiohttp", "aiosqlite", "websockets"}

ADAPTER_HOMES = {
    "aiohttp": {"corestore/transport.py"},
    "websockets": {"session/transport.py"},
    "aiosqlite": {"store/"},
}


def _imported_roots(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value  # importlib.import_module("agent.app")


def _relative(path: Path) -> str:
    return path.relative_to(AGENT).as_posix()


@pytest.mark.parametrize("path", PURE, ids=_relative)
def test_the_pure_core_imports_no_io(path: Path) -> None:
    """A pure module imports neither asyncio nor an I/O library."""
    assert path.exists()
    roots = {name.split(".")[0] for name in _imported_roots(path)}
    assert roots.isdisjoint(IO_LIBRARIES), f"{_relative(path)} imports {roots & IO_LIBRARIES}"


@pytest.mark.parametrize("library", sorted(ADAPTER_HOMES))
def test_each_io_library_stays_in_its_adapter(library: str) -> None:
    """aiohttp, websockets and aiosqlite are imported only where their adapter lives."""
    homes = ADAPTER_HOMES[library]
    users = {
        _relative(path)
        for path in AGENT.rglob("*.py")
        if any(name.split(".")[0] == library for name in _imported_roots(path))
    }
    assert users, f"nothing imports {library}: the rule checks nothing"
    strays = {user for user in users if not any(user.startswith(home) for home in homes)}
    assert strays == set()


def test_only_the_cli_imports_the_composition_root() -> None:
    """`agent.app` is wired by the CLI, nothing else in the product."""
    importers = {
        _relative(path)
        for path in AGENT.rglob("*.py")
        if any(name == "agent.app" for name in _imported_roots(path))
    }
    assert importers == {"cli.py"}


def test_the_product_imports_no_stand_in_and_no_test_helper() -> None:
    """No module of `agent/` imports `devstack` (stand-ins, demo) or `tests`."""
    strays = {
        _relative(path): name
        for path in AGENT.rglob("*.py")
        for name in _imported_roots(path)
        if name.split(".")[0] in ("devstack", "tests")
    }
    assert strays == {}
