"""The password hashing queue: checks beyond `max_queued` waiting are refused at once (503), a waiter that gives up
keeps its place until its hash has run, hashes of callers who proved who they are are never refused, nor one check
at a time of each account from a device known to it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.accounts.passwords import Passwords, default_hash_threads
from app.http.errors import APIError


class GatedHasher:
    """A stand-in for argon2's PasswordHasher whose every hash and check waits for `gate`."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()  # a hash or check has started on the thread

    def verify(self, stored: str, password: str) -> bool:
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return stored == "hash:" + password

    def hash(self, password: str) -> str:
        assert self.gate.wait(10), "the test never opened the gate"
        return "hash:" + password


async def until(condition, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def make_passwords(max_queued: int) -> tuple[Passwords, GatedHasher]:
    hasher = GatedHasher()
    return Passwords(hasher, max_queued=max_queued, num_threads=1), hasher  # type: ignore[arg-type]


def test_checks_beyond_the_queue_are_refused_at_once():
    async def main() -> None:
        passwords, hasher = make_passwords(max_queued=2)
        checks = [asyncio.create_task(passwords.verify("hash:pw", "pw")) for _ in range(3)]  # 1 runs, 2 wait
        await until(lambda: passwords.num_pending == 3)
        with pytest.raises(APIError) as full:
            await passwords.verify("hash:pw", "pw")
        error = full.value
        assert (error.status, error.code, error.headers) == (503, "password_queue_full", {"Retry-After": "1"})
        assert error.message == (
            "the server is busy checking passwords: 2 checks are waiting already, the most it queues "
            "(max_queued_password_checks = 2); retry in 1 s"
        )
        assert passwords.num_refused == 1
        hashed = asyncio.create_task(passwords.hash("new"))  # a proven caller's hash queues all the same
        await until(lambda: passwords.num_pending == 4)
        hasher.gate.set()
        assert await asyncio.gather(*checks) == [True, True, True]
        assert await hashed == "hash:new"
        await until(lambda: passwords.num_pending == 0)
        assert await passwords.verify("hash:pw", "other") is False  # room again
        passwords.close()

    asyncio.run(main())


def test_a_check_whose_caller_gave_up_keeps_its_place_until_it_has_run():
    async def main() -> None:
        passwords, hasher = make_passwords(max_queued=0)
        running = asyncio.create_task(passwords.verify("hash:pw", "pw"))
        await until(hasher.entered.is_set)
        running.cancel()  # the client went away; its hash still runs on the thread
        with pytest.raises(asyncio.CancelledError):
            await running
        with pytest.raises(APIError):
            await passwords.verify("hash:pw", "pw")
        hasher.gate.set()
        await until(lambda: passwords.num_pending == 0)
        assert await passwords.verify("hash:pw", "pw") is True
        passwords.close()

    asyncio.run(main())


def test_a_known_devices_check_passes_a_full_queue_one_at_a_time_per_account():
    async def main() -> None:
        passwords, hasher = make_passwords(max_queued=1)
        flood = [
            asyncio.create_task(passwords.verify("hash:pw", "guess")) for _ in range(2)
        ]  # 1 runs, 1 waits
        await until(lambda: passwords.num_pending == 2)
        with pytest.raises(APIError):  # full
            await passwords.verify("hash:pw", "guess")
        alice = asyncio.create_task(passwords.verify("hash:pw", "pw", known_device_of="alice"))
        await until(lambda: passwords.num_pending == 3)
        with pytest.raises(APIError):  # alice's lane is taken until her check has run
            await passwords.verify("hash:pw", "pw", known_device_of="alice")
        bob = asyncio.create_task(passwords.verify("hash:pw", "pw", known_device_of="bob"))
        await until(lambda: passwords.num_pending == 4)
        assert passwords.num_refused == 2
        hasher.gate.set()
        assert await asyncio.gather(*flood, alice, bob) == [False, False, True, True]
        await until(lambda: passwords.num_pending == 0)
        assert passwords._known == set()
        passwords.close()

    asyncio.run(main())


def test_one_hashing_thread_on_two_cpus_or_fewer():
    assert [default_hash_threads(n) for n in (1, 2, 3, 16)] == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="max_queued must be non-negative, got -1"):
        Passwords(max_queued=-1)
