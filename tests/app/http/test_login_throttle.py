"""LoginThrottle's counters on a fake clock: per address and per subject, attempts reserved as they arrive, a
success forgiving only its subject's failures, known devices counted on their own."""

from __future__ import annotations

import pytest

from app.http.errors import APIError
from app.http.login_throttle import ACCOUNT, ADDRESS, LoginThrottle


def make_throttle() -> tuple[LoginThrottle, list[float]]:
    now = [0.0]
    return LoginThrottle(clock=lambda: now[0], what="wrong passwords"), now


def fail(
    throttle: LoginThrottle, address: str, subject: str | None = None, device: str | None = None
) -> float:
    with throttle.begin(address, subject, device=device) as attempt:
        return attempt.failed()


def refusal(
    throttle: LoginThrottle, address: str, subject: str | None = None, device: str | None = None
) -> APIError:
    with pytest.raises(APIError) as refused:
        throttle.begin(address, subject, device=device)
    assert (refused.value.status, refused.value.code) == (429, "too_many_attempts")
    return refused.value


def test_a_success_forgives_only_its_own_subjects_failures_from_the_address():
    throttle, _ = make_throttle()
    for _ in range(4):
        assert fail(throttle, "a", "account:bob") == 0
    with throttle.begin("a", "account:mallory") as attempt:
        attempt.succeeded()
    assert fail(throttle, "a", "account:bob") == 1.0  # bob's 5th from this address: the wait starts
    error = refusal(throttle, "a", "account:mallory")
    assert error.message == "too many wrong passwords from this address: retry in 1 s"
    assert error.headers == {"Retry-After": "1"}
    assert throttle.num_refused == 1


def test_a_success_forgives_the_address_failures_for_that_subject():
    throttle, _ = make_throttle()
    for _ in range(4):
        fail(throttle, "a", "account:bob")
    with throttle.begin("a", "account:bob") as attempt:  # the owner, after typos
        attempt.succeeded()
    assert [fail(throttle, "a", "account:bob") for _ in range(5)] == [0, 0, 0, 0, 1.0]
    assert throttle.subjects.counters["account:bob"].count == 5


def test_attempts_in_flight_use_up_the_free_failures():
    throttle, now = make_throttle()
    attempts = [throttle.begin("a", "account:carol") for _ in range(ADDRESS.free_failures)]
    error = refusal(throttle, "a", "account:carol")
    assert error.headers == {"Retry-After": "1"}  # the 6th, while the first 5 are being checked
    for attempt in attempts:
        attempt.failed()
    refusal(throttle, "a")
    now[0] += 1.0
    with throttle.begin("a") as attempt:  # past the free failures: one at a time
        refusal(throttle, "a")
        assert attempt.failed() == 2.0


def test_an_attempt_ended_neither_way_counts_for_nothing():
    throttle, _ = make_throttle()
    for _ in range(20):
        with throttle.begin("a", "account:bob"):
            pass  # e.g. a 400 or a 503 before the password was checked
    assert throttle.addresses.counters == {} and throttle.subjects.counters == {}
    with pytest.raises(RuntimeError), throttle.begin("a", "account:bob"):
        raise RuntimeError("the store is down")
    assert throttle.addresses.counters == {} and throttle.subjects.counters == {}


def test_a_subject_attacked_from_many_addresses_waits_but_a_known_device_does_not():
    throttle, _ = make_throttle()
    waits = [fail(throttle, f"10.0.0.{i}", "account:dave") for i in range(ACCOUNT.free_failures)]
    assert waits == [0] * (ACCOUNT.free_failures - 1) + [1.0]
    error = refusal(throttle, "10.0.1.1", "account:dave")  # a new address: the account's wait applies
    assert error.message == (
        "too many wrong passwords for this account from devices that have not signed in to it: retry in 1 s"
    )
    with throttle.begin("10.0.1.1", "account:dave", device="dev-1") as attempt:
        attempt.succeeded()  # the owner's browser; the attack's failures on the account still stand
    refusal(throttle, "10.0.1.2", "account:dave")
    throttle.begin("10.0.1.1", "account:erin").release()  # other accounts are not held back


def test_the_account_wait_has_a_lower_ceiling_than_the_address_wait():
    throttle, now = make_throttle()
    for i in range(40):
        now[0] += 3000.0  # each wait waited out, each failure within the hour of the last
        fail(throttle, f"10.0.0.{i}", "account:dave")
    counter = throttle.subjects.counters["account:dave"]
    assert counter.locked_until - now[0] == ACCOUNT.max_wait_s == 300.0
    assert ADDRESS.wait_after(10_000) == 900.0  # no overflow however many


def test_a_known_devices_failures_are_its_own():
    throttle, _ = make_throttle()
    for i in range(ADDRESS.free_failures):
        fail(throttle, f"10.0.0.{i}", "account:dave", device="stolen")
    refusal(throttle, "10.0.9.9", "account:dave", device="stolen")  # a new address, the same device
    throttle.begin("10.0.9.9", "account:dave").release()  # the account itself has counted none


def test_failures_are_forgotten_after_an_hour():
    throttle, now = make_throttle()
    for _ in range(ADDRESS.free_failures):
        fail(throttle, "a", "account:bob")
    now[0] += 3601
    assert fail(throttle, "a", "account:bob") == 0
    assert throttle.addresses.counters["a"].count == 1
