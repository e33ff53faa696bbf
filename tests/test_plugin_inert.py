"""The pytest plugin: inert without URLs; with them, the suite runs and its verdicts hold."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_SUITE = "TestMultilockConformance"
_QUIET = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")


def _outcomes(rec: pytest.HookRecorder) -> dict[str, list[str]]:
    passed, skipped, failed = rec.listoutcomes()
    return {
        "passed": [r.nodeid for r in passed],
        "skipped": [r.nodeid for r in skipped],
        "failed": [r.nodeid for r in failed],
    }


@pytest.fixture(autouse=True)
def _no_env_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The outer run's environment must not leak URLs into the inner runs."""
    monkeypatch.delenv("MULTILOCK_URL", raising=False)
    monkeypatch.delenv("MULTILOCK_REQUIRE_BACKENDS", raising=False)


def test_inert_without_urls(pytester: pytest.Pytester) -> None:
    """No URL: the plugin collects nothing of its own, in an empty directory or beside tests."""
    result = pytester.runpytest(*_QUIET, "-p", "multilock.testing.plugin")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    rec = pytester.inline_run(*_QUIET)
    assert _outcomes(rec) == {"passed": ["test_mine.py::test_mine"], "skipped": [], "failed": []}


def test_options_are_registered(pytester: pytest.Pytester) -> None:
    """--help lists the plugin's options (it is loaded by its pytest11 entry point)."""
    result = pytester.runpytest(*_QUIET, "--help")
    result.stdout.fnmatch_lines(["*--multilock-url=URL*", "*--multilock-require-backends*"])


def test_memory_passes_whole_suite_sync_and_async(pytester: pytest.Pytester) -> None:
    """``-p multilock.testing.plugin --multilock-url memory://`` runs the suite alone; it passes."""
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    pytester.makeini("[pytest]\ntestpaths = .\n")
    rec = pytester.inline_run(
        *_QUIET, "-p", "multilock.testing.plugin", "--multilock-url", "memory://p1"
    )
    outcome = _outcomes(rec)
    assert outcome["failed"] == []
    assert all(_SUITE in nodeid for nodeid in outcome["passed"]), "the project's tests ran too"
    assert len(outcome["passed"]) >= 30
    assert any("[sync-memory://p1]" in n for n in outcome["passed"])
    assert any("[async-memory://p1]" in n for n in outcome["passed"])
    reasons = [str(r.longrepr) for r in rec.listoutcomes()[1]]
    assert any("Capability.TTL" in reason for reason in reasons), reasons


def test_suite_runs_beside_given_paths_and_from_env(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explicit test paths still run; URLs also come from MULTILOCK_URL."""
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    monkeypatch.setenv("MULTILOCK_URL", "memory://env1")
    rec = pytester.inline_run(*_QUIET, "test_mine.py", "-k", "test_mine or release_is_idempotent")
    outcome = _outcomes(rec)
    assert outcome["failed"] == []
    assert "test_mine.py::test_mine" in outcome["passed"]
    assert (
        sum("release_is_idempotent[" in n and "memory://env1" in n for n in outcome["passed"]) == 2
    )


def test_each_url_gets_the_suite_with_passwords_masked(pytester: pytest.Pytester) -> None:
    """Two URLs: the suite runs per URL; test ids never show a password."""
    result = pytester.runpytest(
        *_QUIET,
        "--collect-only",
        "-q",
        "--multilock-url",
        "memory://a",
        "--multilock-url",
        "memory://user:hunter2@b",
    )
    text = result.stdout.str()
    assert "hunter2" not in text
    assert "memory://user:***@b" in text
    assert text.count("test_release_is_idempotent[") == 4


def test_unreachable_backend_skips_or_fails_when_required(pytester: pytest.Pytester) -> None:
    """An unreachable URL skips every check -- but fails them when backends are required."""
    url = "file:///proc/multilock-no-such-dir/locks"
    rec = pytester.inline_run(*_QUIET, "--multilock-url", url, "-k", "idempotent or rounds")
    outcome = _outcomes(rec)
    assert outcome["passed"] == []
    assert outcome["failed"] == []
    assert len(outcome["skipped"]) == 4
    rec = pytester.inline_run(
        *_QUIET,
        "--multilock-url",
        url,
        "--multilock-require-backends",
        "-k",
        "idempotent or rounds",
    )
    outcome = _outcomes(rec)
    assert outcome["skipped"] == []
    assert len(outcome["failed"]) == 4, outcome


def test_explicit_plugin_without_autoload(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``multilock conformance URL`` runs: a fresh pytest process with ``-p``, which
    must work with plugin autoloading off as well as on (no double registration)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    result = pytester.runpytest_subprocess(
        *_QUIET, "-p", "multilock.testing.plugin", "--multilock-url", "memory://cli", "-k", "rounds"
    )
    result.assert_outcomes(passed=2)
