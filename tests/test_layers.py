"""The layering rules, checked on the source: pure core, I/O at the edges, one composition root.

- The pure core (contracts, the protocol, the domain, the restore state's transforms and request
  checks, the relay's restore plan, the Corestore route descriptions, HPKE and the credential
  bindings, the per-node transfer limits, errors, secrets, config) imports no I/O library and
  no asyncio.
- Each I/O library has one adapter home: aiohttp in `agent/corestore/transport.py` (the
  Corestore client) and `agent/watch/health.py` (the health endpoint), websockets in
  `agent/session/transport.py`, aiosqlite in `agent/store/`, prometheus_client in
  `agent/watch/metrics.py`.
- Only the CLI imports the composition root `agent.entry.app`.
- The product holds only the daemon: nothing in `agent/` imports the stand-ins (`devstack`) or
  the tests' helpers, and the wheel built from `pyproject.toml` holds `agent/` and nothing else.
- The sans-I/O protocol (`agent/protocol/`) depends on nothing of the agent but the errors, the
  contracts and the one table type (`agent/table.py`, which imports only the errors); so does
  the domain (`agent/domain/`: the transition tables, keys, records and the replay rule), on
  which both the engines and the store depend.
- The protocol's stream machines and their registry are its own: outside `agent/protocol/` (and
  its tests, `tests/protocol/`) nothing imports them; the `Connection` hands out stream ids,
  values and bytes.
- No two modules of the product import each other (directly or around a circle), and neither do
  two packages (`agent/<package>/` as one node, each top-level module as another): there is an
  order to read the packages in.
- docs/architecture.md's layout names every module of `agent/`, and its package graph is what
  each package imports.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "agent"

PURE = [
    *sorted((AGENT / "contracts").glob("*.py")),
    *sorted((AGENT / "protocol").glob("*.py")),
    *sorted((AGENT / "domain").glob("*.py")),
    *(AGENT / "restore" / name for name in ("state.py", "grants.py", "routing.py")),
    AGENT / "relay" / "plan.py",
    *(
        AGENT / "corestore" / name
        for name in (
            "routes.py",
            "builders.py",
            "service_builders.py",
            "shapes.py",
            "models.py",
            "service_models.py",
        )
    ),
    *(AGENT / "credentials" / name for name in ("hpke.py", "binding.py")),
    AGENT / "errors.py",
    AGENT / "secret.py",
    AGENT / "table.py",
    *sorted((AGENT / "config").glob("*.py")),
    AGENT / "watch" / "listen.py",
    AGENT / "observe.py",
    AGENT / "watch" / "overview.py",
    *(AGENT / "watch" / name for name in ("document.py", "docrows.py", "docfields.py")),
    AGENT / "watch" / "sessionstate.py",
    AGENT / "watch" / "outagetext.py",
    AGENT / "transfers" / "progress.py",
    AGENT / "transfers" / "limits.py",
    AGENT / "session" / "faults.py",
    AGENT / "session" / "handshake.py",
    AGENT / "session" / "lifecycle.py",
    AGENT / "session" / "outage.py",
]

IO_LIBRARIES = {"asyncio", "aiohttp", "aiosqlite", "websockets", "prometheus_client"}

ADAPTER_HOMES = {
    "aiohttp": {"corestore/transport.py", "watch/health.py"},
    "websockets": {"session/transport.py"},
    "aiosqlite": {"store/"},
    "prometheus_client": {"watch/metrics.py"},
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
            yield node.args[0].value  # importlib.import_module("agent.entry.app")


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
    """aiohttp, websockets, aiosqlite and prometheus_client are imported only where their
    adapter lives."""
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
    """`agent.entry.app` is wired by the CLI, nothing else in the product."""
    importers = {
        _relative(path)
        for path in AGENT.rglob("*.py")
        if any(name == "agent.entry.app" for name in _imported_roots(path))
    }
    assert importers == {"entry/cli.py"}


def test_the_product_imports_no_stand_in_and_no_test_helper() -> None:
    """No module of `agent/` imports `devstack` (stand-ins, demo) or `tests`."""
    strays = {
        _relative(path): name
        for path in AGENT.rglob("*.py")
        for name in _imported_roots(path)
        if name.split(".")[0] in ("devstack", "tests")
    }
    assert strays == {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(AGENT.rglob("*.py"))}


def _product_imports(path: Path) -> set[str]:
    """The product modules `path` imports, those only for type checking included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return {name for name in found if name in MODULES}


