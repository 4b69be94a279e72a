"""GET /api/search and GET /api/sessions/{id}/export through the app: the caller's chats only, clear 400s, snippets
with markers, and files that round-trip."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db import MessageStatus
from app.http.security import BROWSER_COOKIE, BROWSER_OWNER, verify_browser_cookie
from tests.app.factories import SAME_ORIGIN, make_client

M0, M1 = "\x02", "\x03"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("search")) as c:
        yield c


def stranger(client: TestClient) -> TestClient:
    """Another browser of the running app (no cookie yet: a new identity)."""
    other = TestClient(client.app, headers=SAME_ORIGIN)
    other.portal = client.portal  # the app's one event loop
    return other


def make_chat(user: TestClient, title: str, *texts: str, **fields: Any) -> str:
    """A session of `user`'s with messages stored as they are (user / assistant in turn)."""
    response = user.post("/api/sessions", json={"title": title, **fields})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    store = user.app.state.services.store
    for i, text in enumerate(texts):
        role = "user" if i % 2 == 0 else "assistant"
        status = MessageStatus.COMPLETE if role == "user" else MessageStatus.FINISHED
        add = functools.partial(store.chats.add_message, sid, role, text, token_ids=[i, i + 1], status=status)
        user.portal.call(add)
    return sid


def search(user: TestClient, q: str, **params: Any) -> dict[str, Any]:
    response = user.get("/api/search", params={"q": q, **params})
    assert response.status_code == 200, response.text
    return response.json()


def test_search_finds_the_callers_chats_only_with_marked_snippets(client):
    mine = make_chat(
        client, "Lefse", "How is lefse made?", "With <b>potatoes</b> & flour; roll the lefse thin."
    )
    other = stranger(client)
    make_chat(other, "Not yours", "my lefse secret")
    body = search(client, "lefse")
    assert body["query"] == "lefse" and body["next_offset"] is None
    assert body["markers"] == {"start": M0, "end": M1}
    [hit] = body["results"]
    assert hit == {
        "session_id": mine,
        "title": "Lefse",
        "updated_at": hit["updated_at"],
        "message_id": hit["message_id"],
        "position": 0,
        "role": "user",
        "snippet": f"How is {M0}lefse{M1} made?",
        "num_matches": 2,
    }
    assert datetime.fromisoformat(hit["updated_at"]).tzinfo is not None
    potatoes = search(client, "potato")["results"][0]  # the stem, typed as a prefix
    assert potatoes["snippet"] == f"With <b>{M0}potatoes{M1}</b> & flour; roll the lefse thin."
    assert [r["title"] for r in search(other, "lefse")["results"]] == ["Not yours"]


def test_deleting_a_chat_takes_it_out_of_search(client):
    sid = make_chat(client, "Gone soon", "the quokka question")
    assert [r["session_id"] for r in search(client, "quokka")["results"]] == [sid]
    assert client.delete(f"/api/sessions/{sid}").status_code == 204
    assert search(client, "quokka")["results"] == []


def test_results_come_in_pages(client):
    ids = {make_chat(client, f"wombat {i}", f"wombat facts, part {i}") for i in range(3)}
    first = search(client, "wombat", limit=2)
    second = search(client, "wombat", limit=2, offset=first["next_offset"])
    assert (first["next_offset"], second["next_offset"]) == (2, None)
    assert {r["session_id"] for r in first["results"] + second["results"]} == ids


@pytest.mark.parametrize("q", ['"', "*", "NEAR(", "AND", "a OR", '"unclosed', "col:x", "x^2 -y"])
def test_fts5_syntax_in_a_search_is_never_a_500(client, q):
    response = client.get("/api/search", params={"q": q})
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert "holds no word to look for" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("params", "param", "fragment"),
    [
        ({}, "q", "q is empty: give the words to search for"),
        ({"q": "   "}, "q", "q is empty"),
        ({"q": "x" * 201}, "q", "q is 201 characters long, over the limit of 200"),
        ({"q": '" *'}, "q", "q: the search '\" *' holds no word to look for"),
        ({"q": "a", "limit": "0"}, "limit", "limit must be an integer from 1 to 50, got '0'"),
        ({"q": "a", "limit": "many"}, "limit", "limit must be an integer from 1 to 50"),
        ({"q": "a", "offset": "-1"}, "offset", "offset must be an integer from 0 to 10000, got '-1'"),
    ],
)
def test_bad_searches_are_400_naming_the_parameter(client, params, param, fragment):
    response = client.get("/api/search", params=params)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and fragment in error["message"], error


