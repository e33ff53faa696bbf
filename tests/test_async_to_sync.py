"""scripts/async_to_sync.py: the sync code written from the async source, and its rules.

Each test runs the script as CI does, on a small tree of its own (``--root``,
``--rules``), and looks at what it wrote and said.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "async_to_sync.py"

PACKAGE_RULES = """
[names]
__aenter__ = "__enter__"
__aexit__ = "__exit__"

[[package]]
source = "pkg/_async"
target = "pkg/_sync"
[package.names]
AsyncThing = "Thing"
AsyncIterator = "Iterator"
"""

ASYNC_MODULE = '''\
"""Async things; this docstring says AsyncThing and stays as written."""

from collections.abc import AsyncIterator

__all__ = ["AsyncThing"]


class AsyncThing:
    """An AsyncThing."""

    async def __aenter__(self) -> "AsyncThing":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()  # await this, in a comment, stays

    async def close(self) -> None:
        async with self:
            pass

    async def items(self, source: AsyncIterator[int]) -> list[int]:
        return [item async for item in source]
'''

SYNC_MODULE = '''\
# Generated from pkg/_async/things.py
# by scripts/async_to_sync.py: do not edit; change that file and rerun.
"""Async things; this docstring says AsyncThing and stays as written."""

from collections.abc import Iterator

__all__ = ["Thing"]


class Thing:
    """An AsyncThing."""

    def __enter__(self) -> "Thing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # await this, in a comment, stays

    def close(self) -> None:
        with self:
            pass

    def items(self, source: Iterator[int]) -> list[int]:
        return [item for item in source]
'''


def write(root: Path, files: dict[str, str]) -> Path:
    """``files`` (dedented) written under ``root``; ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def generate(root: Path, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(script), "--rules", str(root / "rules.toml")]
    command += ["--root", str(root), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def generate_and_check(root: Path) -> None:
    """Generate, then ``--check``: what was just written is current."""
    first = generate(root)
    assert first.returncode == 0, first.stderr
    again = generate(root, "--check")
    assert (again.returncode, again.stderr) == (0, "")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write(tmp_path, {"rules.toml": PACKAGE_RULES, "pkg/_async/things.py": ASYNC_MODULE})


def test_package_module_generated_with_its_header(tree: Path) -> None:
    generate_and_check(tree)
    assert (tree / "pkg/_sync/things.py").read_text() == SYNC_MODULE


def test_check_names_a_stale_file_and_shows_the_diff(tree: Path) -> None:
    assert generate(tree).returncode == 0
    source = tree / "pkg/_async/things.py"
    source.write_text(source.read_text().replace("pass", "print()"))
    done = generate(tree, "--check")
    assert done.returncode == 1
    assert "pkg/_sync/things.py" in done.stderr
    assert "+            print()" in done.stderr
    quiet = generate(tree, "--check", "--quiet")
    assert quiet.returncode == 1
    assert "print()" not in quiet.stderr


def test_a_rule_that_matches_nothing_fails(tree: Path) -> None:
    rules = tree / "rules.toml"
    rules.write_text(rules.read_text() + 'AsyncGone = "Gone"\n')
    done = generate(tree)
    assert done.returncode == 1
    assert "pkg/_async: AsyncGone = 'Gone' matches nothing" in done.stderr
    assert not (tree / "pkg/_sync/things.py").exists()  # nothing written


def test_a_common_rule_that_matches_nothing_fails(tree: Path) -> None:
    rules = tree / "rules.toml"
    rules.write_text(rules.read_text().replace("[names]\n", '[names]\naclose = "close"\n'))
    done = generate(tree, "--check")
    assert done.returncode == 1
    assert "[names]: aclose = 'close' matches nothing" in done.stderr


def test_async_only_statements_are_left_out_with_their_comments(tree: Path) -> None:
    write(
        tree,
        {
            "pkg/_async/things.py": ASYNC_MODULE
            + textwrap.dedent(
                """
                # Why the next function exists.
                # async-only: asyncio has it, threads do not
                async def gather_all(thing: AsyncThing) -> None:
                    await thing.close()


                def kept() -> None:
                    # async-only
                    print("dropped")
                    print("kept")
                """
            )
        },
    )
    assert generate(tree).returncode == 0
    text = (tree / "pkg/_sync/things.py").read_text()
    assert "gather_all" not in text
    assert "Why the next function" not in text
    assert 'print("dropped")' not in text
    assert text.endswith('def kept() -> None:\n    print("kept")\n')


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "from x import AsyncOther\n\nvalue = AsyncOther\n",
            "pkg/_async/other.py:1: no rule renames AsyncOther for the sync code (add a rule"
            " to async_to_sync.toml, or mark the statement # async-only)",
        ),
        (
            "x = 1\n# async-only\n\ny = 2\n",
            "pkg/_async/other.py:2: # async-only is not directly above a statement",
        ),
        (
            "x = 1  # async-only\n",
            "pkg/_async/other.py:1: # async-only must be a line of its own",
        ),
        (
            "# sync-by-hand\nx = 1\n",
            "pkg/_async/other.py:1: # sync-by-hand applies to classes only",
        ),
    ],
    ids=["async-name-without-rule", "marker-above-nothing", "marker-inline", "by-hand-in-package"],
)
def test_a_source_it_cannot_convert_fails_in_one_line(
    tree: Path, source: str, message: str
) -> None:
    write(tree, {"pkg/_async/other.py": source})
    done = generate(tree)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"scripts/async_to_sync.py: {message}"]


