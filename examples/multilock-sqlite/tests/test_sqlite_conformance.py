"""The conformance suite, run on the tutorial backend exactly as a third party would."""

from __future__ import annotations

from pathlib import Path

import pytest

from multilock.testing import ConformanceTests


class TestSQLiteConformance(ConformanceTests):
    """Every check of the suite, sync and async, against one SQLite file."""

    @pytest.fixture
    def multilock_url(self, tmp_path: Path) -> str:
        """A fresh database per test: no server to reach, so no ``server_url``."""
        return f"sqlite:///{tmp_path}/locks.db"
