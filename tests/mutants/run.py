"""Prove that the fast tests catch every mutant of the catalogue (a CI step: .ci/run).

Usage: ``python tests/mutants/run.py [--jobs N] [NAME ...]``

Each mutant is applied to a copy of the tree (``multilock/``, ``tests/``, the pytest
configuration) in a temporary directory, where the fast tests run against it: the
scheduler's unit tests (tick claims' and bursts' too), the triggers' and the simulation
(fewer scenarios, no shrinking: the first failure is enough). The unmutated copy runs
first and must pass, so that a mutant is only "caught" by tests that pass without it.
Exit status 0 when every mutant was caught; 1 when one survived, or a target text was
not found.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.mutants.catalogue import CATALOGUE, Drift, Mutant, apply  # noqa: E402

FAST_TESTS = (
    "tests/test_scheduler.py",
    "tests/test_bursts.py",
    "tests/test_tick_claims.py",
    "tests/test_triggers.py",
    "tests/sim",
)
SIM_EXAMPLES = "600"  # scenarios of the main simulation test (fewer in the others)
TIMEOUT = 900  # seconds for one run of the fast tests: a mutant that hangs them is caught


@dataclass(frozen=True)
class Outcome:
    """How the fast tests fared on one mutant (or on the unmutated copy)."""

    name: str
    caught: bool
    by: str
    seconds: float


def copy_tree(destination: Path) -> Path:
    """A copy of what the fast tests need, to mutate without touching the checkout."""
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    for directory in ("multilock", "tests"):
        shutil.copytree(ROOT / directory, destination / directory, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


def run_fast_tests(name: str, root: Path, tests: Sequence[str]) -> Outcome:
    """Run ``tests`` on the tree at ``root``, whose ``multilock`` they import."""
    env = dict(os.environ, PYTHONPATH=str(root), MULTILOCK_SIM_SHRINK="0")
    env.setdefault("MULTILOCK_SIM_EXAMPLES", SIM_EXAMPLES)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    began = time.monotonic()
    try:
        done = subprocess.run(
            [*command, *tests],
            cwd=root,  # first on sys.path: the copy's multilock, not the checkout's
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return Outcome(name, True, f"the tests hung (> {TIMEOUT}s)", time.monotonic() - began)
    seconds = time.monotonic() - began
    if done.returncode == 0:
        return Outcome(name, False, "", seconds)
    failed = re.search(r"^FAILED (\S+)", done.stdout, re.MULTILINE)
    if done.returncode != 1 or failed is None:  # not a test failure: a broken mutant
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise Drift(f"mutant {name}: pytest exited {done.returncode}: " + " | ".join(tail))
    return Outcome(name, True, failed.group(1), seconds)


def try_mutant(mutant: Mutant | None, tests: Sequence[str] = FAST_TESTS) -> Outcome:
    """Copy the tree, apply ``mutant`` (None: the unmutated copy), run ``tests``."""
    with tempfile.TemporaryDirectory(prefix="multilock-mutant-") as scratch:
        root = copy_tree(Path(scratch))
        if mutant is not None:
            apply(mutant, root)
        return run_fast_tests("(none)" if mutant is None else mutant.name, root, tests)


def main(argv: list[str]) -> int:
    """Run the catalogue (or the mutants named); print one line per mutant."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run side by side")
    parser.add_argument(
        "--tests", nargs="+", default=list(FAST_TESTS), help="the tests to run on each mutant"
    )
    args = parser.parse_args(argv)
    known = {mutant.name: mutant for mutant in CATALOGUE}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)} (known: {', '.join(known)})")
    chosen = [known[name] for name in args.names] if args.names else list(CATALOGUE)
    try:
        baseline = try_mutant(None, args.tests)
        if baseline.caught:
            print(f"the unmutated tree fails the fast tests ({baseline.by}): fix that first")
            return 1
        print(f"unmutated: the fast tests pass ({baseline.seconds:.0f}s)", flush=True)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = []
            for outcome in pool.map(lambda mutant: try_mutant(mutant, args.tests), chosen):
                verdict = f"caught by {outcome.by}" if outcome.caught else "SURVIVED"
                print(f"{outcome.name:32} {verdict} ({outcome.seconds:.0f}s)", flush=True)
                outcomes.append(outcome)
    except Drift as exc:
        print(exc)
        return 1
    survivors = [outcome.name for outcome in outcomes if not outcome.caught]
    if survivors:
        print(f"{len(survivors)} of {len(outcomes)} mutants survived: {', '.join(survivors)}")
        return 1
    print(f"all {len(outcomes)} mutants were caught")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
