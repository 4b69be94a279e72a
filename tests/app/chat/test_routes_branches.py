"""Conversation branches over the session API on the real tiny engine: regenerate adds a sibling reply, editing any
user message starts a branch there, switching shows another branch, continue extends a reply cut at its limit.

Every branch reuses its common history's full blocks: each reply's reported cached tokens are at least the fork
point's full blocks, `fork_tokens // BLOCK * BLOCK`, where fork_tokens counts the tokens the new prompt shares with
KV an earlier request computed (a prompt's last token is always computed, and so never counts). Where the block the
fork is inside is still cached, it is copied: then cached tokens reach the fork itself.
"""

from __future__ import annotations

import json

import pytest

from app.http.public_prefix import common_prefix_len
from tests.app.factories import make_client, sse_events, wait_pool_idle

BLOCK = 16


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("branches")) as c:
        yield c


def new_session(client, max_tokens: int = 8, **fields) -> str:
    body = {"settings": {"temperature": 0, "max_tokens": max_tokens}, **fields}
    response = client.post("/api/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def turn(client, sid: str, path: str, **body) -> list[dict]:
    """POST a turn; its SSE events (each event's data)."""
    with client.stream("POST", f"/api/sessions/{sid}/{path}", json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(e["data"]) for e in sse_events(response.iter_lines())]


def done_of(events: list[dict]) -> dict:
    assert events[-1]["type"] == "done" and events[-1]["message"]["status"] == "finished", events[-1]
    return events[-1]


def cached(done: dict) -> int:
    return done["usage"]["prompt_tokens_details"]["cached_tokens"]


def full_blocks(fork_tokens: int) -> int:
    return fork_tokens // BLOCK * BLOCK


def after(message: dict) -> int:
    """Tokens whose KV the request of `message` (a reply) computed: its prompt and answer, but the last token."""
    return message["prompt_tokens"] + message["completion_tokens"] - 1


def shown(client, sid: str) -> dict:
    body = client.get(f"/api/sessions/{sid}").json()
    assert body["messages"] == client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    return body


def test_regenerate_adds_versions_and_every_branch_reuses_the_cache(client):
    sid = new_session(client)
    first = done_of(turn(client, sid, "messages", content="Pick a word."))["message"]
    events = turn(client, sid, "regenerate")
    assert events[0]["mode"] == "regenerate" and events[0]["user_message"]["sibling_ids"] == [
        first["parent_id"]
    ]
    assistant_start = events[1]
    second = done_of(events)
    assert cached(second) >= full_blocks(
        first["prompt_tokens"] - 1
    )  # the same prompt: all but its last token
    a1, a2 = first["id"], second["message"]["id"]
    assert (assistant_start["message_id"], assistant_start["sibling_ids"]) == (a2, [a1, a2])
    assert (assistant_start["sibling_index"], assistant_start["continues"]) == (1, False)
    third = done_of(turn(client, sid, "regenerate", message_id=a1))  # any version: a sibling of them all
    a3 = third["message"]["id"]
    body = shown(client, sid)
    assert body["active_leaf_id"] == a3
    assert [(m["role"], m["sibling_ids"], m["sibling_index"]) for m in body["messages"]] == [
        ("user", [first["parent_id"]], 0),
        ("assistant", [a1, a2, a3], 2),
    ]

    switched = client.post(f"/api/sessions/{sid}/branch", json={"message_id": a1})
    assert switched.status_code == 200
    assert switched.json() == {"active_leaf_id": a1, "messages": shown(client, sid)["messages"]}
    assert [m["id"] for m in switched.json()["messages"]] == [first["parent_id"], a1]
    nxt = done_of(turn(client, sid, "messages", content="Another one."))  # extends the version on show
    assert nxt["message"]["parent_id"] != first["parent_id"]
    assert shown(client, sid)["messages"][1]["id"] == a1
    assert cached(nxt) >= full_blocks(after(first))
    wait_pool_idle(client)


def test_editing_any_user_message_starts_a_branch_there(client):
    system = "You are a careful assistant who answers in one short sentence, no more, every time."
    sid = new_session(client, system_prompt=system)
    replies = [done_of(turn(client, sid, "messages", content=f"Question {n}?"))["message"] for n in (1, 2, 3)]
    body = shown(client, sid)
    u1, u2 = body["messages"][0]["id"], body["messages"][2]["id"]

    edited = turn(client, sid, "edit", message_id=u2, content="Question 2, edited?")  # not the last one
    new_user = edited[0]["user_message"]
    assert (new_user["parent_id"], new_user["sibling_ids"], new_user["sibling_index"]) == (
        replies[0]["id"],
        [u2, new_user["id"]],
        1,
    )
    assert cached(done_of(edited)) >= full_blocks(after(replies[0]))
    assert [m["content"] for m in shown(client, sid)["messages"]][:3] == [
        "Question 1?",
        replies[0]["content"],
        "Question 2, edited?",
    ]

    root = turn(client, sid, "edit", message_id=u1, content="Question 1, reworded?")  # the first message
    assert root[0]["user_message"]["sibling_ids"] == [u1, root[0]["user_message"]["id"]]
    builder = client.app.state.services.chat.builder  # what both first prompts share: system prompt, header
    old, new = (
        builder.build_prompt(system, [], q, 8).token_ids for q in ("Question 1?", "Question 1, reworded?")
    )
    fork_tokens = common_prefix_len(old, new)
    assert full_blocks(fork_tokens) >= BLOCK
    assert cached(done_of(root)) >= full_blocks(fork_tokens)
    # and more: the later turns of the first branch filled the block it forks inside, so that block is copied
    assert cached(root[-1]) == fork_tokens
    assert len(shown(client, sid)["messages"]) == 2

    # back to the original first message: its newest continuation is the branch edited at message 2
    back = client.post(f"/api/sessions/{sid}/branch", json={"message_id": u1}).json()["messages"]
    assert [m["content"] for m in back][2] == "Question 2, edited?"
    back = client.post(f"/api/sessions/{sid}/branch", json={"message_id": u2}).json()["messages"]
    assert [m["id"] for m in back][1::2] == [r["id"] for r in replies]  # the original three turns
    fourth = done_of(turn(client, sid, "messages", content="Question 4?"))
    assert cached(fourth) >= full_blocks(after(replies[2]))
    wait_pool_idle(client)


def test_continue_extends_a_reply_cut_at_its_limit_token_exactly(client):
    sid = new_session(client, max_tokens=8)
    cut = done_of(turn(client, sid, "messages", content="Tell me a story."))["message"]
    assert (cut["finish_reason"], cut["completion_tokens"]) == ("length", 8)
    events = turn(client, sid, "continue")
    assert events[0]["mode"] == "continue" and events[0]["user_message"]["id"] == cut["parent_id"]
    assert (events[1]["message_id"], events[1]["continues"], events[1]["sibling_ids"]) == (
        cut["id"],
        True,
        [cut["id"]],
    )
    done = done_of(events)
    grown = done["message"]
    # the prompt is the history and the reply's own 8 tokens: no end of turn, no new assistant header
    assert done["usage"]["prompt_tokens"] == cut["prompt_tokens"] + 8 == grown["prompt_tokens"]
    assert (done["usage"]["completion_tokens"], grown["completion_tokens"]) == (8, 16)
    assert cached(done) >= full_blocks(after(cut))
    deltas = "".join(e["text"] for e in events if e["type"] == "delta")
    assert grown["id"] == cut["id"] and grown["content"] == cut["content"] + deltas
    assert len(deltas) > 0 and grown["finish_reason"] == "length"
    stored = shown(client, sid)["messages"]
    assert [(m["id"], m["content"], m["completion_tokens"]) for m in stored[1:]] == [
        (cut["id"], grown["content"], 16)
    ]
    # greedy and token-exact: the same text as one 16-token reply to the same question
    whole = new_session(client, max_tokens=16)
    assert (
        done_of(turn(client, whole, "messages", content="Tell me a story."))["message"]["content"]
        == (grown["content"])
    )
    wait_pool_idle(client)


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (
            "continue",
            {"message_id": "first"},
            400,
            "message_id must be a message id (a positive integer), got",
        ),
        ("messages", {"content": "x", "parent_id": True}, 400, "parent_id must be a message id"),
        ("branch", {}, 400, "message_id must be a message id (a positive integer), got null"),
        ("branch", {"message_id": 999999}, 400, "message 999999 is not a message of session"),
        (
            "edit",
            {"content": "x", "message_id": 999999},
            400,
            "message_id 999999 is not a message of this session",
        ),
        ("continue", {}, 400, "nothing to continue: the session has no user message yet"),
    ],
)
def test_bad_branch_requests_are_400(client, path, body, status, fragment):
    sid = new_session(client)
    response = client.post(f"/api/sessions/{sid}/{path}", json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]


