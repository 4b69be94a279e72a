"""Who a request is for, in words for the admin page: the engine knows request ids only, so the service labels each
request when it submits it (a chat's title and its owner, an API call's key and `user` field). An account's
label carries its id (and an API call's its key's id) so the admin page can name them (`named`): the username, and
the key's name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

OWNER_ID_CHARS = 8  # enough to tell identities apart on one page, too few to be a credential
ACCOUNT_KIND = "user"  # an account's owner ids are "user:<id>" (app/http/identity.py's ACCOUNT_OWNER)


@dataclass(frozen=True)
class RequestLabel:
    """`source`: "chat" or "api"; `title`: the chat's title or the API call's kind and `user`; `owner`: who.
    `account_id`, `key_id`: the account and per-account API key behind it, for naming; never sent to a page."""

    source: str
    title: str
    owner: str
    account_id: str | None = None
    key_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The label as a JSON object (no ids)."""
        return {"source": self.source, "title": self.title, "owner": self.owner}

    def named(self, username: str | None, key_name: str | None = None) -> RequestLabel:
        """This label with its account's username as the owner ('alice', or 'alice, API key "laptop"' for a
        named per-account key); unchanged without a username (an account deleted since, or none)."""
        if username is None:
            return self
        key = f', API key "{key_name}"' if key_name else (", API key" if self.key_id else "")
        return replace(self, owner=username + key)


def owner_label(owner: str | None) -> str:
    """'browser:Xy12...' -> 'anonymous browser Xy12ab34'; 'key:3f2a...' -> 'API key 3f2a9c1b'; 'user:0f3c...' (an
    account, `--auth local|oidc`) -> 'account 0f3c9a1b'; None -> 'anonymous (no API key)'.

    A browser id is a secret only with the cookie's signature, an API key's owner id is already a digest, and an
    account id names no one without the users table (the admin page names accounts: `RequestLabel.named`); the
    first 8 characters tell identities apart and match the `owner` column of the sessions table.
    """
    if owner is None:
        return "anonymous (no API key)"
    kind, _, ident = owner.partition(":")
    short = ident[:OWNER_ID_CHARS]
    if kind == "browser":
        return f"anonymous browser {short}"
    if kind == "key":
        return f"API key {short}"
    if kind == ACCOUNT_KIND:
        return f"account {short}"
    return owner[: OWNER_ID_CHARS + 8]


def _account_id(owner: str | None) -> str | None:
    kind, _, ident = (owner or "").partition(":")
    return ident if kind == ACCOUNT_KIND and ident else None


def chat_label(title: str, owner: str) -> RequestLabel:
    """A chat session's reply."""
    return RequestLabel("chat", title or "Untitled chat", owner_label(owner), _account_id(owner))


def api_label(kind: str, owner: str | None, user: str | None, key_id: str | None = None) -> RequestLabel:
    """An OpenAI-style call: `kind` chat, completion or response, the caller's key (None: no keys configured), its
    `user`, and the per-account key it came with (`key_id`), if any."""
    what = {"chat": "chat completion", "response": "response"}.get(kind, "completion")
    return RequestLabel(
        "api",
        what + (f", user {user[:64]!r}" if user else ""),
        owner_label(owner),
        _account_id(owner),
        key_id,
    )
