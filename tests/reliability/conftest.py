"""Fixtures of the reliability tests: the results recorder and the fault proxy.

Every test here records what it measured through the ``measured`` fixture; the rows
(and whether their test passed) are written at the end of the session to the file
named by ``MULTILOCK_RELIABILITY_RESULTS``, replacing the rows of the tests that ran.
docs/reliability.md's table is made from that file (see ``_results.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The helpers beside this file are imported as tests.reliability.*: the repository
# root must be importable (pytest's importlib mode does not add it).
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.reliability._results import RESULTS_ENV, Row, load, save  # noqa: E402

Measured = Callable[[str, str, str, str], None]
_ROWS = pytest.StashKey[list[Row]]()
_CALL_OUTCOME = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Remember how each test's call phase went, for its rows."""
    report = yield
    if call.when == "call":
        known = getattr(report, "wasxfail", None) is not None
        outcome = "known bug (xfail)" if known else report.outcome  # type: ignore[attr-defined]
        item.stash[_CALL_OUTCOME] = outcome
    return report


@pytest.fixture(scope="session")
def _all_rows(pytestconfig: pytest.Config) -> Iterator[list[Row]]:
    rows: list[Row] = []
    yield rows
    target = os.environ.get(RESULTS_ENV)
    if target and rows:
        # Merged into what is there: a run of some tests updates only their rows.
        path = Path(target)
        ran = {row.test for row in rows}
        kept = [row for row in load(path) if row.test not in ran] if path.exists() else []
        save(kept + rows, path)


@pytest.fixture
def measured(request: pytest.FixtureRequest, _all_rows: list[Row]) -> Iterator[Measured]:
    """``measured(fault, backend, expected, what_was_measured)``: one row of the table."""
    mine: list[Row] = []

    def add(fault: str, backend: str, expected: str, what: str) -> None:
        mine.append(Row(fault, backend, expected, what, request.node.nodeid))

    yield add
    outcome = request.node.stash.get(_CALL_OUTCOME, "failed")
    for row in mine:
        row.outcome = outcome
    _all_rows.extend(mine)