def test_json_export_round_trips_the_chat(client):
    settings = {"temperature": 0.25, "max_tokens": 64}
    preset = client.post("/api/presets", json={"name": "Planner", "settings": {"top_k": 20}}).json()
    sid = make_chat(
        client,
        "Trip: Oslo/Bergen",
        "Plan it",
        "Day 1: fjords.",
        system_prompt="Be brief.",
        settings=settings,
        preset_id=preset["id"],
    )
    response = client.get(f"/api/sessions/{sid}/export", params={"format": "json"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-disposition"] == 'attachment; filename="trip-oslo-bergen.json"'
    exported = json.loads(response.content)
    shown = client.get(f"/api/sessions/{sid}").json()
    session_keys = ("id", "title", "system_prompt", "settings", "preset_id", "created_at", "updated_at")
    assert exported["session"] == {key: shown[key] for key in session_keys}
    assert exported["session"]["preset_id"] == preset["id"]  # the values the chat leaves unset come from it
    assert exported["pagedchat_export"] == 1
    # the API's fields of each message, but the versions it is among (the export names each parent instead)
    api_keys = [k for k in shown["messages"][0] if k not in ("sibling_ids", "sibling_index")]
    assert [{k: m[k] for k in api_keys} for m in exported["messages"]] == [
        {k: m[k] for k in api_keys} for m in shown["messages"]
    ]
    assert exported["active_leaf_id"] == shown["active_leaf_id"] == exported["messages"][-1]["id"]
    assert [(m["position"], m["status"]) for m in exported["messages"]] == [(0, "complete"), (1, "finished")]
    assert "token_ids" not in exported["messages"][0]
    records = client.portal.call(client.app.state.services.store.chats.list_messages, owner_of(client), sid)
    with_ids = client.get(f"/api/sessions/{sid}/export", params={"token_ids": "true"}).json()
    assert (
        [m["token_ids"] for m in with_ids["messages"]]
        == [list(r.token_ids) for r in records]
        == [[0, 1], [1, 2]]
    )
    assert [datetime.fromisoformat(m["updated_at"]) for m in with_ids["messages"]] == [
        r.updated_at for r in records
    ]


def test_json_export_holds_every_branch_and_markdown_the_one_on_show(client):
    sid = make_chat(client, "Versions", "Name a fruit", "Apple.")
    store = client.app.state.services.store
    first_user = client.get(f"/api/sessions/{sid}").json()["messages"][0]
    # a second version of the question (an edit), and its reply: the branch on show
    edited = client.portal.call(
        functools.partial(store.chats.add_message, sid, "user", "Name a vegetable", parent_id=None)
    )
    client.portal.call(
        functools.partial(store.chats.add_message, sid, "assistant", "Leek.", status=MessageStatus.FINISHED)
    )
    exported = client.get(f"/api/sessions/{sid}/export", params={"format": "json"}).json()
    by_id = {m["id"]: m for m in exported["messages"]}
    assert [m["content"] for m in exported["messages"]] == [
        "Name a fruit",
        "Apple.",
        "Name a vegetable",
        "Leek.",
    ]
    assert by_id[first_user["id"]]["parent_id"] is None and by_id[edited.id]["parent_id"] is None
    assert by_id[exported["active_leaf_id"]]["content"] == "Leek."
    markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "md"}).text
    assert "Name a vegetable" in markdown and "Leek." in markdown
    assert "Apple." not in markdown and "Name a fruit" not in markdown


def test_exports_show_a_system_prompt_changed_between_turns_in_order(client):
    sid = make_chat(client, "Changed", "Plan it", "Day 1: fjords.", system_prompt="Be brief.")
    changed = client.patch(f"/api/sessions/{sid}", json={"system_prompt": "Answer in French."})
    assert changed.status_code == 200, changed.text
    store = client.app.state.services.store
    for role, text in (("user", "And day 2?"), ("assistant", "Jour 2 : Bergen.")):
        status = MessageStatus.COMPLETE if role == "user" else MessageStatus.FINISHED
        client.portal.call(functools.partial(store.chats.add_message, sid, role, text, status=status))
    markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "md"}).text
    order = [
        "## System\n\nBe brief.",
        "Plan it",
        "Day 1: fjords.",
        "## System prompt changed",
        "Answer in French.",
    ]
    order += ["And day 2?", "Jour 2 : Bergen."]
    at = [markdown.index(piece) for piece in order]
    assert at == sorted(at), markdown
    exported = client.get(f"/api/sessions/{sid}/export", params={"format": "json"}).json()
    assert exported["session"]["system_prompt"] == "Answer in French."
    [change] = exported["system_prompt_changes"]
    assert (change["previous"], change["system_prompt"]) == ("Be brief.", "Answer in French.")
    first_turn, second_turn = exported["messages"][1], exported["messages"][2]
    assert first_turn["created_at"] <= change["changed_at"] <= second_turn["created_at"]


def owner_of(user: TestClient) -> str:
    """The owner id the store keys `user`'s sessions on: its signed cookie's browser id."""
    services = user.app.state.services
    return BROWSER_OWNER + verify_browser_cookie(services.signer, user.cookies[BROWSER_COOKIE])


def test_markdown_export_is_an_attachment_named_after_the_title(client):
    preset = client.post("/api/presets", json={"name": "Shell *tips*"}).json()
    sid = make_chat(client, "Café crème", "How?", "```sh\necho '<hi>'\n```", preset_id=preset["id"])
    response = client.get(f"/api/sessions/{sid}/export", params={"format": "md"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/markdown; charset=utf-8"
    assert response.headers["content-disposition"] == (
        "attachment; filename=\"cafe-creme.md\"; filename*=UTF-8''caf%C3%A9-cr%C3%A8me.md"
    )
    text = response.text
    assert text.startswith("# Café crème\n")
    assert "\n\nPreset: Shell \\*tips\\*\n\n" in text  # the preset the chat follows, its name as text
    assert "## User\n\n_" in text and "\n\nHow?\n\n## Assistant\n\n_" in text
    assert text.endswith("\n\n```sh\necho '<hi>'\n```\n")


def test_export_is_for_the_owner_only_and_checks_its_parameters(client):
    sid = make_chat(client, "Private", "my diary")
    assert stranger(client).get(f"/api/sessions/{sid}/export").status_code == 404
    assert client.get("/api/sessions/nope/export").status_code == 404
    for params, param, fragment in [
        ({"format": "pdf"}, "format", "format must be one of json, md, got 'pdf'"),
        ({"token_ids": "yes"}, "token_ids", "token_ids must be true or false, got 'yes'"),
        ({"format": "md", "token_ids": "1"}, "token_ids", "token_ids are exported in the JSON format only"),
    ]:
        response = client.get(f"/api/sessions/{sid}/export", params=params)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and fragment in error["message"], error
