"""The model check finds defects no hand-written check names, and shrinks them.

The backend is ``tests/model_toy.py``: a correct cross-process TTL backend, or
the same with one defect. Child processes find it through an entry point this
module writes into a directory put on ``sys.path`` (the children inherit it).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from multilock.testing import Harness
from multilock.testing import _checks_model as model
from multilock.testing._checks_model import model_checked_history

_TESTS = Path(__file__).parent


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The toy backend, found through an entry point; the URL of a fresh table."""
    dist = tmp_path / "site" / "modeltoy-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: modeltoy\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[multilock.backends]\nmodeltoy = model_toy:backend\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(_TESTS))
    return f"modeltoy://{tmp_path}/table.json"


def _failure(url: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The model check's failure report on ``url`` (the test fails if it passes).

    The budget is the suite's, except that the search may go on for longer (it stops
    at the first failure: a defect found only now and then would make this test
    flaky). Shrinking gets the suite's own time: cut to 8 s, it left histories of 7
    steps now and then on a slower host.
    """
    budget = dataclasses.replace(model.EXPIRING_BUDGET, seconds=60.0)
    monkeypatch.setattr(model, "EXPIRING_BUDGET", budget)
    with pytest.raises(AssertionError) as caught:
        Harness(url, kind).run(model_checked_history)
    return str(caught.value)


def _steps(report: str) -> list[str]:
    """The steps of the failing history, as the report lists them."""
    history = report.split(model.HISTORY, 1)[1]
    return re.findall(r"^\s+\[\s*[\d.]+s\] (.*)$", history, re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_correct_toy_passes(toy: str, kind: str) -> None:
    """The control: the same backend without a defect passes."""
    Harness(toy, kind).run(model_checked_history)


@pytest.mark.slow
def test_stale_extend_is_caught(toy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An extend() that succeeds whether or not the lease is still there: once the
    lease has expired, it says "extended" and extends nothing. Shrunk, the history
    is an acquire, the time passing, the extend and what shows it was a lie: the
    name granted to another acquire, missing from locks(), or, if another locker took
    it first, the extend that should have raised LockLost."""
    report = _failure(f"{toy}?flaw=stale-extend", "sync", monkeypatch)
    # Which lease lies depends on the history found: lease0, or lease1 of a batch.
    lies = (r"must raise LockLost", r"which lease\d+ holds")
    assert any(re.search(lie, report) for lie in lies), report
    steps = _steps(report)
    # Minimal for the path found, which varies: an acquire, the time, the extend and
    # the other grant (4 lines), or through a close and a batch (7; a batch lists a
    # line a name).
    assert len(steps) <= 8, report
    assert any("pass, to past every expiry" in step for step in steps), report
    assert any(re.match(r"lease\d+\.extend\([\d.]*\) -> ok", step) for step in steps), report


@pytest.mark.slow
def test_per_process_tokens_are_caught(toy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Owner tokens unique only within one process: another process hands out the
    same token, which the check sees at the first such grant."""
    report = _failure(f"{toy}?flaw=process-tokens", "async", monkeypatch)
    assert re.search(r"owner token '\d+' was handed out before, to lease\d+ \(L\d\)", report)
    # The clash is with a token of an earlier history: the steps that move a process's
    # token counter to it stay (each one left out, the failure goes away), so the
    # history is short but not always one grant (seen: 1 to 5 steps).
    assert len(_steps(report)) <= 6, report
