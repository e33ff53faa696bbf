"""The mutation catalogue stays in step with the code: every mutant's target text is
still there, exactly once, and the mutated module still compiles (``run.py`` then
proves, in CI, that the fast tests fail on each)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .catalogue import CATALOGUE, Mutant, apply

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalogue_has_at_least_fifteen_distinct_bugs() -> None:
    names = [mutant.name for mutant in CATALOGUE]
    assert len(set(names)) == len(names) >= 15


@pytest.mark.parametrize("mutant", CATALOGUE, ids=[mutant.name for mutant in CATALOGUE])
def test_the_mutant_still_applies_to_the_code(mutant: Mutant, tmp_path: Path) -> None:
    original = ROOT / mutant.path
    target = tmp_path / mutant.path
    target.parent.mkdir(parents=True)
    shutil.copy2(original, target)
    apply(mutant, tmp_path)
    mutated = target.read_text()
    assert mutated != original.read_text()
    compile(mutated, str(target), "exec")
