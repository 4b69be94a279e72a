"""Who a request is for, in words for the admin page: the engine knows request ids only, so the service labels each
request when it submits it (a chat's title and its browser identity, an API call's key and `user` field)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OWNER_ID_CHARS = 8  # enough to tell identities apart on one page, too few to be a credential


@dataclass(frozen=True)
class RequestLabel:
    """`source`: "chat" or "api"; `title`: the chat's title or the API call's kind and `user`; `owner`: who."""

    source: str
    title: str
    owner: str

    def to_json(self) -> dict[str, Any]:
        """The label as a JSON object."""
        return asdict(self)


def owner_label(owner: str | None) -> str:
    """'browser:Xy12...' -> 'browser Xy12ab34'; 'key:3f2a...' -> 'API key 3f2a9c1b'; 'user:0f3c...' (an account,
    `--auth local|oidc`) -> 'account 0f3c9a1b'; None -> 'no API key'.

    A browser id is a secret only with the cookie's signature, an API key's owner id is already a digest, and an
    account id names no one without the users table; the first 8 characters tell identities apart and match the
    `owner` column of the sessions table.
    """
    if owner is None:
        return "no API key"
    kind, _, ident = owner.partition(":")
    short = ident[:OWNER_ID_CHARS]
    if kind == "browser":
        return f"browser {short}"
    if kind == "key":
        return f"API key {short}"
    if kind == "user":
        return f"account {short}"
    return owner[: OWNER_ID_CHARS + 8]


def chat_label(title: str, owner: str) -> RequestLabel:
    """A chat session's reply."""
    return RequestLabel("chat", title or "Untitled chat", owner_label(owner))


def api_label(kind: str, owner: str | None, user: str | None) -> RequestLabel:
    """An OpenAI-style call: `kind` chat, completion or response, the caller's key (None: no keys configured), its `user`."""
    what = {"chat": "chat completion", "response": "response"}.get(kind, "completion")
    return RequestLabel("api", what + (f", user {user[:64]!r}" if user else ""), owner_label(owner))