def test_a_generated_module_whose_source_is_gone_goes(tree: Path) -> None:
    assert generate(tree).returncode == 0
    (tree / "pkg/_sync/helper.py").write_text("# written by hand: stays\n")
    (tree / "pkg/_async/things.py").rename(tree / "pkg/_async/renamed.py")
    done = generate(tree, "--check")
    assert done.returncode == 1
    assert "pkg/_sync/things.py: its async source is gone" in done.stderr
    assert generate(tree).returncode == 0
    assert not (tree / "pkg/_sync/things.py").exists()
    assert (tree / "pkg/_sync/renamed.py").exists()
    assert (tree / "pkg/_sync/helper.py").exists()


CLASS_RULES = """
[names]
aclose = "close"

[[module]]
path = "core.py"
classes = { AsyncLocker = "Locker" }
"""

CLASS_MODULE = '''\
"""Both APIs in one module."""


class Base:
    """Sync base."""


class AsyncBase:
    """Async base."""


class Locker(Base):
    """The sync locker: its docstring and its close are written by hand."""

    def close(self) -> None:
        """Close, as the sync API does."""

    # Generated from AsyncLocker by scripts/async_to_sync.py: edit that class and rerun.
    def stale(self) -> None:
        pass


class AsyncLocker(AsyncBase):
    """The async locker."""

    value = 1

    # sync-by-hand: shielded from cancellation
    async def aclose(self) -> None:
        """Close, shielded."""

    # async-only
    def started(self) -> None:
        pass

    # Kept with the method below.
    async def get(self) -> "AsyncLocker":
        await self.aclose()
        return self


def after() -> None:
    """Module code after the classes stays."""
'''

GENERATED_CLASS = '''\
class Locker(Base):
    """The sync locker: its docstring and its close are written by hand."""

    def close(self) -> None:
        """Close, as the sync API does."""

    # Generated from AsyncLocker by scripts/async_to_sync.py: edit that class and rerun.
    value = 1

    # Kept with the method below.
    def get(self) -> "Locker":
        self.close()
        return self
'''


@pytest.fixture
def module(tmp_path: Path) -> Path:
    return write(tmp_path, {"rules.toml": CLASS_RULES, "core.py": CLASS_MODULE})


def test_sync_class_generated_below_its_hand_written_part(module: Path) -> None:
    generate_and_check(module)
    text = (module / "core.py").read_text()
    assert GENERATED_CLASS in text
    assert text.replace(GENERATED_CLASS, "") == CLASS_MODULE.replace(
        CLASS_MODULE[CLASS_MODULE.index("class Locker") : CLASS_MODULE.index("class AsyncLocker")],
        "\n\n",
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('    def close(self) -> None:\n        """Close, as the sync API does."""\n', ""),
            "core.py: AsyncLocker.close is # sync-by-hand, but Locker has no hand-written"
            " close above its generated part",
        ),
        (
            ('    """Close, as the sync API does."""\n', '    """..."""\n\n    value = 2\n'),
            "core.py: Locker.value is written by hand, but generated from AsyncLocker too:"
            " mark the async one # sync-by-hand",
        ),
        (
            ("    # Generated from AsyncLocker by scripts/async_to_sync.py", "    # Written"),
            "core.py: class Locker has no line '# Generated from AsyncLocker by"
            " scripts/async_to_sync.py: edit that class and rerun.' where its hand-written"
            " part ends",
        ),
        (
            ('def after() -> None:\n    """', '# async-only\ndef after() -> None:\n    """'),
            "core.py:42: # async-only outside a class the sync one is generated from",
        ),
        (
            (
                "        await self.aclose()\n",
                "        # sync-by-hand\n        await self.aclose()\n",
            ),
            "core.py:38: # sync-by-hand marks a statement inside a member, not a member",
        ),
        (
            ("class Locker(Base):", "class Lockers(Base):"),
            "core.py: no top-level class Locker",
        ),
    ],
    ids=[
        "by-hand-missing",
        "hand-written-and-generated",
        "no-generated-line",
        "stray",
        "by-hand-nested",
        "gone",
    ],
)
def test_class_generation_refuses_what_it_cannot_do_right(
    module: Path, change: tuple[str, str], message: str
) -> None:
    path = module / "core.py"
    assert change[0] in path.read_text()
    path.write_text(path.read_text().replace(*change))
    done = generate(module)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"scripts/async_to_sync.py: {message}"]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ('[names]\nfoo = "bar"\n[extra]\n', "async_to_sync.toml: unknown key(s) extra"),
        ('[names]\n"not a name" = "x"\n', "[names]: 'not a name' is not a Python name"),
        ('[names]\nfoo = "foo"\n', "[names]: foo is renamed to itself"),
        (
            '[names]\nfoo = "bar"\n[[package]]\nsource = "a"\ntarget = "b"\n'
            '[package.names]\nfoo = "baz"\n',
            "a: foo renamed otherwise than in [names]",
        ),
        ('[[module]]\npath = "core.py"\n', "[[module]] #1 (core.py): no classes to generate"),
        ("[names\n", "async_to_sync.toml: Expected ']' at the end of a table declaration"),
    ],
    ids=["unknown-key", "not-a-name", "to-itself", "clash", "no-classes", "not-toml"],
)
def test_a_bad_rules_file_is_one_line(tmp_path: Path, rules: str, message: str) -> None:
    (tmp_path / "async_to_sync.toml").write_text(rules)
    command = [sys.executable, str(SCRIPT), "--rules", str(tmp_path / "async_to_sync.toml")]
    done = subprocess.run(
        [*command, "--root", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"scripts/async_to_sync.py: {message}")


def test_the_repository_generated_code_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
