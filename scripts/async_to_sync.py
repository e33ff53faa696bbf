"""Write the sync code from its async source, for the whole repo (core and backends).

    python scripts/async_to_sync.py          # rewrite everything generated
    python scripts/async_to_sync.py --check  # CI: fail if anything generated is stale

What to generate and which names to rename is in ``scripts/async_to_sync.toml``:
packages (every module of an ``_async/`` directory becomes one of ``_sync/``) and
classes (a sync class of a module generated from an async class of the same module,
below a line that says so). Each rename rule must match at least once in its scope,
or the run fails: a rule that no longer matches is a rule to delete.

The rewrite works on tokens, so comments and layout survive: ``async``/``await``
go, the names of the rules are replaced, and the output goes through ruff. A
statement of the async source below a ``# async-only`` comment line is left out of
the sync code; a class member below ``# sync-by-hand`` is written by hand in the
sync class, above its generated part. See docs/contributing.md.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import keyword
import re
import subprocess
import sys
import tempfile
import token
import tokenize
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = Path(__file__).resolve().with_suffix(".toml")
SCRIPT = "scripts/async_to_sync.py"

# The markers of the async source, each a comment line of its own directly above
# the statement (or its decorators) it applies to; text may follow after a colon.
ASYNC_ONLY = "async-only"
BY_HAND = "sync-by-hand"
_MARKER = re.compile(rf"#\s*({ASYNC_ONLY}|{BY_HAND})\s*(?::.*)?$")
# A name the sync code must not keep: an async twin whose rule is missing.
_ASYNC_NAME = re.compile(r"_?Async[A-Z]\w*|_?async_\w+|__a(?:enter|exit|iter|next)__")
# The line that opens the generated part of a sync class.
_CLASS_LINE = "# Generated from {source} by " + SCRIPT + ": edit that class and rerun."
_CLASS_LINE_RE = re.compile(r"[ \t]*# Generated from (\w+) by " + re.escape(SCRIPT) + r"\b.*\n?")
_FILE_HEADER = (
    "# Generated from {source}\n# by " + SCRIPT + ": do not edit; change that file and rerun.\n"
)
_FILE_HEADER_RE = re.compile(r"# Generated from \S+\n# by " + re.escape(SCRIPT) + ":")
_FSTRING_START = getattr(token, "FSTRING_START", None)  # Python 3.12+
_FSTRING_END = getattr(token, "FSTRING_END", None)


class RuleError(Exception):
    """The rules or a source cannot be turned into sync code: one line says why."""


# --- the rules ---------------------------------------------------------------------


@dataclass
class Scope:
    """A set of renames and the code it applies to; counts what each rule matched."""

    label: str
    names: dict[str, str]
    used: Counter[str] = field(default_factory=Counter)


@dataclass
class Package:
    """Every module of ``source`` (an ``_async/`` directory) becomes one of ``target``."""

    source: str
    target: str
    scope: Scope


@dataclass
class Module:
    """The sync classes of one module, generated from its async classes."""

    path: str
    classes: dict[str, str]
    scope: Scope


@dataclass
class Rules:
    """The whole rules file."""

    root: Path  # what the paths are relative to: the repository
    common: Scope
    packages: list[Package]
    modules: list[Module]

    def scopes(self) -> Iterator[Scope]:
        """Every scope, the common one first."""
        yield self.common
        yield from (p.scope for p in self.packages)
        yield from (m.scope for m in self.modules)


def _table(value: object, where: str, keys: set[str]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RuleError(f"{where}: expected a table")
    unknown = set(value) - keys
    if unknown:
        raise RuleError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    return value


def _names(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise RuleError(f'{where}: expected a table of name = "new name"')
    for old, new in value.items():
        for name in (old, new):
            if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
                raise RuleError(f"{where}: {name!r} is not a Python name")
        if old == new:
            raise RuleError(f"{where}: {old} is renamed to itself")
    return dict(value)


def _path(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        raise RuleError(f"{where}: expected a path relative to the repository")
    return value.rstrip("/")


def _scoped(common: dict[str, str], own: dict[str, str], label: str) -> Scope:
    clash = sorted(n for n in own.keys() & common.keys() if own[n] != common[n])
    if clash:
        raise RuleError(f"{label}: {', '.join(clash)} renamed otherwise than in [names]")
    return Scope(label, own)


def load_rules(path: Path = RULES, root: Path = ROOT) -> Rules:
    """The rules file, checked: unknown keys, non-names and clashing renames fail."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RuleError(f"{path.name}: {exc}") from None
    top = _table(data, path.name, {"names", "package", "module"})
    common = _names(top.get("names", {}), "[names]")
    packages = []
    for i, raw in enumerate(_list(top.get("package", []), "[[package]]")):
        where = f"[[package]] #{i + 1}"
        entry = _table(raw, where, {"source", "target", "names"})
        source, target = _path(entry.get("source"), where), _path(entry.get("target"), where)
        own = _names(entry.get("names", {}), f"{where} ({source})")
        packages.append(Package(source, target, _scoped(common, own, source)))
    modules = []
    for i, raw in enumerate(_list(top.get("module", []), "[[module]]")):
        where = f"[[module]] #{i + 1}"
        entry = _table(raw, where, {"path", "classes", "names"})
        module_path = _path(entry.get("path"), where)
        classes = _names(entry.get("classes", {}), f"{where} ({module_path}) classes")
        if not classes:
            raise RuleError(f"{where} ({module_path}): no classes to generate")
        own = _names(entry.get("names", {}), f"{where} ({module_path})")
        clash = sorted(n for n in classes.keys() & own.keys() if classes[n] != own[n])
        if clash:
            raise RuleError(f"{module_path}: {', '.join(clash)} renamed twice")
        scope = _scoped(common, {**own, **classes}, module_path)
        modules.append(Module(module_path, classes, scope))
    return Rules(root, Scope("[names]", common), packages, modules)


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise RuleError(f"{where}: expected an array of tables")
    return value


