"""Password guessing against a real `pagedchat serve --auth local` (issue #35, items 1-3): the guesses of one address
keep counting across its successes on other accounts, a burst is counted as it arrives, an account attacked from
many addresses is slowed while its owner's own browser still signs in, and the hashing queue is bounded.

Addresses: the client binds its socket to 127.0.0.x, which the server sees as distinct peers. Each test uses
addresses and accounts of its own, since the counters live as long as the module's server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from bench.common.servers import stop_server
from tests.e2e.conftest import Server, server_env, start_server

ADMIN, ADMIN_PASSWORD = "root", "root password 1"
ADMIN_TOKEN = "signin-test-admin-token-0123"
PASSWORD = "the right one 1"
MAX_QUEUED = (
    4  # max_queued_password_checks of the test server: small, so a burst from many addresses fills it
)
ACCOUNT_FREE_FAILURES = 10  # app/http/login_throttle.py ACCOUNT
ADDRESS_FREE_FAILURES = 5  # ADDRESS


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("signin-server")
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_AUTH="local",
        PAGEDCHAT_FIRST_ADMIN=ADMIN,
        PAGEDCHAT_FIRST_ADMIN_PASSWORD=ADMIN_PASSWORD,
        PAGEDCHAT_MAX_QUEUED_PASSWORD_CHECKS=str(MAX_QUEUED),
        PAGEDCHAT_ADMIN_TOKEN=ADMIN_TOKEN,
    )
    running = start_server(tmp_path, env)
    admin = browser(running)
    assert sign_in(admin, ADMIN, ADMIN_PASSWORD).status_code == 200
    for name in ("bob", "mallory", "carol", "dave", "erin", "fay"):
        created = admin.post("/api/users", json={"username": name, "password": PASSWORD})
        assert created.status_code == 201, created.text
    admin.close()
    yield running
    stop_server(running)


def browser(server: Server, address: str = "127.0.0.1") -> httpx.Client:
    """A client with its own cookie jar, connecting from `address`, sending the server's Origin (as its pages do)."""
    return httpx.Client(
        base_url=server.base_url,
        transport=httpx.HTTPTransport(local_address=address),
        headers={"Origin": server.base_url},
        timeout=60,
    )


def sign_in(client: httpx.Client, username: str, password: str) -> httpx.Response:
    return client.post("/auth/login", json={"username": username, "password": password})


def code_of(response: httpx.Response) -> tuple[int, str | None]:
    """The status and the error code (None when the answer is no error)."""
    return response.status_code, response.json().get("error", {}).get("code")


def all_at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run every call on a thread of its own, released together."""
    start = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - reported below, with the others
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    failed = [r for r in results if not isinstance(r, httpx.Response)]
    assert not failed, failed
    return results


def guess_until_refused(
    guess: Callable[[], httpx.Response], rounds: int, between: Callable[[], None]
) -> list:
    """Rounds of 4 guesses with `between()` after each round, until a guess is refused; the answers."""
    responses: list[httpx.Response] = []
    for _ in range(rounds):
        for _ in range(4):
            responses.append(guess())
            if responses[-1].status_code == 429:
                return responses
        between()
    return responses


def test_a_success_on_another_account_does_not_forgive_the_guesses(server):
    """Item 1: 4 wrong passwords for bob, then the attacker's own mallory signs in, again and again: today 24 wrong
    guesses and no 429. A success forgives only that account's failures, so the 5th guess for bob locks."""
    attacker, own = browser(server, "127.0.0.2"), browser(server, "127.0.0.2")

    def sign_in_as_mallory() -> None:
        assert sign_in(own, "mallory", PASSWORD).status_code == 200

    responses = guess_until_refused(lambda: sign_in(attacker, "bob", "a guess 123"), 6, sign_in_as_mallory)
    statuses = [r.status_code for r in responses]
    assert statuses == [401] * ADDRESS_FREE_FAILURES + [429], statuses
    assert code_of(responses[-1]) == (429, "too_many_attempts")
    assert "from this address" in responses[-1].json()["error"]["message"]
    assert int(responses[-1].headers["retry-after"]) >= 1


def test_password_change_guesses_with_a_stolen_cookie_count_per_address_and_account(server):
    """Item 1, `/auth/password`: erin's stolen cookie guesses her current password; the attacker's own sign-ins in
    between forgive nothing, and guesses from other addresses still add up on erin's account."""
    victim = browser(server, "127.0.0.3")
    assert sign_in(victim, "erin", PASSWORD).status_code == 200
    guess = {"current_password": "a guess 123", "new_password": "owned by mallory"}

    def stolen(address: str) -> httpx.Client:
        client = browser(server, address)
        client.cookies.set("pagedchat_session", victim.cookies["pagedchat_session"])
        return client

    thief, own = stolen("127.0.0.4"), browser(server, "127.0.0.4")

    def sign_in_as_mallory() -> None:
        assert sign_in(own, "mallory", PASSWORD).status_code == 200

    responses = guess_until_refused(lambda: thief.post("/auth/password", json=guess), 6, sign_in_as_mallory)
    statuses = [r.status_code for r in responses]
    assert statuses == [403] * ADDRESS_FREE_FAILURES + [429], statuses
    # two more addresses, each under its own free failures: erin's account reaches its 10 and refuses the 11th
    first, second = stolen("127.0.0.7"), stolen("127.0.0.8")
    more = [first.post("/auth/password", json=guess) for _ in range(3)]
    more += [second.post("/auth/password", json=guess) for _ in range(3)]
    assert [r.status_code for r in more] == [403] * 5 + [429], [r.status_code for r in more]
    assert "for this account" in more[-1].json()["error"]["message"]


