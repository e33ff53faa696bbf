"""The package's layers import downwards only (the map is in docs/concepts.md).

Every ``import`` of every module of ``multilock`` -- at module level or inside a
function, ``TYPE_CHECKING`` blocks included -- is read from the source and checked
against the layer table below: a module may import its own part and the parts
below it, never one above. The lock contract knows nothing of the scheduler, the
scheduler nothing of the command line or the test suite.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "multilock"

# Each part and what it may import besides itself; a part is a module or subpackage
# right under multilock/. Leaves first.
ALLOWED: dict[str, set[str]] = {
    part: set(below.split())
    for part, below in {
        "errors": "",
        "_durations": "errors",
        "_masking": "",
        "_signal": "",
        "_url": "_durations _masking errors",
        "abc": "_durations _signal _url errors",
        "_locks": "_durations _masking _signal _url abc errors",
        "backend": "_durations _locks _signal _url abc errors",
        "_scheduling": "_durations _masking _signal _url abc errors _locks",
        "integrations": "_durations abc errors _locks _scheduling",
        "testing": "_durations _url abc backend errors _locks __init__",
        "_cli": "_durations _masking _url abc backend errors _locks _scheduling testing __init__",
        "__init__": "_durations _locks _scheduling _signal abc backend errors integrations testing",
        "__main__": "_cli",
    }.items()
}


def _part(module: Path) -> str:
    relative = module.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def _imported_parts(module: Path, source: str | None = None) -> set[str]:
    """The parts of multilock that ``module`` (or ``source`` read as if it were
    ``module``) imports, whatever the form."""
    tree = ast.parse(module.read_text() if source is None else source, str(module))
    package = ["multilock", *module.relative_to(PACKAGE).parent.parts]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                dotted = ".".join([*base, node.module] if node.module else base)
                targets = [dotted] if node.module else [f"{dotted}.{a.name}" for a in node.names]
            elif node.module:
                targets = [node.module]
                if node.module == "multilock":
                    targets = [f"multilock.{alias.name}" for alias in node.names]
        for target in targets:
            parts = target.split(".")
            if parts[0] != "multilock":
                continue
            if len(parts) == 1:
                found.add("__init__")
            elif (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").exists():
                found.add(parts[1])
            else:  # a name the package's __init__ defines (multilock.connect, ...)
                found.add("__init__")
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_part_is_in_the_table() -> None:
    parts = {_part(module) for module in MODULES}
    assert parts == set(ALLOWED), "add the new part to ALLOWED and to docs/concepts.md's map"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_downwards(module: Path) -> None:
    own = _part(module)
    wrong = _imported_parts(module) - ALLOWED[own] - {own}
    assert not wrong, f"multilock/{module.relative_to(PACKAGE)} ({own}) imports {sorted(wrong)}"


def test_the_check_sees_an_upward_import() -> None:
    """The reader finds relative, absolute and nested imports alike."""
    source = (
        "from .._scheduling import scheduler\n"
        "def later():\n    import multilock._cli._app\n"
        "from multilock import testing\n"
        "from . import outcome\n"
    )
    found = _imported_parts(PACKAGE / "_locks" / "base.py", source)
    assert found == {"_scheduling", "_cli", "testing", "_locks"}


def _private_lookups(module: Path, source: str | None = None) -> list[str]:
    """Where ``module`` looks a private attribute up by name (``getattr``, ``hasattr``)
    on anything but ``self``/``cls``: a contract reached by a name nobody declared."""
    tree = ast.parse(module.read_text() if source is None else source, str(module))
    found: list[str] = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
        ):
            continue
        target, name = node.args[0], node.args[1]
        if isinstance(target, ast.Name) and target.id in ("self", "cls"):
            continue
        text = name.value if isinstance(name, ast.Constant) else None
        if isinstance(text, str) and text.startswith("_") and not text.endswith("__"):
            found.append(f"line {node.lineno}: {node.func.id}(..., {text!r})")
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_lookup_by_name(module: Path) -> None:
    """An optional method is a protocol of ``multilock.abc`` checked with ``isinstance``
    (see docs/decisions.md), never a private name probed with ``getattr``."""
    wrong = _private_lookups(module)
    assert not wrong, f"multilock/{module.relative_to(PACKAGE)}: {wrong}"


def test_the_check_sees_a_private_lookup() -> None:
    source = (
        "start = getattr(locker, '_try_acquire_many_started', None)\n"
        "ok = getattr(self, '_own', None)\n"
        "call = getattr(func, '__call__', None)\n"
        "has = hasattr(lease, '_release_started')\n"
    )
    found = _private_lookups(PACKAGE / "_scheduling" / "scheduler.py", source)
    assert found == [
        "line 1: getattr(..., '_try_acquire_many_started')",
        "line 4: hasattr(..., '_release_started')",
    ]
