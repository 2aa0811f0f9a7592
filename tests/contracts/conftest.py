"""Fixtures of the contract tests: the Node oracle (skipped cleanly without `node`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.contracts.node_oracle import NodeOracle, node_executable


@pytest.fixture(name="oracle", scope="session")
def _oracle() -> Iterator[NodeOracle]:
    node = node_executable()
    if node is None:
        pytest.skip("node is not on PATH: the seed oracle cannot run")
    oracle = NodeOracle(node)
    yield oracle
    oracle.close()
