"""Deliberately broken backends make the suite fail on the check that names the flaw.

The backends live in ``flawed_backends.py`` (beside this file), built on the
kit and registered by a conftest of the pytester directory, exactly as a
third party without an entry point would.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from multilock._locks import registry as _registry


def _defects() -> dict[str, str]:
    """flawed_backends.DEFECTS, loaded from its file (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "_flawed_catalogue", Path(__file__).with_name("flawed_backends.py")
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    defects: dict[str, str] = module.DEFECTS
    return defects


DEFECTS = _defects()

pytest_plugins = ["pytester"]

_QUIET = ("-p", "no:hypothesispytest", "-p", "no:cacheprovider")


def _failed(pytester: pytest.Pytester, url: str, *args: str) -> tuple[set[str], int]:
    """Run the suite on ``url``; the failed checks (as ``name[api]``) and the pass count."""
    source = Path(__file__).with_name("flawed_backends.py").read_text()
    pytester.makepyfile(flawed_backends=source)
    pytester.makeconftest("import flawed_backends\n\nflawed_backends.register()\n")
    # An entry point, so that the suite's child processes find flawdb:// by its scheme.
    info = pytester.mkdir("flawed_backends-0.dist-info")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flawed-backends\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[multilock.backends]\nflawdb = flawed_backends:db_backend\n"
    )
    pytester.syspathinsert()
    rec = pytester.inline_run(*_QUIET, "--multilock-url", url, *args)
    passed, _skipped, failed = rec.listoutcomes()
    suffix = f"-{url}]"
    names = set()
    for report in failed:
        check = report.nodeid.rsplit("::", 1)[-1]
        assert check.endswith(suffix), check
        names.add(check.removesuffix(suffix) + "]")
    return names, len(passed)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """No URLs from the outer environment; the schemes the inner runs register vanish
    with the test (the inner runs share this process and its registry)."""
    monkeypatch.delenv("MULTILOCK_URL", raising=False)
    monkeypatch.delenv("MULTILOCK_REQUIRE_BACKENDS", raising=False)
    monkeypatch.setattr(_registry, "_registered", dict(_registry._registered))


def test_sound_ttl_backend_passes_whole_suite(pytester: pytest.Pytester) -> None:
    """The control: a correct TTL backend on the same scaffolding passes every check."""
    failed, passed = _failed(pytester, "sound://control")
    assert failed == set()
    assert passed >= 35


def test_reentrant_backend_fails_shared_locker_check(pytester: pytest.Pytester) -> None:
    """A locker granted a name it already holds fails the no-re-entrancy check."""
    failed, _ = _failed(pytester, "reentrant://x")
    assert {
        "test_one_locker_excludes_its_own_acquirers[sync]",
        "test_one_locker_excludes_its_own_acquirers[async]",
    } <= failed
    assert "test_mutual_exclusion_rounds[sync]" not in failed  # independent lockers are fine


def test_blocking_try_acquire_fails_try_semantics(pytester: pytest.Pytester) -> None:
    """A try_acquire that waits for the holder fails the try-semantics check."""
    failed, passed = _failed(pytester, "blocking://x", "-k", "promptly or reacquire")
    assert failed == {
        "test_try_acquire_held_returns_none_promptly[sync]",
        "test_try_acquire_held_returns_none_promptly[async]",
    }
    assert passed == 2


def test_unshielded_release_fails_cancellation_check(pytester: pytest.Pytester) -> None:
    """An async release that a cancellation can interrupt leaks the lock: caught."""
    failed, _ = _failed(pytester, "uncancellable://x")
    assert failed == {"test_release_on_cancellation[async]"}


def test_blind_delete_fails_stale_holder_check(pytester: pytest.Pytester) -> None:
    """A release without compare-and-delete frees the next holder's lock: caught."""
    failed, _ = _failed(pytester, "blinddelete://x", "-k", "stale or expires or reacquire")
    assert failed == {
        "test_stale_holder_cannot_release_or_extend[sync]",
        "test_stale_holder_cannot_release_or_extend[async]",
    }