def test_the_table_type_imports_only_the_errors() -> None:
    """`agent/table.py`, the one transition table type, sits on the ground floor: of the
    product it imports only `agent.errors`, so the domain, the protocol and the session share
    it without importing each other."""
    assert _product_imports(AGENT / "table.py") == {"agent.errors"}


def test_the_protocol_depends_only_on_errors_and_contracts() -> None:
    """`agent/protocol/` imports, of the product, only itself, `agent.errors`, contracts and the
    table type `agent.table` (and the optional native codec `agent._bufferform`, a compiled leaf
    that imports nothing)."""
    allowed = (
        "agent.protocol",
        "agent.errors",
        "agent.contracts",
        "agent.table",
        "agent._bufferform",
    )
    strays = {
        module: sorted(name for name in _product_imports(path) if not name.startswith(allowed))
        for module, path in MODULES.items()
        if module.startswith("agent.protocol")
    }
    assert {module: names for module, names in strays.items() if names} == {}


PROTOCOL_INTERNALS = frozenset(
    f"agent.protocol.{name}" for name in ("stream_initiator", "stream_responder", "stream_registry")
)
PROTOCOL_INTERNAL_NAMES = frozenset(
    {"InitiatorStream", "ResponderStream", "StreamRegistry", "PendingChunk"}
)


