"""memory:// and file:// pass the whole conformance suite, sync and async."""

from __future__ import annotations

import pytest

from multilock.testing import ConformanceTests


class TestMemoryConformance(ConformanceTests):
    """The suite against ``memory://`` (a namespace of this session's own)."""

    @pytest.fixture
    def multilock_url(self, memory_url: str) -> str:
        """The session's memory:// URL."""
        return memory_url


class TestFileConformance(ConformanceTests):
    """The suite against ``file://`` on a fresh directory."""

    @pytest.fixture
    def multilock_url(self, file_url: str) -> str:
        """The session's file:// URL."""
        return file_url
