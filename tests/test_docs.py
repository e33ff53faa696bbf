"""Every code sample in the docs runs: ```python blocks of docs/**/*.md and README.md,
and the cheap ```console samples (``multilock key``, ``multilock next``).

Finding and running the samples is scripts/docsamples.py, shared with the newcomer
check (which runs README.md's and docs/quickstart.md's in a clean venv); its
docstring and docs/contributing.md give the conventions. Here the lock URLs point at
this session's servers (its ``postgres_url``... fixtures): a sample whose server is
down is skipped, or fails when backends are required.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_docsamples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docsamples", ROOT / "scripts/docsamples.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docsamples"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


docsamples: Any = _load_docsamples()
_FIXTURES = {
    "postgresql": "postgres_url",
    "postgres": "postgres_url",
    "redis": "redis_url",
    "rediss": "redis_url",
    "zookeeper": "zookeeper_url",
    "zk": "zookeeper_url",
    "etcd": "etcd_url",
    "nats": "nats_url",
    "mysql": "mysql_url",
    "mariadb": "mysql_url",
    "file": "file_url",
}
_CHECKED_COMMANDS = ("multilock key", "multilock next")


def _pages() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def _collect(language: str) -> list[Any]:
    return [s for page in _pages() for s in docsamples.samples(page) if s.language == language]


def _checked_console(sample: Any) -> bool:
    return any(
        line.startswith(f"$ {command} ")
        for line in sample.code.splitlines()
        for command in _CHECKED_COMMANDS
    )


PYTHON = _collect("python")
CONSOLE = [sample for sample in _collect("console") if _checked_console(sample)]
MIRRORS = [s for page in _pages() for s in docsamples.samples(page) if s.source is not None]


def _skip_if_marked(sample: Any) -> None:
    if sample.skip is not None:
        pytest.skip(f"{sample.id}: {sample.skip}")


@pytest.fixture
def _short_run() -> Iterator[None]:
    """``Scheduler.run()`` returns after RUN_SECONDS, as if SIGTERM had come."""
    with docsamples.short_runs():
        yield


@pytest.mark.usefixtures("_short_run")
@pytest.mark.parametrize("sample", PYTHON, ids=[sample.id for sample in PYTHON])
def test_python_sample(sample: Any, request: pytest.FixtureRequest) -> None:
    """The sample runs to the end without an exception."""
    _skip_if_marked(sample)
    if sample.source is not None:
        return  # a mirror of the repository's code (checked below), run by its own tests

    def url_for(scheme: str) -> str:
        url: str = request.getfixturevalue(_FIXTURES[scheme])
        return url

    docsamples.run_python(sample, url_for)


@pytest.mark.parametrize("sample", MIRRORS, ids=[sample.id for sample in MIRRORS])
def test_a_block_that_shows_repository_code_is_that_code(sample: Any) -> None:
    """A block marked ``<!-- source: path:section -->`` is that section, dedented, exactly:
    the page reads in the repository, and what it shows is what runs."""
    expected = textwrap.dedent(docsamples.section(sample.source))
    assert sample.code == expected, (
        f"{sample.id} differs from {sample.source}; paste this block:\n{expected}"
    )


def _commands(code: str) -> Iterator[tuple[str, list[str]]]:
    """Each ``$ command`` line of a console sample, with the output lines shown after it."""
    command: str | None = None
    output: list[str] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            if command is not None:
                yield command, output
            command, output = line[2:], []
        elif command is not None:
            output.append(line)
    if command is not None:
        yield command, output


@pytest.mark.parametrize("sample", CONSOLE, ids=[sample.id for sample in CONSOLE])
def test_console_sample(sample: Any) -> None:
    """``multilock key``/``multilock next`` print exactly what the docs show."""
    _skip_if_marked(sample)
    for command, shown in _commands(sample.code):
        if not command.startswith(_CHECKED_COMMANDS):
            continue  # needs a server or runs forever: shown, not checked
        args = shlex.split(command)
        result = subprocess.run(
            [sys.executable, "-m", "multilock", *args[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"{sample.id}: {command!r} failed: {result.stderr}"
        assert result.stdout.splitlines() == shown, f"{sample.id}: {command!r} prints otherwise"


def test_samples_were_found() -> None:
    """The collector sees the samples (a parser regression would silently test nothing)."""
    assert len(PYTHON) >= 5
    assert CONSOLE
    assert len(MIRRORS) >= 7  # the tutorial shows examples/multilock-sqlite
