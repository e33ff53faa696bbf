"""The measured results of the reliability tests, and the table of docs/reliability.md.

The tests record one row per claim (fault, backend, what was expected, what was
measured, whether the test passed). A run with ``MULTILOCK_RELIABILITY_RESULTS=PATH``
writes them to PATH as JSON; ``python tests/reliability/_results.py PATH`` then
rewrites the table between the markers of docs/reliability.md from that file.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["DOC", "END", "RESULTS_ENV", "START", "Row", "load", "render", "save", "update_doc"]

RESULTS_ENV = "MULTILOCK_RELIABILITY_RESULTS"
DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
START = "<!-- results:start -->"
END = "<!-- results:end -->"


@dataclass
class Row:
    """One claim and what a run measured of it."""

    fault: str
    backend: str
    expected: str
    measured: str
    test: str
    outcome: str = "passed"


def save(rows: list[Row], path: Path) -> None:
    """Write ``rows`` as JSON, sorted so that reruns diff cleanly."""
    ordered = sorted(rows, key=lambda r: (r.fault, r.backend, r.test))
    path.write_text(json.dumps([asdict(r) for r in ordered], indent=1) + "\n")


def load(path: Path) -> list[Row]:
    """The rows of a results file."""
    return [Row(**row) for row in json.loads(path.read_text())]


def render(rows: list[Row]) -> str:
    """The Markdown table of ``rows``."""
    lines = [
        "| fault | backend | expected | measured | result |",
        "|---|---|---|---|---|",
    ]
    for row in sorted(rows, key=lambda r: (r.fault, r.backend, r.test)):
        cells = [row.fault, row.backend, row.expected, row.measured, row.outcome]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def update_doc(rows: list[Row], doc: Path = DOC) -> None:
    """Replace the table between the markers of ``doc`` with that of ``rows``."""
    text = doc.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{START}\n{render(rows)}\n{END}{tail}")


if __name__ == "__main__":
    update_doc(load(Path(sys.argv[1])))