# --- the rewrite ---------------------------------------------------------------------


@dataclass
class Line:
    """One line of the async source, rewritten; ``text`` is ``None`` when left out."""

    text: str | None
    used: list[str] = field(default_factory=list)
    leftover: list[str] = field(default_factory=list)


@dataclass
class Marker:
    """A ``# async-only`` or ``# sync-by-hand`` line and the statement it marks."""

    kind: str
    row: int  # 1-based, as ast and tokenize count
    statement: ast.stmt


@dataclass
class Source:
    """An async module rewritten line by line, with its tree and markers."""

    path: str
    raw: list[str]  # the async source's lines
    lines: list[Line]
    tree: ast.Module
    markers: dict[int, Marker]  # by the first row of the statement they mark

    def text(self, first: int, last: int, scope: Scope, common: Scope) -> str:
        """Rows ``first..last`` (1-based, inclusive) of the sync code; counts their
        renames and fails on an async name no rule renames."""
        out = []
        for row in range(first, last + 1):
            line = self.lines[row - 1]
            if line.text is None:
                continue
            if line.leftover:
                raise RuleError(
                    f"{self.path}:{row}: no rule renames {line.leftover[0]} for the sync code"
                    f" (add a rule to {RULES.name}, or mark the statement # {ASYNC_ONLY})"
                )
            for name in line.used:
                (scope if name in scope.names else common).used[name] += 1
            out.append(line.text)
        return "".join(out)


def first_row(node: ast.stmt) -> int:
    """The first row of a statement, its decorators included."""
    rows = [node.lineno]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        rows += [d.lineno for d in node.decorator_list]
    return min(rows)


def _comment_rows(lines: list[str], row: int) -> int:
    """The first row of the comment lines directly above ``row`` (``row`` if none)."""
    while row > 1 and lines[row - 2].lstrip().startswith("#"):
        row -= 1
    return row


