"""Structured output's mask cost against a real server (issue #35, item 8): `guided_regex: "a{100000}"` made every
token mask of its request cost ~46 ms, and the engine waits for every mask of a step, so 8 such requests slowed
everyone's streams 20x. The regex is refused up front now, and a grammar that is costly some other way (nested
counts) ends its own request with an error naming the setting, on a server whose limits are set low here so that
the patterns below are over them by a wide margin (each mask's CPU time is what counts, not the wall)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from bench.common.servers import stop_server
from tests.e2e.conftest import Server, server_env, start_server

# CPU time of one mask on this tiny model's 49k vocabulary (2-core Xeon, busy): (a{100}){150} ~10-18 ms,
# (a{300}[bc]){50} ~0.2-0.4 ms, a plain regex's or a small schema's ~0.01-0.05 ms
MAX_MASK_S = 0.003
BUDGET_S = (
    0.02  # (a{300}[bc]){50}: 50-100 masks, far short of its 15,050 characters; a plain reply: under 1 ms
)
HELLO = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("guided")
    env = server_env(
        tmp_path,
        tiny_model,
        PAGEDCHAT_GUIDED_MASK_MAX_S=str(MAX_MASK_S),
        PAGEDCHAT_GUIDED_MASK_BUDGET_S=str(BUDGET_S),
    )
    running = start_server(tmp_path, env)
    yield running
    stop_server(running)


def chat(server: Server, max_tokens: int, **fields) -> httpx.Response:
    body = {"messages": HELLO, "max_tokens": max_tokens, "temperature": 1.0, "seed": 7, **fields}
    return httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)


def streamed_events(server: Server, max_tokens: int, **fields) -> list[dict | str]:
    """The SSE data of a streamed chat completion: parsed chunks, and the final "[DONE]"."""
    body = {"messages": HELLO, "max_tokens": max_tokens, "temperature": 1.0, "stream": True, **fields}
    events: list[dict | str] = []
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_the_a100000_attack_is_a_400_naming_the_limit(server: Server) -> None:
    response = chat(server, 16, guided_regex="a{100000}")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "guided_regex"
    assert error["message"] == (
        "guided_regex: the regex asks for 100000 repetitions ('{100000}'), over the limit of 2000: every token "
        "mask would cost time in proportion to them"
    )
    schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^x{50000}$"}}}
    response = chat(server, 16, response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    assert response.status_code == 400, response.text
    assert "the JSON schema's pattern asks for 50000 repetitions" in response.json()["error"]["message"]
    server.wait_pool_idle()


def test_a_stream_whose_masks_are_too_costly_ends_with_an_error_naming_the_setting(server: Server) -> None:
    costly = "(a{100}){150}"  # each count under the limit of 2000
    events = streamed_events(server, 64, guided_regex=costly)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "request_failed"
    assert re.fullmatch(
        r"structured output stopped: a token mask took [0-9.]+ ms, over the limit of 3 ms a mask "
        r"\(setting guided_mask_max_s\)",
        error["message"],
    ), error
    # no sample finished: the error is how the stream ends
    assert all(c["finish_reason"] is None for e in events[:-2] for c in e.get("choices", ())), events
    # sent again, it is refused before it runs
    again = chat(server, 64, guided_regex=costly)
    assert again.status_code == 400, again.text
    assert again.json()["error"]["message"].startswith(
        "structured output: the grammar is too costly: a request with it was stopped, a token mask took"
    )
    server.wait_pool_idle()


def test_a_request_whose_masks_go_over_its_budget_fails_and_frees_its_blocks(server: Server) -> None:
    response = chat(server, 400, guided_regex="(a{300}[bc]){50}")  # masks under the ceiling, over the budget
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "request_failed"
    assert re.fullmatch(
        r"structured output stopped: the request's [0-9]+ token masks took 0\.0[0-9]+ s in all, over the budget "
        r"of 0\.02 s a request \(setting guided_mask_budget_s\)",
        error["message"],
    ), error
    server.wait_pool_idle()


def test_normal_guided_requests_and_a_neighbour_are_unaffected(server: Server) -> None:
    results: dict[str, httpx.Response] = {}

    def send(name: str, **fields) -> None:
        results[name] = chat(server, **fields)

    threads = [
        threading.Thread(
            target=send, args=("costly",), kwargs={"max_tokens": 64, "guided_regex": "(a{100}){149}"}
        ),
        threading.Thread(target=send, args=("free",), kwargs={"max_tokens": 32}),
        threading.Thread(
            target=send, args=("code",), kwargs={"max_tokens": 20, "guided_regex": "[0-9]{3}-[a-z]{2}"}
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["costly"].status_code == 500 and "guided_mask_max_s" in results["costly"].text, results[
        "costly"
    ].text
    free = results["free"].json()
    assert free["choices"][0]["finish_reason"] == "length" and free["usage"]["completion_tokens"] == 32
    code = results["code"].json()["choices"][0]
    assert code["finish_reason"] == "stop" and re.fullmatch(
        r"[0-9]{3}-[a-z]{2}", code["message"]["content"]
    ), code
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = chat(
        server, 40, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and isinstance(
        json.loads(choice["message"]["content"])["ok"], bool
    )
    server.wait_pool_idle()
