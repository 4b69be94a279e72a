"""`pagedchat serve --replicas 2` on the tiny model: Ray Serve replicas behind the same HTTP surface.

One server for the module (Ray starts once): every listener on loopback, /v1 and chat turns served by the replicas,
/metrics and the admin page show each replica, and a replica killed with SIGKILL mid-reply fails that reply only;
Serve restarts it and the chat goes on. A second model, served beside it, loads on its first request as a replica
set of its own and unloads with it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from bench.common.servers import stop_server
from bench.replicas.metrics import by_replica, delta, routed_counts
from tests.app.factories import TINY_BLOCK_BYTES, make_tiny_model_dir, sse_events
from tests.e2e.browser_helpers import chromium_browser, expect
from tests.e2e.conftest import Server, server_env, start_server

pytest.importorskip("ray.serve", reason="Ray Serve is the optional extra pagedchat[cluster]")
pytestmark = pytest.mark.timeout(300)
MODEL = "tiny-llama-smollm2-tok-s0"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, tiny_model) -> Iterator[Server]:
    tmp_path = tmp_path_factory.mktemp("replicas")
    running = start_server(
        tmp_path,
        server_env(
            tmp_path,
            tiny_model,
            PAGEDCHAT_REPLICAS="2",
            PAGEDCHAT_MODELS=f"second={make_tiny_model_dir(1)}",  # loaded by the last test only
            PAGEDCHAT_MAX_MODEL_LEN="1024",
            PAGEDCHAT_DEFAULT_MAX_TOKENS="512",
        ),
    )
    try:
        yield running
    finally:
        stop_server(running)


def health(server: Server) -> dict:
    return httpx.get(f"{server.base_url}/health", timeout=10).json()


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (Ray's raylet, GCS and workers are children of the server)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, grew = {pid}, True
    while grew:
        below = {child for child, parent in parents.items() if parent in found}
        grew = not below <= found
        found |= below
    return found


def is_loopback(address: str) -> bool:
    """'127.0.0.1:80', '[::1]:80' or '[::ffff:127.0.0.1]:80' (gRPC's IPv6 socket bound to IPv4 loopback)."""
    host = ipaddress.ip_address(address.rsplit(":", 1)[0].strip("[]"))
    return host.is_loopback or (host.version == 6 and bool(host.ipv4_mapped) and host.ipv4_mapped.is_loopback)


@pytest.mark.budget(
    seconds=60, why="the module's replica set starts here: a Ray head node and two engine actors"
)
def test_every_listener_of_the_server_and_its_ray_processes_is_on_loopback(replicas):
    body = health(replicas)
    assert body["status"] == "ok", body
    assert body["replicas"]["asked"] == 2 and body["replicas"]["ready"] == 2
    pids = descendants(replicas.process.pid)
    assert {r["pid"] for r in body["replicas"]["replicas"]} <= pids
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    ours = []
    for line in listening.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            ours.append((line.split()[3], owners))
    assert len(ours) >= 4, ours  # the HTTP server, GCS, raylet, the replicas' workers ...
    assert [(address, owners) for address, owners in ours if not is_loopback(address)] == []


def metrics(server: Server) -> str:
    response = httpx.get(f"{server.base_url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return response.text


def test_metrics_and_the_admin_page_show_each_replica_and_the_routing(replicas):
    names = [r["name"] for r in health(replicas)["replicas"]["replicas"]]
    assert len(names) == 2
    before = metrics(replicas)
    hits_before = by_replica(before, "prefix_cache_hits_total")
    model = httpx.get(f"{replicas.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    # ~20 blocks: more than two requests' load is worth (RoutingBounds.blocks_per_request, 8 each), so requests whose
    # completion Serve reports only after their reply reached us do not push the next one to the other replica
    prompt = "A long prefix that every request of this test shares, block after block. " * 20
    for i in range(3):
        body = {"model": model, "messages": [{"role": "user", "content": f"{prompt}{i}"}], "max_tokens": 2}
        response = httpx.post(f"{replicas.base_url}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
    routed = delta(routed_counts(before), routed_counts(metrics(replicas)))
    assert sum(routed.values()) == 3, routed
    # the second and third requests go where the first one's blocks are: the kv router's own memory credits them
    assert sum(n for (_, outcome), n in routed.items() if outcome == "longest_prefix") >= 2, routed
    deadline = time.monotonic() + 10  # the census asks the replicas for their stats once a second
    while by_replica(text := metrics(replicas), "prefix_cache_hits_total") == hits_before:
        assert time.monotonic() < deadline, "no replica's prefix hits changed in /metrics"
        time.sleep(0.2)
    for name in ("num_requests_running", "num_requests_waiting", "prefix_cache_queries_total", "replica_up"):
        assert set(by_replica(text, name)) == set(names), name
    assert set(by_replica(text, "replica_up").values()) == {1.0}
    assert f'pagedchat:replicas_ready{{model_name="{MODEL}"}} 2.0' in text
    assert f'pagedchat:replicas_asked{{model_name="{MODEL}"}} 2.0' in text

    state = httpx.get(f"{replicas.base_url}/api/admin/state", timeout=10).json()
    assert [r["name"] for r in state["replicas"]] == names and state["ready"] == 2
    for replica in state["replicas"]:
        assert replica["state"] == "running" and replica["pid"] > 0
        assert len(replica["block_states"]) == replica["num_blocks"] == replica["stats"]["num_blocks"]
    most = max(names, key=lambda name: routed.get((name, "longest_prefix"), 0))
    [holder] = [r for r in state["replicas"] if r["name"] == most]
    assert "c" in holder["block_states"]  # the shared prefix's blocks, cached where the requests went

    with chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{replicas.base_url}/admin")  # loopback without an admin token
        panels = page.locator(".replica-panel")
        expect(panels).to_have_count(2)
        for i, name in enumerate(names):
            expect(panels.nth(i).locator(".replica-name")).to_have_text(name)
            expect(panels.nth(i).locator(".replica-state")).to_have_text("running")
            expect(panels.nth(i).locator("canvas.replica-map")).to_have_attribute("data-blocks", "256")
        expect(page.locator("#map-replica")).to_have_text(f"replica {names[0]}")
        routed_here = panels.nth(names.index(holder["name"])).locator("[data-field=routed]")
        expect(routed_here).to_contain_text("to the longest prefix")
        panels.nth(1).locator(".replica-head").click()  # the rest of the page shows the other replica
        expect(page.locator("#map-replica")).to_have_text(f"replica {names[1]}")
        expect(panels.nth(1)).to_have_class("replica-panel is-focused")
        assert errors == []


def converse(base_url: str, user: int, turns: int) -> list[tuple[int, int]]:
    """One /v1 conversation (no session id): (prompt tokens, cached tokens) of each turn."""
    # ~600 tokens (~38 blocks) of history: a cached prefix worth more than the 4 requests of load (8 blocks each,
    # README: the score) by which one replica can be busier than the other here
    messages = [{"role": "system", "content": f"You are the assistant of desk {user}. " * 72}]
    usage = []
    with httpx.Client(base_url=base_url, timeout=60) as http:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Question {turn} from desk {user}: what next?"})
            body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
            answer = http.post("/v1/chat/completions", json=body).json()
            messages.append(answer["choices"][0]["message"])
            usage.append(
                (answer["usage"]["prompt_tokens"], answer["usage"]["prompt_tokens_details"]["cached_tokens"])
            )
    return usage


def test_v1_conversations_turns_go_where_their_history_is_cached(replicas):
    with ThreadPoolExecutor(4) as pool:  # at once: load spreads the first turns over both replicas
        conversations = list(pool.map(lambda user: converse(replicas.base_url, user, 3), range(4)))
    block_size = 16
    for usage in conversations:
        for (before, _), (_, cached) in zip(usage, usage[1:], strict=False):
            # the whole history but the last partial block of the turn before is cached: on its replica
            assert cached >= before - block_size, usage


@pytest.mark.budget(seconds=60, why="each replica's engine is rebuilt in turn while requests keep running")
def test_sighup_restarts_the_replicas_one_at_a_time_while_requests_keep_succeeding(replicas):
    before = {r["pid"] for r in health(replicas)["replicas"]["replicas"]}
    replicas.process.send_signal(signal.SIGHUP)
    statuses, codes = [], []
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=replicas.base_url, timeout=60) as http:
        while time.monotonic() < deadline:
            response = http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
            )
            codes.append(response.status_code)
            body = http.get("/health").json()
            statuses.append(body["status"])
            running = {r["pid"] for r in body["replicas"]["replicas"] if r["state"] == "running"}
            if body["status"] == "ok" and len(running) == 2 and not running & before:
                break
    assert not running & before and len(running) == 2, (before, running)
    assert set(codes) == {200}, codes  # one replica at a time: the other serves meanwhile
    assert "degraded" in statuses and set(statuses) <= {"ok", "degraded"}, statuses
    deadline = time.monotonic() + 30  # Serve reports the deploy done a moment after the last replica serves
    while "rolling restart of pagedchat done" not in replicas.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "rolling restart of pagedchat done" in replicas.log()


def reply(http: httpx.Client, sid: str, content: str) -> list[dict]:
    with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": content}) as response:
        assert response.status_code == 200
        return [{"event": e["event"], **json.loads(e["data"])} for e in sse_events(response.iter_lines())]


def test_a_replica_killed_mid_reply_fails_only_that_reply_and_the_chat_goes_on(replicas):
    with httpx.Client(base_url=replicas.base_url, timeout=60, headers={"origin": replicas.base_url}) as http:
        sid = http.post(
            "/api/sessions", json={"title": "failover", "settings": {"temperature": 0, "max_tokens": 8}}
        ).json()["id"]
        assert reply(http, sid, "one")[-1]["message"]["status"] == "finished"
        # sampled: the tiny random model's greedy reply may end early, a sampled one hardly ever meets its EOS
        patched = http.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 1, "max_tokens": 512}})
        assert patched.status_code == 200, patched.text
        with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Never stop"}) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("event: delta"):
                pass
            serving = [r for r in health(replicas)["replicas"]["replicas"] if r["in_flight"]]
            assert len(serving) == 1, serving
            # the tiny model writes hundreds of tokens a second: stop the replica at once, then kill it
            os.kill(serving[0]["pid"], signal.SIGSTOP)
            os.kill(serving[0]["pid"], signal.SIGKILL)
            rest = sse_events(lines)
        done = json.loads(rest[-1]["data"])
        assert done["type"] == "done" and done["reason"] == "replica_lost", done
        assert done["message"]["status"] == "interrupted" and "replica" in done["message"]["error"], done
        stored = http.get(f"/api/sessions/{sid}/messages").json()["messages"]
        assert [(m["role"], m["status"]) for m in stored] == [
            ("user", "complete"),
            ("assistant", "finished"),
            ("user", "complete"),
            ("assistant", "interrupted"),
        ]
        # the next turn goes to a live replica, which recomputes the history
        http.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 0, "max_tokens": 4}})
        assert reply(http, sid, "Are you back?")[-1]["message"]["status"] == "finished"
        assert len(http.get(f"/api/sessions/{sid}/messages").json()["messages"]) == 6
    # Serve restarts the killed replica; meanwhile /health says degraded, not down
    deadline = time.monotonic() + 60
    states = []
    while time.monotonic() < deadline:
        body = health(replicas)
        states.append(body["status"])
        pids = {r["pid"] for r in body["replicas"]["replicas"] if r["state"] == "running"}
        if body["status"] == "ok" and body["replicas"]["ready"] == 2 and serving[0]["pid"] not in pids:
            break
        time.sleep(0.5)
    assert states[0] == "degraded" and states[-1] == "ok", states
    assert set(states) <= {"ok", "degraded"}, states
    assert serving[0]["pid"] not in {r["pid"] for r in health(replicas)["replicas"]["replicas"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.budget(seconds=90, why="the second model's own two engine actors start, then stop")
def test_a_second_model_loads_as_a_replica_set_of_its_own_and_unloads_with_it(replicas):
    client = openai.OpenAI(base_url=replicas.base_url + "/v1", api_key="unused", max_retries=0)
    states = {m.id: m.model_extra["state"] for m in client.models.list().data}
    assert states == {MODEL: "loaded", "second": "not_loaded"}, states
    default_pids = {r["pid"] for r in health(replicas)["replicas"]["replicas"]}

    answer = client.chat.completions.create(
        model="second", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert answer.model == "second" and answer.choices[0].message.content
    base = replicas.base_url + "/api/admin/models"
    rows = {row["id"]: row for row in httpx.get(base, timeout=10).json()["models"]}
    second = rows["second"]
    assert second["state"] == "loaded"
    assert len(second["replicas"]) == 2 and {r["state"] for r in second["replicas"]} == {"running"}
    pids = {r["pid"] for r in second["replicas"]}
    assert len(pids) == 2 and not pids & default_pids  # two new processes, not the default model's replicas
    assert pids <= descendants(replicas.process.pid)
    weights = (make_tiny_model_dir(1) / "model.safetensors").stat().st_size
    # the budget counts each replica's weights (the file's tensors, less its header) and pool (blocks of 16 tokens),
    # as the pool's figure does
    assert second["kv_pool_bytes"] == 2 * second["num_blocks"] * 16 * TINY_BLOCK_BYTES, second
    assert weights - 64 * 1024 < (second["memory_bytes"] - second["kv_pool_bytes"]) / 2 <= weights, second
    assert {r["pid"] for r in rows[MODEL]["replicas"]} == default_pids
    assert {r["pid"] for r in health(replicas)["replicas"]["replicas"]} == default_pids  # /health: --model's
    # /metrics: its replica set's own series under its name, beside --model's
    names = {r["name"] for r in second["replicas"]}
    text = metrics(replicas)
    assert 'pagedchat:replicas_ready{model_name="second"} 2.0' in text
    assert set(by_replica(text, "replica_up")) == names | {r["name"] for r in rows[MODEL]["replicas"]}
    routed = {replica for replica, _ in routed_counts(text)}
    assert names <= routed  # every replica of the set has its routing series (0s until a request goes there)

    headers = {"Origin": replicas.base_url}  # a write from the server's own page (loopback: no admin token)
    unloaded = httpx.post(f"{base}/second/unload", headers=headers, timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "not_loaded", unloaded.text
    assert "replicas" not in unloaded.json()
    deadline = time.monotonic() + 30  # Serve deletes the application: its replicas drain and exit
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, [pid for pid in pids if alive(pid)]
        time.sleep(0.2)
    # the default model's replicas serve on; the second's series left /metrics with it
    assert {r["pid"] for r in health(replicas)["replicas"]["replicas"]} == default_pids
    assert set(by_replica(metrics(replicas), "replica_up")) == {r["name"] for r in rows[MODEL]["replicas"]}
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert again.model == MODEL
