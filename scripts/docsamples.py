"""The code samples of the documentation, found and run: shared by tests/test_docs.py and
by the newcomer check, which runs them in a clean venv without pytest.

    python scripts/docsamples.py README.md docs/quickstart.md

runs every ```python block of those pages against the servers of ``MULTILOCK_POSTGRES_URL``,
``MULTILOCK_REDIS_URL`` and ``MULTILOCK_ZOOKEEPER_URL`` (``file://`` gets a fresh
directory), printing one line per sample; exit code 1 if one fails. The conventions
(docs/contributing.md): lock URLs are pointed at the test servers by scheme, keeping
their query options; ``Scheduler.run()`` returns after :data:`RUN_SECONDS`; the job
functions in :data:`STAND_INS` may be called without being defined;
``<!-- test: skip (reason) -->`` before a fence skips it; a block that mirrors a file
of the repository says so with ``<!-- source: path:section -->`` and must match it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN_SECONDS = 1.0
"""How long ``Scheduler.run()`` runs in a sample before it is asked to stop."""
STAND_INS = ("reindex", "run_job", "poll_upstream", "send_digest")
"""Job functions that samples may call without defining them; they do nothing."""
SERVER_ENV = {
    "postgresql": "MULTILOCK_POSTGRES_URL",
    "postgres": "MULTILOCK_POSTGRES_URL",
    "redis": "MULTILOCK_REDIS_URL",
    "rediss": "MULTILOCK_REDIS_URL",
    "zookeeper": "MULTILOCK_ZOOKEEPER_URL",
    "zk": "MULTILOCK_ZOOKEEPER_URL",
    "etcd": "MULTILOCK_ETCD_URL",
    "nats": "MULTILOCK_NATS_URL",
    "mysql": "MULTILOCK_MYSQL_URL",
    "mariadb": "MULTILOCK_MYSQL_URL",
}
"""The environment variable that names the test server of each scheme samples use."""

_FENCE = re.compile(r"^```(\w+)?(.*)$")
_DIRECTIVE = re.compile(r"^<!--\s*(test|source):\s*(.*?)\s*-->$")
_URL = re.compile(
    r"""(?P<q>["'])(?P<scheme>postgresql|postgres|redis|rediss|zookeeper|zk|etcd|nats|mysql|mariadb|file)://"""
    r"""[^"'?]*(?P<query>\?[^"']*)?(?P=q)"""
)
_SECTION = re.compile(r"^(?P<path>[^:]+)(?::(?P<section>[\w-]+))?$")


@dataclass(frozen=True)
class Sample:
    """One fenced block of a Markdown file, and the directive on the line before it."""

    path: Path
    line: int
    language: str
    code: str
    directive: str
    """``test: …`` or ``source: …`` (the comment's text), or ``""``."""

    @property
    def id(self) -> str:
        """``docs/page.md:LINE``: where to find it."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def skip(self) -> str | None:
        """The reason of a ``<!-- test: skip (reason) -->``, or ``None``."""
        kind, _, text = self.directive.partition(": ")
        if kind != "test":
            return None
        if not text.startswith("skip"):
            raise ValueError(f"{self.id}: unknown test directive {text!r}")
        return text

    @property
    def source(self) -> str | None:
        """The ``path:section`` of a ``<!-- source: … -->`` block, or ``None``."""
        kind, _, text = self.directive.partition(": ")
        return text if kind == "source" else None


def samples(path: Path) -> Iterator[Sample]:
    """Every fenced block of the Markdown file ``path``."""
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
            f"{directive.group(1)}: {directive.group(2)}" if directive else "",
        )
        index = end + 1


def section(reference: str) -> str:
    """The text a ``path:section`` reference stands for: the lines between the
    ``--8<-- [start:section]`` and ``--8<-- [end:section]`` markers of the file at
    ``path`` (relative to the repository), or the whole file without a section."""
    match = _SECTION.match(reference)
    if match is None:
        raise ValueError(f"not a path:section reference: {reference!r}")
    text = (ROOT / match.group("path")).read_text(encoding="utf-8")
    name = match.group("section")
    if name is None:
        return text
    start, end = f"--8<-- [start:{name}]", f"--8<-- [end:{name}]"
    if start not in text or end not in text:
        raise ValueError(f"{reference}: no section {name!r} (or it never ends)")
    body = text.split(start, 1)[1].split(end, 1)[0]
    lines = body.split("\n")[1:-1]  # drop the remains of the marker lines
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines) + "\n"


def point_at_servers(code: str, url_for: Callable[[str], str]) -> str:
    """``code`` with each lock URL literal replaced by ``url_for(scheme)``, its query kept."""

    def replace(match: re.Match[str]) -> str:
        url = url_for(match.group("scheme"))
        query = match.group("query") or ""
        if query and "?" in url:
            query = "&" + query[1:]
        return f"{match.group('q')}{url}{query}{match.group('q')}"

    return _URL.sub(replace, code)


def _stand_in(*args: Any, **kwargs: Any) -> None:
    """A job function of a sample: does nothing."""


def run_python(sample: Sample, url_for: Callable[[str], str]) -> None:
    """Execute a ```python sample in a fresh namespace, its URLs pointed by ``url_for``."""
    code = point_at_servers(sample.code, url_for)
    namespace: dict[str, Any] = {"__name__": f"docs_sample_{sample.line}"}
    namespace.update(dict.fromkeys(STAND_INS, _stand_in))
    exec(compile(code, sample.id, "exec"), namespace)


@contextmanager
def short_runs(seconds: float = RUN_SECONDS) -> Iterator[None]:
    """Within: ``Scheduler.run()`` returns after ``seconds``, as if SIGTERM had come."""
    import multilock

    real_run = multilock.Scheduler.run

    def run(self: Any) -> None:
        done = threading.Event()

        def stop_when_due() -> None:
            # Asked again until run() returns: a request before serve() began is a no-op.
            if not done.wait(seconds):
                while not done.wait(0.1):
                    self.request_stop()

        stopper = threading.Thread(target=stop_when_due, daemon=True)
        stopper.start()
        try:
            real_run(self)
        finally:
            done.set()
            stopper.join()

    multilock.Scheduler.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        multilock.Scheduler.run = real_run  # type: ignore[method-assign]


def _url_from_environment(scheme: str) -> str:
    if scheme == "file":
        return f"file://{tempfile.mkdtemp(prefix='multilock-docs-')}"
    name = SERVER_ENV[scheme]
    url = os.environ.get(name)
    if not url:
        raise SystemExit(f"docsamples: set {name}: a sample uses {scheme}://")
    return url


def main(pages: list[str]) -> int:
    """Run the ```python samples of ``pages``; 0 if every one ran, else 1."""
    failed = 0
    for page in pages:
        for sample in samples(Path(page).resolve()):
            if sample.language != "python":
                continue
            if sample.skip is not None:
                print(f"skip {sample.id}: {sample.skip}")
                continue
            try:
                with short_runs():
                    run_python(sample, _url_from_environment)
            except Exception:
                failed += 1
                print(f"FAIL {sample.id}", file=sys.stderr)
                traceback.print_exc()
                continue
            print(f"ok   {sample.id}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python scripts/docsamples.py PAGE.md...")
    sys.exit(main(sys.argv[1:]))