def test_a_burst_of_guesses_is_counted_as_it_arrives(server):
    """Item 2: 30 concurrent wrong sign-ins from one address: today 30 x 401. The free failures are reserved as the
    attempts arrive, so 5 are checked and 25 refused at once."""
    clients = [browser(server, "127.0.0.6") for _ in range(30)]
    responses = all_at_once([lambda c=c: sign_in(c, "carol", "a guess 123") for c in clients])
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [401] * ADDRESS_FREE_FAILURES + [429] * 25, statuses
    assert {code_of(r) for r in responses if r.status_code == 429} == {(429, "too_many_attempts")}


def test_an_account_attacked_from_many_addresses_is_slowed_but_its_owners_browser_gets_in(server):
    """Item 2: 10 addresses x 5 wrong passwords for dave: today 50 x 401. The account's counter stops them after its
    free failures; a browser that signed in as dave before is not held back, a new one waits (at most 5 min)."""
    own_browser = browser(server, "127.0.0.9")
    assert sign_in(own_browser, "dave", PASSWORD).status_code == 200  # it gets a device cookie
    statuses = []
    for i in range(10):
        attacker = browser(server, f"127.0.0.{10 + i}")
        statuses += [sign_in(attacker, "dave", "a guess 123").status_code for _ in range(5)]
        if i == 1:  # the 10th failure just now made dave's account wait 1 s
            new_device = sign_in(browser(server, "127.0.0.30"), "dave", PASSWORD)
            assert code_of(new_device) == (429, "too_many_attempts")
            assert "for this account" in new_device.json()["error"]["message"]
            assert 1 <= int(new_device.headers["retry-after"]) <= 300
            assert sign_in(own_browser, "dave", PASSWORD).status_code == 200  # recognised: not held back
    assert statuses[:ACCOUNT_FREE_FAILURES] == [401] * ACCOUNT_FREE_FAILURES, statuses
    # after them, one guess each time a wait (1, 2, 4, 8 s) is over: a few on a slow machine, none on a fast one
    assert statuses.count(401) <= ACCOUNT_FREE_FAILURES + 4, statuses


def test_a_full_hashing_queue_answers_503_at_once(server):
    """Item 3: 40 concurrent sign-ins from 40 addresses (each one guess, so no throttle applies): today all 40 queue
    for the hashing threads. Past max_queued_password_checks they are refused at once with 503 and Retry-After."""
    clients = [browser(server, f"127.0.1.{i + 1}") for i in range(40)]
    responses = all_at_once(
        [lambda c=c, i=i: sign_in(c, f"nobody{i}", "a guess 123") for i, c in enumerate(clients)]
    )
    refused = [r for r in responses if r.status_code == 503]
    assert refused, sorted(r.status_code for r in responses)
    assert {r.status_code for r in responses} == {401, 503}
    assert {code_of(r) for r in refused} == {(503, "password_queue_full")}
    assert refused[0].headers["retry-after"] == "1"
    assert f"max_queued_password_checks = {MAX_QUEUED}" in refused[0].json()["error"]["message"]
    # the refused were not counted as guesses: each address signs in at once
    assert sign_in(clients[0], "bob", PASSWORD).status_code == 200


def test_a_flood_that_fills_the_hashing_queue_does_not_keep_a_known_device_out(server):
    """30 addresses keep the hashing queue full with guesses at names that do not exist (each under its free
    failures: the 503s count nothing). fay signs in from a new browser: 503. Merged, her own browser, which signed
    in before, got 503 too, for as long as the flood went on: a handful of addresses kept every user out. Its device
    cookie now passes a full queue (one check at a time per account)."""
    own_browser = browser(server, "127.0.0.41")
    assert sign_in(own_browser, "fay", PASSWORD).status_code == 200  # it gets a device cookie
    full, stop = threading.Event(), threading.Event()

    def flood(i: int) -> None:
        with browser(server, f"127.0.3.{i + 1}") as client:
            for n in range(500):
                if stop.is_set():
                    return
                if sign_in(client, f"flood{i}x{n}", "a guess 123").status_code == 503:
                    full.set()
                time.sleep(0.01)

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(30)]
    for thread in threads:
        thread.start()
    try:
        assert full.wait(60), "the flood never filled the hashing queue"
        assert code_of(sign_in(browser(server, "127.0.0.42"), "fay", PASSWORD)) == (
            503,
            "password_queue_full",
        )
        assert code_of(sign_in(own_browser, "fay", PASSWORD)) == (200, None)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)


def test_a_burst_of_admin_tokens_with_slow_bodies_is_counted_one_by_one(server):
    """The admin sign-in form: 12 concurrent wrong tokens from one address whose bodies come only after every
    request has been let in. The throttle was checked before the body was read, so all 12 were compared (12 x 403);
    now it is checked after, with no wait before the count: 5 are compared, 7 refused."""
    num = 12
    bodies_may_come = threading.Barrier(num)

    def slow_body() -> Iterator[bytes]:
        bodies_may_come.wait()
        time.sleep(0.3)  # every request's head has reached the server
        yield b"token=wrong-token-0123456789"

    def post() -> httpx.Response:
        with browser(server, "127.0.0.40") as c:
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            return c.post("/admin/login", content=slow_body(), headers=headers)

    statuses = sorted(r.status_code for r in all_at_once([post] * num))
    assert statuses == [403] * ADDRESS_FREE_FAILURES + [429] * (num - ADDRESS_FREE_FAILURES), statuses