def test_acquire_without_undo_fails_in_flight_cancellation_check(
    pytester: pytest.Pytester,
) -> None:
    """An async acquire that drops a lease granted while it was being cancelled: caught
    by the in-flight check every time. The cancelled waiting acquire, whose polls are
    such acquires, may catch it too, when a cancel lands in a poll's grant (a matter of
    timing); no other check may fail."""
    failed, _ = _failed(pytester, "leaky://x", "-k", "cancel")
    assert "test_cancelled_acquire_leaks_nothing[async]" in failed
    assert failed <= {
        "test_cancelled_acquire_leaks_nothing[async]",
        "test_acquire_cancelled_leaves_nothing[async]",
    }


def test_declared_promise_without_hooks_fails(pytester: pytest.Pytester) -> None:
    """LOST_SIGNAL declared but no hooks to prove it: a failure, never a skip."""
    failed, _ = _failed(pytester, "nohooks://x", "-k", "lost_signal")
    assert failed == {"test_lost_signal_fires[sync]", "test_lost_signal_fires[async]"}


def _db_url(pytester: pytest.Pytester, flaw: str) -> str:
    return f"flawdb://{pytester.path}/locks.db?flaw={flaw}"


def test_reference_backend_passes_whole_suite(pytester: pytest.Pytester) -> None:
    """The correct original of the catalogue passes every check, sync and async."""
    failed, passed = _failed(pytester, _db_url(pytester, "none"))
    assert failed == set()
    assert passed >= 50


_CATCHES = Path(__file__).parent.parent / "docs" / "conformance.md"


def _documented() -> dict[str, tuple[str, set[str]]]:
    """docs/conformance.md's "what the suite catches" rows: flaw -> (defect, checks)."""
    rows = {}
    for line in _CATCHES.read_text().splitlines():
        match = re.fullmatch(r"\| `flaw=(\w+)` \| (.+) \| (.+) \|", line)
        if match:
            checks = set(re.findall(r"`(test_\w+)`", match[3]))
            rows[match[1]] = (match[2], checks)
    return rows


def test_catalogue_is_documented() -> None:
    """Every defect of flawdb:// has its row, with its description, and nothing else."""
    documented = _documented()
    assert set(documented) == set(DEFECTS) - {"none"}
    for flaw, (defect, checks) in documented.items():
        assert defect == DEFECTS[flaw], f"{flaw}: the docs say {defect!r}"
        assert checks, f"{flaw}: no failing check documented"
    assert len(documented) + 6 >= 25  # with the in-process flaws above


@pytest.mark.slow
@pytest.mark.parametrize("flaw", sorted(set(DEFECTS) - {"none"}))
def test_suite_fails_every_defect(pytester: pytest.Pytester, flaw: str) -> None:
    """Each check docs/conformance.md names for a defect fails on it (sync variant).

    Only those checks run (the whole suite on 26 defects took CI minutes): a check
    that stopped catching its defect fails this test, and the correct original passes
    the whole suite above. Not the model check: it draws its histories at random, so
    which of these defects it finds within its budget varies from run to run.
    """
    documented = _documented()[flaw][1]
    assert documented, f"docs/conformance.md names no check for flaw={flaw}"
    only = " or ".join(sorted(documented))
    failed, _ = _failed(pytester, _db_url(pytester, flaw), "-k", f"not async and ({only})")
    checks = {name.removesuffix("[sync]") for name in failed}
    missed = sorted(documented - checks)
    assert not missed, f"flaw={flaw} ({DEFECTS[flaw]}) passes {missed}"


def test_acquire_that_never_waits_fails_the_waiting_checks(pytester: pytest.Pytester) -> None:
    """An acquire that gives up at once, timeout or not: caught by every waiting check
    that meets a held name."""
    failed, _ = _failed(pytester, "impatient://x", "-k", "acquire and not cancel")
    assert failed == {
        f"{check}[{api}]"
        for check in (
            "test_acquire_waits_for_release",
            "test_acquire_times_out_leaving_nothing",
            "test_acquire_serves_every_waiter",
        )
        for api in ("sync", "async")
    }


def test_timed_out_wait_left_queued_fails_the_timeout_check(pytester: pytest.Pytester) -> None:
    """A wait that times out but leaves its claim queued takes the name on release: caught."""
    failed, _ = _failed(pytester, "queueing://x", "-k", "acquire")
    assert failed == {
        "test_acquire_times_out_leaving_nothing[sync]",
        "test_acquire_times_out_leaving_nothing[async]",
    }
