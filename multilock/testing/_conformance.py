"""``ConformanceTests``: the whole suite as a mixin class (the fsspec pattern).

A backend's test module subclasses it and supplies the URL::

    class TestMyConformance(ConformanceTests):
        @pytest.fixture
        def multilock_url(self, request: pytest.FixtureRequest) -> str:
            return server_url(request.config, "mylock://127.0.0.1/")

Every test runs twice, against the sync API and the async API. Each test is a
one-line call of a check written once (``_checks_*``) through the API adapter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from . import _checks_basic as basic
from . import _checks_cancel as cancel
from . import _checks_claims as claims
from . import _checks_contention as contention
from . import _checks_names as names
from . import _checks_process as process
from . import _checks_stale as stale
from . import _checks_ttl as ttl
from . import _checks_wait as wait
from ._harness import Harness

__all__ = ["ConformanceTests"]


class ConformanceTests:
    """The conformance suite. Subclass it and define a ``multilock_url`` fixture (str).

    Checks of optional promises skip, naming the capability, when the backend
    does not declare it; a declared promise that is not kept fails.
    """

    @pytest.fixture(params=["sync", "async"])
    def multilock(self, request: pytest.FixtureRequest, multilock_url: str) -> Harness:
        """The harness of one check, for the sync or the async API."""
        return Harness(multilock_url, request.param)

    def test_capabilities_agree(self, multilock: Harness) -> None:
        """Sync and async lockers declare the same, coherent capabilities."""
        multilock.run(basic.capabilities_agree)

    def test_lease_attributes(self, multilock: Harness) -> None:
        """A lease's name, key, token, fencing_token, expires_at and held are right."""
        multilock.run(basic.lease_attributes)

    def test_try_acquire_held_returns_none_promptly(self, multilock: Harness) -> None:
        """A held name gives None at once, to every locker; nothing queues."""
        multilock.run(basic.try_semantics)

    def test_release_then_reacquire(self, multilock: Harness) -> None:
        """A released name can be taken again, by the same and by another locker."""
        multilock.run(basic.release_reacquire)

    def test_release_is_idempotent(self, multilock: Harness) -> None:
        """A second release returns False and never frees a new holder."""
        multilock.run(basic.release_idempotent)

    def test_release_on_exception(self, multilock: Harness) -> None:
        """An exception leaving ``with lease:`` releases the lock."""
        multilock.run(basic.release_on_exception)

    def test_release_on_cancellation(self, multilock: Harness) -> None:
        """A cancelled holder releases, even when cancelled again mid-release."""
        multilock.run(cancel.release_on_cancellation)

    def test_cancelled_acquire_leaks_nothing(self, multilock: Harness) -> None:
        """A cancellation landing in an in-flight acquire leaves nothing held (async)."""
        multilock.run(cancel.acquire_cancelled_leaks_nothing)

    def test_mutual_exclusion_rounds(self, multilock: Harness) -> None:
        """8 lockers race 100 rounds at once: one winner a round, no lost update."""
        multilock.run(contention.exclusion_rounds)

    def test_mutual_exclusion_free_running(self, multilock: Harness) -> None:
        """8 lockers loop acquire/update/release: the shared counter loses nothing."""
        multilock.run(contention.exclusion_free_running)

    def test_one_locker_excludes_its_own_acquirers(self, multilock: Harness) -> None:
        """Two acquirers sharing one locker exclude each other (no re-entrancy)."""
        multilock.run(contention.shared_locker_excludes)

    def test_fencing_tokens_increase(self, multilock: Harness) -> None:
        """FENCING: tokens strictly increase per name across holders."""
        multilock.run(contention.fencing_increases)

    def test_different_names_do_not_block(self, multilock: Harness) -> None:
        """Holding a name never blocks another, however alike."""
        multilock.run(basic.different_names_independent)

    def test_awkward_names(self, multilock: Harness) -> None:
        """Awkward names work and stay distinct, or raise InvalidLockName."""
        multilock.run(basic.names_awkward)

    def test_near_equal_names(self, multilock: Harness) -> None:
        """A corpus of near-equal names, held at once across lockers, maps to distinct
        locks: no case folding, normalization, stripping, truncation or small hash."""
        multilock.run(names.names_near_equal)

    def test_try_acquire_many(self, multilock: Harness) -> None:
        """try_acquire_many: a result per name in order, duplicates refused."""
        multilock.run(basic.try_acquire_many)

    def test_try_acquire_many_batch(self, multilock: Harness) -> None:
        """BATCH: 200 names in one call."""
        multilock.run(basic.try_acquire_many_large)

    def test_introspection_lists_held_locks(self, multilock: Harness) -> None:
        """INTROSPECTION: locks() lists a held lock, and forgets it once released."""
        multilock.run(basic.introspection)

    def test_close_releases_leases(self, multilock: Harness) -> None:
        """Closing a locker releases its leases; their stale release is a no-op."""
        multilock.run(basic.close_releases)

    def test_ttl_lease_expires(self, multilock: Harness) -> None:
        """TTL: an unextended lease ends after its ttl, not before."""
        multilock.run(ttl.ttl_lease_expires)

    def test_stale_holder_cannot_release_or_extend(self, multilock: Harness) -> None:
        """TTL: an expired holder's release/extend, in every order, never touch the new
        holder (another locker of the same process)."""
        multilock.run(stale.stale_in_process)

    def test_stale_holders_across_processes(self, multilock: Harness) -> None:
        """TTL+CROSS_PROCESS: stale holders' operations, in every order, never touch new
        holders in the same, another or a freshly started process."""
        multilock.run(stale.stale_across_processes)

    def test_extend_keeps_lease(self, multilock: Harness) -> None:
        """TTL: extending keeps a lease exclusive for several ttls."""
        multilock.run(ttl.extend_keeps_lease)

    def test_renewal_keeps_long_job_exclusive(self, multilock: Harness) -> None:
        """TTL+RENEWAL: a long (even blocking) job keeps its lease past several ttls."""
        multilock.run(ttl.renewal_keeps_long_job_exclusive)

    def test_lost_signal_fires(self, multilock: Harness) -> None:
        """LOST_SIGNAL: a lease dropped by the backend fires lost every way."""
        multilock.run(ttl.lost_signal)

    def test_crashed_holder_frees_lock(self, multilock: Harness) -> None:
        """CROSS_PROCESS: a SIGKILLed holder's lock is free within the backend's bound."""
        multilock.run(process.crashed_holder_frees)

    def test_paused_holder_cannot_touch_new_holder(self, multilock: Harness) -> None:
        """TTL+CROSS_PROCESS: a holder frozen past its ttl cannot release the new holder."""
        multilock.run(process.paused_holder_is_noop)

    def test_mutual_exclusion_across_processes(self, multilock: Harness) -> None:
        """CROSS_PROCESS: 4 processes share a counter under the lock; fencing increases."""
        multilock.run(process.cross_process_exclusion)

    def test_unreachable_backend_raises(self, multilock: Harness) -> None:
        """An unreachable backend raises BackendUnavailable promptly, never None."""
        multilock.run(process.unreachable_raises)

    # --- the waiting acquire (issue 19) ----------------------------------------------

    def test_acquire_free_name_at_once(self, multilock: Harness) -> None:
        """acquire() on a free name returns a lease at once, whatever its timeout."""
        multilock.run(wait.acquire_free_at_once)

    def test_acquire_waits_for_release(self, multilock: Harness) -> None:
        """acquire() on a held name waits, and gets it soon after the release."""
        multilock.run(wait.acquire_waits_for_release)

    def test_acquire_times_out_leaving_nothing(self, multilock: Harness) -> None:
        """acquire() raises LockTimeout in about its timeout; nothing stays held or queued."""
        multilock.run(wait.acquire_times_out)

    def test_acquire_cancelled_leaves_nothing(self, multilock: Harness) -> None:
        """A cancelled acquire() leaves nothing held or queued, even racing a release (async)."""
        multilock.run(wait.acquire_cancelled_leaves_nothing)

    def test_acquire_serves_every_waiter(self, multilock: Harness) -> None:
        """20 waiters on one name each get it, one at a time, within a bound."""
        multilock.run(wait.waiters_all_served)

    def test_degraded_backend_raises(self, multilock: Harness) -> None:
        """Busy, read-only or refusing (where the hooks can make it so): BackendUnavailable."""
        multilock.run(process.degraded_raises)

    # --- tick claims (issue 20) ------------------------------------------------------

    def test_claim_one_winner_per_tick(self, multilock: Harness) -> None:
        """TICK_CLAIM: 8 lockers claim the same ticks at once: one winner per tick."""
        multilock.run(claims.claims_one_winner)

    def test_claim_never_goes_back(self, multilock: Harness) -> None:
        """TICK_CLAIM: a fire time at or below the mark never wins; a later one does."""
        multilock.run(claims.claims_never_go_back)

    def test_claim_names_independent(self, multilock: Harness) -> None:
        """TICK_CLAIM: marks of different names, and of claims and locks, are apart."""
        multilock.run(claims.claims_names_independent)

    def test_claim_across_processes(self, multilock: Harness) -> None:
        """TICK_CLAIM+CROSS_PROCESS: 4 processes race for 30 names' tick: one winner each."""
        multilock.run(claims.claims_across_processes)

    def test_claim_mark_survives(self, multilock: Harness) -> None:
        """TICK_CLAIM: a mark outlives its claimer's session (and any lease ttl)."""
        multilock.run(claims.claims_survive)

    def test_model_checked_history(self, multilock: Harness) -> None:
        """Random histories over 3 lockers (2 in other processes) agree with the model."""
        multilock.run(_model_check())


def _model_check() -> Callable[[Harness], Awaitable[None]]:
    """The model check, imported when run: only it needs hypothesis."""
    try:
        from ._checks_model import model_checked_history
    except ImportError as exc:
        if exc.name != "hypothesis":
            raise
        pytest.fail(
            "the model check needs hypothesis, which multilock does not install:"
            " pip install 'multilock[conformance]'",
            pytrace=False,
        )
    return model_checked_history
