"""Sampling defaults reach every route: a request that leaves a field out gets the server flag's value, else the model
generation config's, else the built-in one; /v1/models and the chat page show them."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.main import create_app
from engine.core.sequence import SamplingParams
from tests.app.factories import (
    LOOPBACK_CLIENT,
    SAME_ORIGIN,
    make_engine_factory,
    make_settings,
    make_tiny_model_dir,
    sse_events,
)

MODEL_SAMPLING = {"do_sample": True, "temperature": 0.3, "top_p": 0.8, "top_k": 7}
HELLO = [{"role": "user", "content": "Hello"}]


class RecordingEngine:
    """The real engine, keeping the SamplingParams of each request it is given."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.params: dict[str, SamplingParams] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def add_request(self, request_id: str, prompt: Any, params: SamplingParams, **kwargs: Any) -> None:
        self.params[request_id] = params
        self.engine.add_request(request_id, prompt, params, **kwargs)


def model_dir(root: Path, generation_config: dict[str, Any] | None) -> Path:
    """The tiny model's files, with this generation config (or none)."""
    source = make_tiny_model_dir()
    target = root / "tiny-with-defaults"
    target.mkdir()
    for file in source.iterdir():
        if file.name != "generation_config.json":
            (target / file.name).symlink_to(file)
    if generation_config is not None:
        (target / "generation_config.json").write_text(json.dumps(generation_config))
    return target


@contextlib.contextmanager
def recording_client(root: Path, generation_config: dict | None, **overrides: Any) -> Iterator[TestClient]:
    settings = make_settings(root, model_dir(root, generation_config), **overrides)
    factory = make_engine_factory(settings)
    app = create_app(settings, engine_factory=lambda: RecordingEngine(factory()))
    with TestClient(app, client=LOOPBACK_CLIENT, headers=SAME_ORIGIN) as client:
        yield client


def recorded(client: TestClient, request_id: str) -> tuple[float, float, int, float]:
    params = client.app.state.services.engine.engine.params[request_id]
    return params.temperature, params.top_p, params.top_k, params.repetition_penalty


def chat(client: TestClient, **body: Any) -> str:
    model = client.get("/v1/models").json()["data"][0]["id"]
    response = client.post(
        "/v1/chat/completions", json={"model": model, "messages": HELLO, "max_tokens": 2, **body}
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def model_client(tmp_path_factory):
    with recording_client(tmp_path_factory.mktemp("model-defaults"), MODEL_SAMPLING) as client:
        yield client


def test_a_request_without_sampling_fields_gets_the_models_defaults(model_client):
    assert recorded(model_client, chat(model_client)) == (0.3, 0.8, 7, 1.0)
    completion = model_client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    assert recorded(model_client, completion.json()["id"]) == (0.3, 0.8, 7, 1.0)


def test_the_requests_own_values_win(model_client):
    request_id = chat(model_client, temperature=0, top_p=1.0, top_k=0, repetition_penalty=1.2)
    assert recorded(model_client, request_id) == (0.0, 1.0, 0, 1.2)
    assert recorded(model_client, chat(model_client, temperature=None)) == (0.3, 0.8, 7, 1.0)  # null: default


def test_models_shows_the_effective_defaults_and_their_sources(model_client):
    model = model_client.get("/v1/models").json()["data"][0]
    assert model["sampling_defaults"] == {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 7,
        "repetition_penalty": 1.0,
    }
    assert model["sampling_defaults_source"] == {
        "temperature": "model",
        "top_p": "model",
        "top_k": "model",
        "repetition_penalty": "built-in",
    }


def test_a_session_turn_and_its_settings_use_the_same_defaults(model_client):
    response = model_client.post("/api/sessions", json={"settings": {"max_tokens": 2, "top_p": 0.5}})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    with model_client.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Hi"}) as reply:
        assert reply.status_code == 200
        start = json.loads(sse_events(reply.iter_lines())[0]["data"])
    assert recorded(model_client, start["request_id"]) == (0.3, 0.5, 7, 1.0)


def test_the_chat_page_shows_the_defaults_it_will_use(model_client):
    page = model_client.get("/").text
    assert (
        'name="temperature" type="number" min="0" max="2" step="0.05"\n            placeholder="0.3"' in page
    )
    assert 'placeholder="0.8"' in page and 'placeholder="7"' in page and 'placeholder="1.0"' in page
    # the chat's max tokens: the server's 512, held to half of max_model_len (512) for the history's room
    assert 'name="max_tokens" type="number" min="1" step="1"\n            placeholder="256"' in page
    assert 'data-default="0.3"\n            data-default-source="model"' in page  # each field says where from
    assert (
        "temperature, top p, top k from the model&#39;s generation config; repetition penalty built-in"
        in page
    )


def test_server_flags_win_over_the_model_and_a_model_without_defaults_gets_builtin(tmp_path):
    with recording_client(tmp_path, None, default_temperature=0.0, default_repetition_penalty=1.1) as client:
        assert recorded(client, chat(client)) == (0.0, 1.0, 0, 1.1)
        model = client.get("/v1/models").json()["data"][0]
        assert model["sampling_defaults"] == {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "repetition_penalty": 1.1,
        }
        assert model["sampling_defaults_source"]["temperature"] == "server"
        assert model["sampling_defaults_source"]["top_p"] == "built-in"
        assert 'placeholder="0.0"' in client.get("/").text


def test_a_bad_server_default_stops_the_start_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"default_top_p must be in \(0, 1\], got 2.0"):
        make_settings(tmp_path, make_tiny_model_dir(), default_top_p=2.0)