def _internal_imports(path: Path) -> set[str]:
    """What `path` imports of the protocol's stream machines (modules or names)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in PROTOCOL_INTERNALS)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in PROTOCOL_INTERNALS:
                found.add(node.module)
            elif node.module.startswith("agent.protocol"):
                found.update(
                    f"{node.module}.{a.name}"
                    for a in node.names
                    if a.name in PROTOCOL_INTERNAL_NAMES
                    or f"{node.module}.{a.name}" in PROTOCOL_INTERNALS
                )
    return found


def test_the_stream_machines_stay_inside_the_protocol() -> None:
    """Outside `agent/protocol/` no module of the product, the stand-ins, the benchmarks or the
    tests of other parts imports a stream machine or the stream registry."""
    inside = {AGENT / "protocol", ROOT / "tests" / "protocol"}
    sources = [
        path
        for top in ("agent", "devstack", "bench", "tests")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "node_modules" not in path.parts
    ]
    users = {path for path in sources if _internal_imports(path)}
    assert AGENT / "protocol" / "connection.py" in users, "the rule checks nothing"
    strays = {
        path.relative_to(ROOT).as_posix(): sorted(_internal_imports(path))
        for path in users
        if not any(home in path.parents for home in inside)
    }
    assert strays == {}


def test_the_domain_depends_only_on_errors_and_contracts() -> None:
    """`agent/domain/` imports, of the product, only itself, `agent.errors`, contracts and the
    table type `agent.table`: the engines and the store build on it, it builds on neither (nor
    on any I/O)."""
    allowed = ("agent.domain", "agent.errors", "agent.contracts", "agent.table")
    strays = {
        module: sorted(name for name in _product_imports(path) if not name.startswith(allowed))
        for module, path in MODULES.items()
        if module.startswith("agent.domain")
    }
    assert strays, "no domain modules found: the rule checks nothing"
    assert {module: names for module, names in strays.items() if names} == {}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per node that starts one (empty when the graph has none)."""
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> list[str] | None:
        if node in trail:
            return [*trail[trail.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            cycle = visit(target, [*trail, node])
            if cycle is not None:
                return cycle
        done.add(node)
        return None

    return [cycle for node in sorted(graph) if (cycle := visit(node, [])) is not None]


def _package_of(module: str) -> str:
    """`agent.restore.engine` -> `agent.restore`; a top-level module is its own node."""
    parts = module.split(".")
    return ".".join(parts[:2]) if (AGENT / parts[1]).is_dir() else module


def test_no_product_modules_import_each_other_in_a_circle() -> None:
    """The import graph of `agent/` has no cycle, not even through imports made only for type
    checking (as the old peer <-> peer_types one was)."""
    graph = {module: _product_imports(path) - {module} for module, path in MODULES.items()}
    # A package's __init__ re-exporting its submodules is not a circle with them.
    for module in graph:
        graph[module] = {name for name in graph[module] if not module.startswith(name + ".")}
    assert _cycles(graph) == []


def test_no_product_packages_import_each_other_in_a_circle() -> None:
    """Taking each package of `agent/` as one node (and each top-level module as its own), the
    import graph has no cycle: the store does not import the engines that import it."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module == "agent":
            continue
        source = _package_of(module)
        targets = {_package_of(name) for name in _product_imports(path) if name != "agent"}
        graph.setdefault(source, set()).update(targets - {source})
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    assert {"agent.domain", "agent.store", "agent.restore", "agent.relay"} <= graph.keys()
    assert _cycles(graph) == []


def test_the_wheel_holds_the_daemon_and_nothing_else(tmp_path: Path) -> None:
    """Built from this checkout's pyproject.toml, the wheel has `agent/` files only: no
    stand-in, fake, demo, test or benchmark."""
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".*cache"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path / "dist"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert packaged == {"agent"}
    sources = {name for name in names if name.endswith(".py")}
    expected = {path.relative_to(ROOT).as_posix() for path in AGENT.rglob("*.py")}
    assert sources == expected
    assert "agent/py.typed" in names


def _layout_blocks() -> dict[str, str]:
    """docs/architecture.md's layout of `agent/`: each top-level entry (a module, or a package
    with its own lines) and the text that describes it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    layout = text[text.index("## Layout") : text.index("## Seams")]
    product = layout[layout.index("\nagent/") + 1 :].splitlines()[1:]
    blocks: dict[str, str] = {}
    entry = None
    for line in product:
        if not line.startswith(" "):
            break  # the next top-level directory (devstack/, tests/, ...)
        if not line.startswith("   "):
            entry = line.split()[0]
            blocks[entry] = ""
        assert entry is not None
        blocks[entry] += line + "\n"
    return blocks


def test_the_architecture_layout_names_every_module() -> None:
    """Every module of `agent/` is named in docs/architecture.md's layout, a package's modules
    within its package's entry."""
    blocks = _layout_blocks()
    assert "entry/" in blocks, "the layout was not found: the rule checks nothing"
    missing = []
    for path in sorted(AGENT.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = path.relative_to(AGENT).parts
        entry = parts[0] if len(parts) == 1 else f"{parts[0]}/"
        if path.name not in blocks.get(entry, ""):
            missing.append(path.relative_to(AGENT).as_posix())
    assert missing == []


def _documented_graph() -> dict[str, set[str]]:
    """docs/architecture.md's package graph: each `agent.X -> a, b, ...` line as a set (the
    composition root's "everything" left out)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index("## The package graph") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    lines: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("agent."):
            current, _, targets = line.partition("->")
            current = current.split()[0]
            lines[current] = targets
        elif current is not None and line.startswith(" "):
            lines[current] += " " + line.strip()
    graph: dict[str, set[str]] = {}
    for source, targets in lines.items():
        if not targets or "everything" in targets:
            continue
        words = re.sub(r"\(.*?\)", "", targets).split(",")
        graph[source] = {f"agent.{word.strip()}" for word in words if word.strip()}
    return graph


def test_the_documented_package_graph_is_the_imports() -> None:
    """Each line of docs/architecture.md's package graph names exactly what that package (or
    top-level module) imports of the product, imports for type checking included."""
    documented = _documented_graph()
    assert "agent.store" in documented, "the graph was not found: the rule checks nothing"
    actual: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        if module == "agent":
            continue
        source = _package_of(module)
        targets = {_package_of(name) for name in _product_imports(path) if name != "agent"}
        actual.setdefault(source, set()).update(targets - {source, "agent._bufferform"})
    wrong = {
        source: (
            sorted(actual.get(source, set()) - names),
            sorted(names - actual.get(source, set())),
        )
        for source, names in documented.items()
        if actual.get(source, set()) != names
    }
    assert wrong == {}