def test_turns_refuse_messages_that_cannot_take_them(client):
    sid = new_session(client, max_tokens=4)
    reply = done_of(turn(client, sid, "messages", content="Hi"))["message"]
    done_of(turn(client, sid, "messages", content="Again"))
    refusals = {
        "continue": ({"message_id": reply["id"]}, f"message {reply['id']} has messages after it"),
        "edit": ({"message_id": reply["id"], "content": "x"}, f"message_id {reply['id']} is a reply"),
        "messages": (
            {"parent_id": reply["parent_id"], "content": "x"},
            "is a user message: a new message follows",
        ),
    }
    for path, (body, fragment) in refusals.items():
        response = client.post(f"/api/sessions/{sid}/{path}", json=body)
        assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text
    stopped_sid = new_session(client, max_tokens=250)
    with client.stream("POST", f"/api/sessions/{stopped_sid}/messages", json={"content": "Hi"}) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("event: delta"):
                assert client.post(f"/api/sessions/{stopped_sid}/stop").json() == {"stopped": True}
                break
        list(lines)
    response = client.post(f"/api/sessions/{stopped_sid}/continue")  # a stopped reply is not continued
    assert response.status_code == 400
    assert "did not stop at its token limit (status stopped, finish_reason abort)" in response.text
    assert len(shown(client, sid)["messages"]) == 4  # nothing was stored by the refusals
    wait_pool_idle(client)
