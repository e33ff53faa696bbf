"""Every code sample in the docs runs: ```python blocks of docs/**/*.md and README.md,
and the cheap ```console samples (``multilock key``, ``multilock next``).

The conventions (documented in docs/contributing.md):

* A sample's lock URLs are pointed at the test servers by scheme: the string
  literal ``"postgresql://app@db/app"`` runs against the session's
  ``postgres_url`` (``redis://`` -> ``redis_url``, ``zookeeper://`` ->
  ``zookeeper_url``, ``file://`` -> a fresh directory); the query options stay.
  A sample whose server is down is skipped, or fails when backends are required.
* ``scheduler.run()`` in a sample runs for :data:`RUN_SECONDS`, then stops as on
  SIGTERM.
* The job functions samples call without defining them are stand-ins, listed in
  :data:`STAND_INS`.
* A block made only of snippet includes (``--8<-- "path:section"``, as the
  tutorial shows the code of examples/multilock-sqlite) must name a section that
  exists and compiles; that code runs in its own distribution's tests.
* ``<!-- test: skip (reason) -->`` on the line before a fence skips the sample.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import multilock

ROOT = Path(__file__).resolve().parent.parent
RUN_SECONDS = 1.0
"""How long ``Scheduler.run()`` runs in a sample before it is asked to stop."""
STAND_INS = ("reindex", "run_job", "poll_upstream", "send_digest")
"""Job functions that samples may call without defining them; they do nothing."""

_FENCE = re.compile(r"^```(\w+)?(.*)$")
_DIRECTIVE = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->$")
_URL = re.compile(
    r"""(?P<q>["'])(?P<scheme>postgresql|postgres|redis|rediss|zookeeper|zk|file)://"""
    r"""[^"'?]*(?P<query>\?[^"']*)?(?P=q)"""
)
_FIXTURES = {
    "postgresql": "postgres_url",
    "postgres": "postgres_url",
    "redis": "redis_url",
    "rediss": "redis_url",
    "zookeeper": "zookeeper_url",
    "zk": "zookeeper_url",
    "file": "file_url",
}
_CHECKED_COMMANDS = ("multilock key", "multilock next")
_INCLUDE = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"$')


@dataclass(frozen=True)
class Sample:
    """One fenced block of a Markdown file."""

    path: Path
    line: int
    language: str
    code: str
    directive: str

    @property
    def id(self) -> str:
        """``docs/page.md:LINE``: where to find it."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _samples(path: Path) -> Iterator[Sample]:
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        start = index
        end = start + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        previous = next((text for text in reversed(lines[:start]) if text.strip()), "")
        directive = _DIRECTIVE.match(previous.strip())
        yield Sample(
            path,
            start + 1,
            match.group(1) or "",
            "\n".join(lines[start + 1 : end]) + "\n",
            directive.group(1) if directive else "",
        )
        index = end + 1


def _pages() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]


def _collect(language: str) -> list[Sample]:
    return [s for page in _pages() for s in _samples(page) if s.language == language]


def _checked_console(sample: Sample) -> bool:
    return any(
        line.startswith(f"$ {command} ")
        for line in sample.code.splitlines()
        for command in _CHECKED_COMMANDS
    )


PYTHON = _collect("python")
CONSOLE = [sample for sample in _collect("console") if _checked_console(sample)]


def _skip_if_marked(sample: Sample) -> None:
    if sample.directive.startswith("skip"):
        pytest.skip(f"{sample.id}: {sample.directive}")
    if sample.directive:
        raise AssertionError(f"{sample.id}: unknown test directive {sample.directive!r}")


def _point_at_test_servers(code: str, request: pytest.FixtureRequest) -> str:
    def replace(match: re.Match[str]) -> str:
        url: str = request.getfixturevalue(_FIXTURES[match.group("scheme")])
        query = match.group("query") or ""
        if query and "?" in url:
            query = "&" + query[1:]
        return f"{match.group('q')}{url}{query}{match.group('q')}"

    return _URL.sub(replace, code)


def _stand_in(*args: Any, **kwargs: Any) -> None:
    """A job function of a sample: does nothing."""


@pytest.fixture
def _short_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Scheduler.run()`` returns after RUN_SECONDS, as if SIGTERM had come."""
    real_run = multilock.Scheduler.run

    def run(self: multilock.Scheduler) -> None:
        done = threading.Event()

        def stop_when_due() -> None:
            # Asked again until run() returns: a request before serve() began is a no-op.
            if not done.wait(RUN_SECONDS):
                while not done.wait(0.1):
                    self.request_stop()

        stopper = threading.Thread(target=stop_when_due, daemon=True)
        stopper.start()
        try:
            real_run(self)
        finally:
            done.set()
            stopper.join()

    monkeypatch.setattr(multilock.Scheduler, "run", run)


def _included(line: str, sample: Sample) -> str:
    """The text a snippet include line stands for (pymdownx.snippets' sections)."""
    match = _INCLUDE.match(line)
    assert match is not None, f"{sample.id}: not a snippet include: {line!r}"
    text = (ROOT / match.group("path")).read_text(encoding="utf-8")
    section = match.group("section")
    if section is None:
        return text
    start, end = f"--8<-- [start:{section}]", f"--8<-- [end:{section}]"
    assert start in text, f"{sample.id}: no section {section!r} in {line}"
    assert end in text, f"{sample.id}: section {section!r} of {line} never ends"
    body = text.split(start, 1)[1].split(end, 1)[0]
    return body.split("\n", 1)[1].rsplit("\n", 1)[0]  # drop the marker lines' remains


def _is_include(sample: Sample) -> bool:
    lines = [line for line in sample.code.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("--8<--") for line in lines)


@pytest.mark.usefixtures("_short_run")
@pytest.mark.parametrize("sample", PYTHON, ids=[sample.id for sample in PYTHON])
def test_python_sample(sample: Sample, request: pytest.FixtureRequest) -> None:
    """The sample runs to the end without an exception."""
    _skip_if_marked(sample)
    if _is_include(sample):
        for line in sample.code.split("\n"):
            if line.strip():
                included = textwrap.dedent(_included(line, sample))
                assert included.strip(), f"{sample.id}: {line} includes nothing"
                compile(included, f"{sample.id} {line}", "exec")
        return
    code = _point_at_test_servers(sample.code, request)
    namespace: dict[str, Any] = {"__name__": f"docs_sample_{sample.line}"}
    namespace.update(dict.fromkeys(STAND_INS, _stand_in))
    exec(compile(code, sample.id, "exec"), namespace)


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
def test_console_sample(sample: Sample) -> None:
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
