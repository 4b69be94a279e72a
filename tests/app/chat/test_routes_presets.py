"""Presets API against the real tiny engine: CRUD, the chat settings' rules, one default per owner, identities kept
apart, chats following a preset (their own settings win), and what a turn then samples with."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db.presets import MAX_PRESETS_PER_OWNER
from app.main import create_app
from tests.app.factories import (
    LOOPBACK_CLIENT,
    SAME_ORIGIN,
    make_client,
    make_engine_factory,
    make_settings,
    make_tiny_model_dir,
    sse_events,
)
from tests.app.http.test_sampling_defaults_routes import RecordingEngine, recorded

TERSE = {
    "name": "Terse",
    "system_prompt": "Answer in one line.",
    "settings": {"temperature": 0.3, "top_k": 5},
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("presets")) as c:
        yield c


@pytest.fixture
def fresh(client) -> TestClient:
    """A new browser identity on the same running app: no presets, no sessions yet."""
    return TestClient(client.app, headers=SAME_ORIGIN)


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/api/presets", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def test_create_list_read_update_delete(fresh):
    terse = create(fresh, **TERSE)
    assert {k: terse[k] for k in ("name", "system_prompt", "settings", "is_default")} == {
        **TERSE,
        "is_default": False,
    }
    other = create(fresh, name="  another  ")  # names are trimmed; settings and prompt default to empty
    assert (other["name"], other["system_prompt"], other["settings"]) == ("another", "", {})
    listed = fresh.get("/api/presets").json()
    assert [p["name"] for p in listed["presets"]] == ["another", "Terse"]  # by name, case-insensitive
    assert listed["default_preset_id"] is None
    assert fresh.get(f"/api/presets/{terse['id']}").json() == terse

    patched = fresh.patch(f"/api/presets/{terse['id']}", json={"settings": {"top_p": 0.9}, "name": "Short"})
    assert patched.status_code == 200, patched.text
    assert (patched.json()["name"], patched.json()["settings"]) == ("Short", {"top_p": 0.9})  # replaced whole
    assert patched.json()["system_prompt"] == TERSE["system_prompt"]

    assert fresh.delete(f"/api/presets/{terse['id']}").status_code == 204
    assert fresh.get(f"/api/presets/{terse['id']}").status_code == 404
    assert fresh.delete(f"/api/presets/{terse['id']}").status_code == 404
    assert fresh.patch(f"/api/presets/{terse['id']}", json={"name": "x"}).status_code == 404
    assert [p["name"] for p in fresh.get("/api/presets").json()["presets"]] == ["another"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"settings": {"temperature": 5}},
            "settings.temperature",
            "settings.temperature must be in [0, 2] for a chat, got 5",
        ),
        (
            {"settings": {"temperature": -1}},
            "settings.temperature",
            "settings.temperature must be in [0, 2] for a chat, got -1",
        ),
        ({"settings": {"top_p": 2}}, "settings.top_p", "settings.top_p must be in (0, 1], got 2.0"),
        (
            {"settings": {"max_tokens": 0}},
            "settings.max_tokens",
            "settings.max_tokens must be a positive integer, got 0",
        ),
        (
            {"settings": {"temperature": "hot"}},
            "settings.temperature",
            'settings.temperature must be a finite number, got "hot"',
        ),
        ({"settings": {"colour": "red"}}, "settings", "settings.colour is not a known setting"),
        ({"settings": []}, "settings", "settings must be an object"),
        ({"name": "  "}, "name", "name must not be empty"),
        ({"name": "x" * 101}, "name", "name is 101 characters long, over the limit of 100"),
        ({"is_default": "yes"}, "is_default", 'is_default must be true or false, got "yes"'),
        ({"colour": "red"}, "colour", "colour is not a preset field"),
    ],
)
def test_bad_fields_are_400_naming_the_field_and_its_limit(client, body, param, message):
    created = client.post("/api/presets", json={"name": "Checked", **body})
    assert created.status_code == 400, created.text
    assert created.json()["error"]["param"] == param
    assert message in created.json()["error"]["message"]
    preset = client.get("/api/presets").json()["presets"]
    assert "Checked" not in [p["name"] for p in preset]  # nothing half-created


def test_an_update_with_a_bad_value_changes_nothing_and_a_name_is_required(fresh):
    preset = create(fresh, **TERSE)
    refused = fresh.patch(
        f"/api/presets/{preset['id']}", json={"name": "New", "settings": {"temperature": 5}}
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "settings.temperature"
    assert fresh.get(f"/api/presets/{preset['id']}").json() == preset
    nameless = fresh.post("/api/presets", json={"settings": {}})
    assert nameless.status_code == 400
    assert nameless.json()["error"] == {
        "message": "name is required: a preset needs a name",
        "type": "invalid_request_error",
        "param": "name",
        "code": "invalid_value",
    }


def test_names_are_unique_per_owner(fresh, client):
    first = create(fresh, name="Same")
    second = create(fresh, name="Other")
    for response in (
        fresh.post("/api/presets", json={"name": "Same"}),
        fresh.patch(f"/api/presets/{second['id']}", json={"name": "Same"}),
    ):
        assert response.status_code == 409, response.text
        assert response.json()["error"]["message"] == "you already have a preset named 'Same'"
        assert (response.json()["error"]["param"], response.json()["error"]["code"]) == ("name", "name_taken")
    assert (
        fresh.patch(f"/api/presets/{first['id']}", json={"name": "Same"}).status_code == 200
    )  # its own name
    create(client, name="Same")  # another owner's names are its own


def test_one_default_per_owner(fresh):
    a = create(fresh, name="A", is_default=True)
    b = create(fresh, name="B")
    assert fresh.get("/api/presets").json()["default_preset_id"] == a["id"]
    assert fresh.patch(f"/api/presets/{b['id']}", json={"is_default": True}).json()["is_default"] is True
    listed = fresh.get("/api/presets").json()
    assert listed["default_preset_id"] == b["id"]
    assert [(p["name"], p["is_default"]) for p in listed["presets"]] == [("A", False), ("B", True)]
    c = create(fresh, name="C", is_default=True)  # created as the default: B steps down
    assert fresh.get("/api/presets").json()["default_preset_id"] == c["id"]
    assert fresh.patch(f"/api/presets/{c['id']}", json={"is_default": False}).status_code == 200
    assert fresh.get("/api/presets").json()["default_preset_id"] is None


def test_another_identity_can_neither_see_nor_change_nor_use_them(client, fresh):
    mine = create(client, name="Private", system_prompt="secret", settings={"top_k": 3})
    assert mine["id"] not in [p["id"] for p in fresh.get("/api/presets").json()["presets"]]
    assert fresh.get(f"/api/presets/{mine['id']}").status_code == 404
    assert fresh.patch(f"/api/presets/{mine['id']}", json={"name": "Taken over"}).status_code == 404
    assert fresh.delete(f"/api/presets/{mine['id']}").status_code == 404
    used = fresh.post("/api/sessions", json={"preset_id": mine["id"]})
    assert used.status_code == 400 and used.json()["error"]["param"] == "preset_id"
    assert used.json()["error"]["message"] == f"preset_id {mine['id']!r} is not one of your presets"
    assert client.get(f"/api/presets/{mine['id']}").json() == mine  # untouched


def test_new_chats_follow_the_default_preset_and_a_deleted_preset_lets_go(fresh):
    assert fresh.post("/api/sessions", json={}).json()["preset_id"] is None  # no presets: none
    preset = create(fresh, **TERSE, is_default=True)
    chat = fresh.post("/api/sessions", json={"settings": {"top_k": 7}}).json()
    assert (chat["preset_id"], chat["settings"]) == (
        preset["id"],
        {"top_k": 7},
    )  # the chat's own stay its own
    assert fresh.post("/api/sessions", json={"preset_id": None}).json()["preset_id"] is None  # asked for none
    other = create(fresh, name="Other")
    moved = fresh.patch(f"/api/sessions/{chat['id']}", json={"preset_id": other["id"]})
    assert moved.status_code == 200 and moved.json()["preset_id"] == other["id"]
    assert (
        fresh.patch(f"/api/sessions/{chat['id']}", json={"title": "kept"}).json()["preset_id"] == other["id"]
    )
    assert fresh.delete(f"/api/presets/{other['id']}").status_code == 204
    after = fresh.get(f"/api/sessions/{chat['id']}").json()
    assert (after["preset_id"], after["settings"]) == (None, {"top_k": 7})


def test_a_chat_rejects_temperature_5_as_a_preset_does(client):
    response = client.post("/api/sessions", json={"settings": {"temperature": 5}})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "settings.temperature must be in [0, 2] for a chat, got 5"


def test_an_owner_keeps_at_most_the_limit(fresh):
    for i in range(MAX_PRESETS_PER_OWNER):
        create(fresh, name=f"p{i}")
    refused = fresh.post("/api/presets", json={"name": "one too many"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "quota_exceeded"
    assert f"max_presets_per_owner {MAX_PRESETS_PER_OWNER}" in refused.json()["error"]["message"]


class PromptRecordingEngine(RecordingEngine):
    """Also keeps each request's prompt token ids."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.prompts: dict[str, list[int]] = {}

    def add_request(self, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> None:
        self.prompts[request_id] = list(prompt)
        super().add_request(request_id, prompt, params, **kwargs)


def turn(client: TestClient, sid: str) -> str:
    """Send one message; the request id of its reply."""
    with client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Hi"}) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.iter_lines())
    return json.loads(events[0]["data"])["request_id"]


@contextlib.contextmanager
def recording_client(tmp_path: Path, **overrides: Any) -> Iterator[TestClient]:
    """A client whose engine records what each request samples with and its prompt."""
    settings = make_settings(tmp_path, make_tiny_model_dir(), **overrides)
    factory = make_engine_factory(settings)
    app = create_app(settings, engine_factory=lambda: PromptRecordingEngine(factory()))
    with TestClient(app, client=LOOPBACK_CLIENT, headers=SAME_ORIGIN) as client:
        yield client


def test_a_turn_samples_with_the_chats_values_then_the_presets_then_the_servers(tmp_path):
    with recording_client(tmp_path, default_repetition_penalty=1.1) as client:
        preset = create(client, **TERSE)
        short = {"max_tokens": 2}

        def chat_turn(**body: Any) -> str:
            created = client.post("/api/sessions", json=body)
            assert created.status_code == 201, created.text
            return turn(client, created.json()["id"])

        followed = chat_turn(preset_id=preset["id"], settings={**short, "top_k": 7})
        # temperature from the preset, top_k the chat's own, top_p built-in, repetition penalty the server's flag
        assert recorded(client, followed) == (0.3, 1.0, 7, 1.1)
        prompts = client.app.state.services.engine.engine.prompts
        assert prompts[followed] == prompts[chat_turn(system_prompt=TERSE["system_prompt"], settings=short)]
        own = chat_turn(preset_id=preset["id"], system_prompt="Be verbose.", settings=short)
        assert (
            prompts[own]
            == prompts[chat_turn(system_prompt="Be verbose.", settings=short)]
            != prompts[followed]
        )


def test_writes_from_another_site_are_refused(fresh):
    preset = create(fresh, name="Mine")
    evil = {"origin": "https://evil.example"}
    for response in (
        fresh.post("/api/presets", json={"name": "pwned"}, headers=evil),
        fresh.patch(f"/api/presets/{preset['id']}", json={"name": "pwned"}, headers=evil),
        fresh.delete(f"/api/presets/{preset['id']}", headers=evil),
    ):
        assert response.status_code == 403 and response.json()["error"]["code"] == "cross_origin_request"
    assert [p["name"] for p in fresh.get("/api/presets").json()["presets"]] == ["Mine"]
