"""docs/reliability.md shows what a run measured: its table is the one of the committed
results file, and every claim in it passed."""

from __future__ import annotations

from pathlib import Path

from tests.reliability._results import DOC, END, START, load, render

RESULTS = Path(__file__).with_name("results.json")


def test_the_table_is_the_measured_one() -> None:
    rows = load(RESULTS)
    table = DOC.read_text().partition(START)[2].partition(END)[0].strip()
    assert table == render(rows), "regenerate it: python tests/reliability/_results.py FILE"


def test_every_claim_passed() -> None:
    """Or is a known bug, marked xfail (strict) where it is tested."""
    failed = [
        f"{r.fault} on {r.backend}"
        for r in load(RESULTS)
        if r.outcome not in ("passed", "known bug (xfail)")
    ]
    assert not failed, f"the committed run has failures: {failed}"


def test_every_kind_of_fault_is_in_the_table() -> None:
    tests = {r.test.split("::")[0].rsplit("/", 1)[-1] for r in load(RESULTS)}
    here = {p.name for p in Path(__file__).parent.glob("test_rel_*.py")} - {Path(__file__).name}
    assert here <= tests, f"no rows from {sorted(here - tests)}"