def rewrite(path: str, text: str, names: Mapping[str, str]) -> Source:
    """``text`` with ``async``/``await`` removed and ``names`` renamed, line by line,
    statements marked ``# async-only`` left out (with the comments above them)."""
    try:
        tree = ast.parse(text, path)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError) as exc:
        raise RuleError(f"{path}: cannot parse: {exc}") from None
    raw = text.splitlines(keepends=True)
    starts: dict[int, ast.stmt] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            row, end = first_row(node), node.end_lineno or node.lineno
            if row not in starts or end > (starts[row].end_lineno or row):
                starts[row] = node  # the outermost of those that start on that row
    markers: dict[int, Marker] = {}
    edits: dict[int, list[tuple[int, int, str]]] = {}
    used: dict[int, list[str]] = {}
    leftover: dict[int, list[str]] = {}
    fstrings = 0
    for i, tok in enumerate(tokens):
        row, col = tok.start
        if tok.type == tokenize.COMMENT:
            found = _MARKER.match(tok.string)
            if found:
                if raw[row - 1][:col].strip():
                    raise RuleError(f"{path}:{row}: # {found[1]} must be a line of its own")
                marked = starts.get(row + 1)
                if marked is None:
                    raise RuleError(f"{path}:{row}: # {found[1]} is not directly above a statement")
                markers[row + 1] = Marker(found[1], row, marked)
        elif tok.type == _FSTRING_START:
            fstrings += 1
        elif tok.type == _FSTRING_END:
            fstrings -= 1
        elif tok.type == tokenize.NAME and tok.string in ("async", "await"):
            if fstrings:
                raise RuleError(f"{path}:{row}: {tok.string} inside an f-string")
            after = tokens[i + 1]
            end = after.start[1] if after.start[0] == row else tok.end[1]
            edits.setdefault(row, []).append((col, end, ""))
        elif tok.type == tokenize.NAME and not fstrings:
            new = names.get(tok.string)
            if new is not None:
                edits.setdefault(row, []).append((col, tok.end[1], new))
                used.setdefault(row, []).append(tok.string)
            elif _ASYNC_NAME.fullmatch(tok.string):
                leftover.setdefault(row, []).append(tok.string)
        elif tok.type == tokenize.STRING and tok.start[0] == tok.end[0]:
            # A plain string that is exactly a name (``__all__``, a forward reference).
            quote, inner = tok.string[0], tok.string[1:-1]
            if quote in "'\"" and tok.string[-1] == quote and inner in names:
                edits.setdefault(row, []).append((col, tok.end[1], quote + names[inner] + quote))
                used.setdefault(row, []).append(inner)
    dropped: set[int] = set()
    for row, marker in markers.items():
        if marker.kind == ASYNC_ONLY:
            end = marker.statement.end_lineno or row
            dropped.update(range(_comment_rows(raw, marker.row), end + 1))
    lines = []
    for row, line in enumerate(raw, start=1):
        if row in dropped:
            lines.append(Line(None))
            continue
        for start, end, new in sorted(edits.get(row, []), reverse=True):
            line = line[:start] + new + line[end:]
        lines.append(Line(line, used.get(row, []), leftover.get(row, [])))
    return Source(path, raw, lines, tree, markers)


# --- what gets generated ---------------------------------------------------------------


@dataclass
class Output:
    """A generated file: where it goes, its text before ruff, and how ruff treats it."""

    target: Path
    text: str
    fix: bool  # ``ruff check --fix`` too (a whole generated module: unused imports go)


def generate_package(package: Package, rules: Rules) -> list[Output]:
    """The sync modules of one ``_async/`` package."""
    common = rules.common
    source_dir = rules.root / package.source
    if not source_dir.is_dir():
        raise RuleError(f"{package.source}: no such directory")
    names = {**common.names, **package.scope.names}
    outputs = []
    for path in sorted(source_dir.rglob("*.py")):
        rel = path.relative_to(source_dir)
        shown = f"{package.source}/{rel.as_posix()}"
        source = rewrite(shown, path.read_text(), names)
        for marker in source.markers.values():
            if marker.kind == BY_HAND:
                raise RuleError(f"{shown}:{marker.row}: # {BY_HAND} applies to classes only")
        body = source.text(1, len(source.lines), package.scope, common)
        header = _FILE_HEADER.format(source=shown)
        _still_async(shown, _parse(shown, body))
        outputs.append(Output(rules.root / package.target / rel, header + body, fix=True))
    return outputs


def orphans(package: Package, root: Path) -> list[Path]:
    """Generated modules of ``package`` whose async source is gone."""
    target_dir = root / package.target
    found = []
    for path in sorted(target_dir.rglob("*.py")) if target_dir.is_dir() else []:
        rel = path.relative_to(target_dir)
        if not (root / package.source / rel).exists() and _FILE_HEADER_RE.match(path.read_text()):
            found.append(path)
    return found


