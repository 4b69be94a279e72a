"""The streams' credential re-check (app/http/credentials.py): what a stream records when it opens, when that is
still alive (a sign-in, an admin account, the admin token, a per-user API key), one lookup an interval however many
streams share a sign-in, a database that cannot answer tried again, and an SSE stream cut at once with its own last
events when the credential goes."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request

from app.db import StoreUnavailable
from app.db.accounts import UserRecord
from app.http.account_auth import ACCOUNT_STATE
from app.http.credentials import (
    API_KEY_ID_STATE,
    Credential,
    credential_alive,
    credential_of,
    revocation,
    until_revoked,
)
from app.http.identity import Account
from app.http.shutdown import Flag
from app.http.sse import Revocation, _until_closing
from app.settings import Settings

TOKEN = "an-admin-token-of-20-chars"
FAREWELL = [{"data": "bye"}]
REVOKED = [{"event": "error", "data": "revoked"}]


def make_user(role: str = "user") -> UserRecord:
    return UserRecord("u1", "frank", role, datetime.now(UTC), False, True, None)


class FakeStore:
    """The store's accounts (`store.accounts`, itself here): session_user answers from `answers` in turn (the last
    one from then on); counts the lookups."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.num_lookups = 0
        self.accounts = self

    async def session_user(self, session_hash: str) -> Any:
        self.num_lookups += 1
        await asyncio.sleep(0.01)  # concurrent callers overlap
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def make_svc(store: Any = None, accounts: Any = None, **settings: Any) -> Any:
    values = {"admin_token": TOKEN, "credential_check_interval_s": 60.0, **settings}
    return SimpleNamespace(settings=Settings(**values), store=store, accounts=accounts)


def make_conn(
    *, account: Account | None = None, headers: dict[str, str] | None = None, **state: Any
) -> Request:
    """A connection as the route sees it once the middleware has looked its cookie up."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
        "app": SimpleNamespace(state=SimpleNamespace()),
        "state": {ACCOUNT_STATE: account, **state},
    }
    return Request(scope)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_many_streams_of_one_sign_in_cost_one_lookup_an_interval():
    async def main():
        store = FakeStore(make_user())
        svc = make_svc(store)
        account = Account(make_user(), "hash-1")
        conn = make_conn(account=account)
        credential = await credential_of(conn, svc, owner=account.owner)
        assert credential == Credential(session_hash="hash-1")
        alive = await asyncio.gather(*(credential_alive(conn, svc, credential) for _ in range(20)))
        again = await credential_alive(conn, svc, credential)  # within the interval: the same answer
        num_shared = store.num_lookups
        await credential_alive(conn, svc, credential, fresh=True)  # a turn asks the database itself
        return alive, again, num_shared, store.num_lookups

    alive, again, num_shared, num_lookups = run(main())
    assert alive == [True] * 20 and again is True
    assert (num_shared, num_lookups) == (1, 2)


def test_an_account_stream_records_the_sign_in_of_its_owner_only():
    async def main():
        account = Account(make_user(), "hash-1")
        svc = make_svc(FakeStore(None))
        of_owner = await credential_of(make_conn(account=account), svc, owner=account.owner)
        of_key = await credential_of(make_conn(account=account), svc, owner="key:abc")  # a server-wide key
        of_browser = await credential_of(make_conn(), svc, owner="browser:xyz")
        return of_owner, of_key, of_browser, revocation(make_conn(), svc, of_browser, lambda: REVOKED)

    of_owner, of_key, of_browser, none = run(main())
    assert of_owner.revocable and not of_key.revocable and not of_browser.revocable and none is None


def test_an_admin_account_stream_dies_with_the_role_a_chat_stream_does_not():
    async def main():
        store = FakeStore(make_user("user"))  # demoted since the streams opened
        svc = make_svc(store)
        admin = Account(make_user("admin"), "hash-1")
        conn = make_conn(account=admin)
        feed = await credential_of(conn, svc, admin=True)
        chat = await credential_of(conn, svc, owner=admin.owner)
        return feed, await credential_alive(conn, svc, feed), await credential_alive(conn, svc, chat)

    feed, feed_alive, chat_alive = run(main())
    assert feed == Credential(session_hash="hash-1", admin_account=True)
    assert (feed_alive, chat_alive) == (False, True)


def test_an_admin_token_stream_dies_with_a_new_admin_token_and_keeps_another_live_credential():
    async def main():
        svc = make_svc(FakeStore(make_user("user")))
        admin = Account(make_user("admin"), "hash-1")
        conn = make_conn(account=admin, headers={"x-admin-token": TOKEN})
        both = await credential_of(conn, svc, admin=True)
        alive = await credential_alive(conn, svc, both)  # demoted, but the token it sent is still the one
        wrong = await credential_of(
            make_conn(headers={"x-admin-token": "not-the-admin-token"}), svc, admin=True
        )
        svc.settings = dataclasses.replace(svc.settings, admin_token="a-new-admin-token-of-20")
        return both, alive, wrong, await credential_alive(conn, svc, both)

    both, alive, wrong, after = run(main())
    assert both.admin_token == TOKEN and both.admin_account
    assert alive is True and after is False
    assert not wrong.revocable  # a token that never matched is no credential (check_admin refused it)


def test_a_per_user_api_key_stream_lives_as_long_as_its_key():
    live_keys = {"key-1"}

    class KeyStore(FakeStore):
        async def api_key_live(self, key_id: str) -> bool:
            return key_id in live_keys

    async def main():
        svc = make_svc(KeyStore(None))
        conn = make_conn(**{API_KEY_ID_STATE: "key-1"})
        credential = await credential_of(conn, svc, owner="user:u1")
        before = await credential_alive(conn, svc, credential)
        live_keys.clear()  # revoked
        return credential, before, await credential_alive(conn, svc, credential, fresh=True)

    credential, before, after = run(main())
    assert credential == Credential(api_key_id="key-1") and (before, after) == (True, False)


def test_the_watcher_returns_once_the_sign_in_is_gone_and_retries_a_database_that_cannot_answer():
    async def main():
        store = FakeStore(make_user(), StoreUnavailable("locked"), make_user(), None)
        svc = make_svc(store, credential_check_interval_s=0.01)
        account = Account(make_user(), "hash-1")
        conn = make_conn(account=account)
        await until_revoked(conn, svc, await credential_of(conn, svc, owner=account.owner))
        return store.num_lookups

    assert run(main()) == 4  # alive, unavailable (tried again), alive, gone


class Source:
    """An event source fed by the test, that records how it ended."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.ended: str | None = None

    async def events(self):
        try:
            while True:
                yield await self.queue.get()
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise


def test_a_revoked_sse_stream_is_cut_at_once_with_its_own_last_events():
    async def main():
        source, closing, gone = Source(), Flag(), asyncio.Event()
        source.queue.put_nowait({"data": "first"})
        revoked = Revocation(gone.wait, lambda: REVOKED)
        stream = _until_closing(source.events(), closing, 30.0, lambda: FAREWELL, revoked)
        got = [await anext(stream)]
        closing.set()  # a shutdown's cut is due in 30 s; the revocation's comes first
        asyncio.get_running_loop().call_later(0.05, gone.set)
        got += [e async for e in stream]
        return got, source.ended

    got, ended = run(main())
    assert got == [{"data": "first"}, *REVOKED] and ended == "cancelled"
