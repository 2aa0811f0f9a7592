"""The SQLite driver's debug log never carries the statements: node states stay out of logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.store import RevisionStore
from agent.store.startup import quiet_sqlite_logger


async def test_a_debug_root_logger_gets_no_sql_from_the_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With everything at DEBUG, opening and using the store logs no aiosqlite DEBUG line."""
    logging.getLogger("aiosqlite").setLevel(logging.NOTSET)
    caplog.set_level(logging.DEBUG)
    async with await RevisionStore.open(tmp_path / "state") as store:
        await store.list_unfinished()
    driver = [record for record in caplog.records if record.name == "aiosqlite"]
    assert driver == []
    assert logging.getLogger("aiosqlite").level == logging.INFO


def test_an_operator_choice_above_info_is_kept() -> None:
    """A level set higher than INFO (say WARNING) is not lowered."""
    logger = logging.getLogger("aiosqlite")
    logger.setLevel(logging.WARNING)
    try:
        assert quiet_sqlite_logger().level == logging.WARNING
    finally:
        logger.setLevel(logging.NOTSET)