def _top_class(tree: ast.Module, name: str, path: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise RuleError(f"{path}: no top-level class {name}")


def _members(node: ast.ClassDef) -> list[ast.stmt]:
    """A class's statements but its docstring."""
    body = node.body
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return body[1:] if isinstance(first.value.value, str) else body
    return body


def _defines(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def generate_module(module: Module, rules: Rules) -> Output:
    """The module with its sync classes generated from its async classes."""
    common = rules.common
    path = rules.root / module.path
    if not path.is_file():
        raise RuleError(f"{module.path}: no such file")
    text = path.read_text()
    names = {**common.names, **module.scope.names}
    source = rewrite(module.path, text, names)
    lines = text.splitlines(keepends=True)
    async_classes = []
    replacements = []
    for async_name, sync_name in module.classes.items():
        async_class = _top_class(source.tree, async_name, module.path)
        async_classes.append(async_class)
        sync_class = _top_class(source.tree, sync_name, module.path)
        body, by_hand = _class_body(source, async_class, module, common)
        first, head = _generated_part(lines, sync_class, async_name, module.path)
        for name in sorted(by_hand - head):
            raise RuleError(
                f"{module.path}: {async_name}.{name} is # {BY_HAND}, but {sync_name} has no"
                f" hand-written {name} above its generated part"
            )
        generated = _generated_names(async_class, source.markers, names)
        for name in sorted(head & generated):
            raise RuleError(
                f"{module.path}: {sync_name}.{name} is written by hand, but generated from"
                f" {async_name} too: mark the async one # {BY_HAND}"
            )
        indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
        opening = indent + _CLASS_LINE.format(source=async_name) + "\n"
        replacements.append((first, sync_class.end_lineno or first, opening + body))
        module.scope.used[async_name] += 1  # a class rule matches by being generated
    members = {id(member) for node in async_classes for member in _members(node)}
    for marker in source.markers.values():
        where = f"{module.path}:{marker.row}: # {marker.kind}"
        if not any(n.lineno <= marker.row <= (n.end_lineno or 0) for n in async_classes):
            raise RuleError(f"{where} outside a class the sync one is generated from")
        if marker.kind == BY_HAND and id(marker.statement) not in members:
            raise RuleError(f"{where} marks a statement inside a member, not a member")
    for first, last, new in sorted(replacements, reverse=True):
        lines[first - 1 : last] = [new]
    text = "".join(lines)
    tree = _parse(module.path, text)
    for sync_name in module.classes.values():
        _still_async(module.path, _top_class(tree, sync_name, module.path))
    return Output(path, text, fix=False)


def _parse(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise RuleError(f"{path}: the generated sync code does not parse: {exc}") from None


def _still_async(path: str, tree: ast.AST) -> None:
    """Fail where the generated code is still async: ``await`` in an f-string on a
    Python whose tokenizer sees the f-string as one token."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Await | ast.AsyncFor | ast.AsyncWith | ast.AsyncFunctionDef):
            raise RuleError(f"{path}: async code left in the sync code (its line {node.lineno})")


def _class_body(
    source: Source, node: ast.ClassDef, module: Module, common: Scope
) -> tuple[str, set[str]]:
    """The sync members made from an async class, and the (sync) names of its members
    written by hand."""
    chunks = []
    by_hand: set[str] = set()
    members = _members(node)
    # Each member comes with the lines above it, back to the previous member (or the
    # docstring): its comments. Those of the first one, when there is no docstring.
    previous = node.body[0].end_lineno if members is not node.body else None
    for member in members:
        start = first_row(member)
        marker = source.markers.get(start)
        top = previous + 1 if previous is not None else _comment_rows(source.raw, start)
        previous = member.end_lineno or start
        if marker is not None and marker.kind == BY_HAND:
            renamed = {**common.names, **module.scope.names}
            by_hand.update(renamed.get(n, n) for n in _defines(member))
            continue
        chunk = source.text(top, previous, module.scope, common).strip("\n")
        if chunk:
            chunks.append(chunk + "\n")
    return "\n".join(chunks), by_hand


def _generated_names(
    node: ast.ClassDef, markers: Mapping[int, Marker], names: Mapping[str, str]
) -> set[str]:
    found: set[str] = set()
    for member in _members(node):
        if first_row(member) not in markers:
            found.update(names.get(n, n) for n in _defines(member))
    return found


def _generated_part(
    lines: list[str], node: ast.ClassDef, source: str, path: str
) -> tuple[int, set[str]]:
    """The row that opens the generated part of a sync class, and the names of the
    members written by hand above it."""
    end = node.end_lineno or node.lineno
    for row in range(node.lineno + 1, end + 1):
        found = _CLASS_LINE_RE.fullmatch(lines[row - 1])
        if found:
            if found[1] != source:
                raise RuleError(f"{path}:{row}: {node.name} says it is generated from {found[1]}")
            head = set()
            for member in _members(node):
                if first_row(member) < row:
                    head.update(_defines(member))
            return row, head
    raise RuleError(
        f"{path}: class {node.name} has no line '{_CLASS_LINE.format(source=source)}'"
        " where its hand-written part ends"
    )


# --- ruff, and the run ---------------------------------------------------------------


def _ruff(*args: str) -> None:
    config = str(ROOT / "pyproject.toml")
    command = [sys.executable, "-m", "ruff", *args, "-q", "--config", config]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        why = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
        raise RuleError(f"ruff {args[0]} failed on the generated code: {why[0]}")


def render(outputs: list[Output], root: Path, scratch: Path) -> dict[Path, str]:
    """The final text of each output: written under ``scratch`` and put through ruff
    (``check --fix`` for whole generated modules, then ``format``)."""
    placed = {}
    for output in outputs:
        place = scratch / output.target.relative_to(root)
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_text(output.text)
        placed[output.target] = place
    fix = [str(placed[o.target]) for o in outputs if o.fix]
    if fix:
        _ruff("check", "--fix-only", *fix)
    if placed:
        _ruff("format", *(str(p) for p in placed.values()))
    return {target: place.read_text() for target, place in placed.items()}


def unused(rules: Rules) -> list[str]:
    """The rules that matched nothing in their scope."""
    return [
        f"{scope.label}: {old} = {scope.names[old]!r} matches nothing"
        for scope in rules.scopes()
        for old in scope.names
        if not scope.used[old]
    ]


def run(rules: Rules, check: bool, show_diff: bool = True) -> int:
    """Generate (or, with ``check``, compare) everything; the exit status."""
    outputs: list[Output] = []
    for package in rules.packages:
        outputs += generate_package(package, rules)
    for module in rules.modules:
        outputs.append(generate_module(module, rules))
    problems = unused(rules)
    if problems:
        print(f"{RULES.name}: rules that no longer match (delete them):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        final = render(outputs, rules.root, Path(scratch))
    stale = [target for target, text in final.items() if _read(target) != text]
    gone = [path for package in rules.packages for path in orphans(package, rules.root)]
    if not check:
        for target in stale:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(final[target])
            print(f"wrote {target.relative_to(rules.root)}")
        for path in gone:
            path.unlink()
            print(f"removed {path.relative_to(rules.root)} (its async source is gone)")
        return 0
    if not stale and not gone:
        return 0
    print(f"generated sync code is stale (run: python {SCRIPT}):", file=sys.stderr)
    for target in stale:
        shown = target.relative_to(rules.root).as_posix()
        print(f"  {shown}", file=sys.stderr)
        if show_diff:
            old = _read(target).splitlines(keepends=True)
            new = final[target].splitlines(keepends=True)
            diff = difflib.unified_diff(old, new, f"a/{shown}", f"b/{shown}")
            sys.stderr.writelines("    " + line for line in diff)
    for path in gone:
        print(f"  {path.relative_to(rules.root)}: its async source is gone", file=sys.stderr)
    return 1


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    parser.add_argument("--quiet", action="store_true", help="with --check: no diff, names only")
    parser.add_argument("--rules", type=Path, default=RULES, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        return run(load_rules(args.rules, args.root), args.check, show_diff=not args.quiet)
    except RuleError as exc:
        print(f"{SCRIPT}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
