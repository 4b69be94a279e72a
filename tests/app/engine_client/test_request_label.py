"""Who a request is for, as the admin page names it: a chat's title and browser, an API call's key and user."""

from __future__ import annotations

from app.engine_client.request_label import RequestLabel, api_label, chat_label, owner_label
from app.http.identity import account_owner
from app.http.security import BROWSER_OWNER, key_fingerprint


def test_owners_are_named_by_kind_and_a_short_id():
    assert owner_label(BROWSER_OWNER + "Xy12ab34cd56ef78") == "anonymous browser Xy12ab34"
    assert owner_label("key:" + key_fingerprint("sk-test")) == "API key " + key_fingerprint("sk-test")[:8]
    assert owner_label(None) == "anonymous (no API key)"
    assert (
        owner_label(account_owner("0f3c9a1b2d4e5f60718293a4b5c6d7e8")) == "account 0f3c9a1b"
    )  # --auth local|oidc
    assert owner_label("other:thing") == "other:thing"


def test_chat_and_api_labels():
    assert chat_label("Quarterly report", BROWSER_OWNER + "abcdefghijk") == RequestLabel(
        "chat", "Quarterly report", "anonymous browser abcdefgh"
    )
    assert chat_label("", BROWSER_OWNER + "abcdefghijk").title == "Untitled chat"
    assert api_label("chat", None, "alice").to_json() == {
        "source": "api",
        "title": "chat completion, user 'alice'",
        "owner": "anonymous (no API key)",
    }
    assert api_label("completion", "key:0123456789abcdef", None).title == "completion"
    assert len(api_label("chat", None, "u" * 500).title) < 100  # a long `user` field is cut


def test_labels_name_accounts_once_known_and_keep_ids_off_the_page():
    label = chat_label("Trip plans", account_owner("0f3c9a1b2d4e5f60718293a4b5c6d7e8"))
    assert (label.owner, label.account_id) == ("account 0f3c9a1b", "0f3c9a1b2d4e5f60718293a4b5c6d7e8")
    assert label.named("alice").to_json() == {"source": "chat", "title": "Trip plans", "owner": "alice"}
    assert label.named(None) == label  # an account deleted since: its id, as before
    keyed = api_label("chat", account_owner("0f3c"), None, "key-1")
    assert keyed.named("bob", "ci").owner == 'bob, API key "ci"'
    assert keyed.named("bob").owner == "bob, API key"  # a key whose name is not known
    assert chat_label("", BROWSER_OWNER + "Xy12ab34cd56ef78").account_id is None
