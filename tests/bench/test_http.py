"""`bench serving`, `bench multiturn` (caching on and off, against a llama.cpp-like baseline) and a replica run end
to end against real servers shared by the module (tiny random model, tiny sizes)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shlex
import threading
from http.server import ThreadingHTTPServer

import pytest

from bench.cli import bench_main
from bench.common import servers
from bench.multiturn.command import shared_system_prompt
from bench.replicas.command import RunSpec, measure
from bench.replicas.scenario import make_scenario
from engine.core.config import EngineConfig
from engine.loading.loader import load_tokenizer
from tests.bench.fake_openai import LLAMA_TIMINGS, fake_server
from tests.bench.helpers import only_result
from tests.engine.bench_helpers import shared_tiny_model

API_KEY = "test-bench-key"
USER_KEYS = f"{API_KEY}-1,{API_KEY}-2"  # bench multiturn: the first key is the warm-up's, then one per user
SYSTEM_TOKENS = 48


@pytest.fixture(scope="module")
def tiny_servers(tmp_path_factory):
    """The tiny model and two pagedchat servers on it (prefix caching on and off), started the bench's way: one API
    key per multiturn user, and the multiturn system prompt published."""
    model = shared_tiny_model()
    logs = tmp_path_factory.mktemp("server-logs")
    # the RAM prefix cache alone, as `bench multiturn` starts its own servers: the bench's runs share user
    # identities, and a disk tier would bring one run's evicted blocks back in the next
    config = EngineConfig(model=model, dtype="float32", kv_cache_bytes=4 * 2**20, kv_disk_bytes=0)
    timed = dataclasses.replace(config, step_timing=True)  # as `bench serving` starts its own
    (logs / "system.txt").write_text(shared_system_prompt(model, SYSTEM_TOKENS))
    env = {
        "PAGEDCHAT_API_KEYS": f"{API_KEY},{USER_KEYS}",
        "PAGEDCHAT_SHARED_PROMPT_FILES": str(logs / "system.txt"),
    }
    started = [
        servers.start_pagedchat("caching-on", timed, logs, env),
        servers.start_pagedchat(
            "caching-off", dataclasses.replace(config, enable_prefix_caching=False), logs, env
        ),
    ]
    with servers.running(started, timeout_s=120):
        yield model, started[0].base_url, started[1].base_url
    assert all(s.process.poll() is not None for s in started), "servers must be stopped after the benchmark"


@pytest.fixture(scope="module")
def hf_baseline_url(tiny_servers):
    """The HF baseline server, run in-process on a thread (its subprocess start is what pagedchat's exercises)."""
    from bench.common.hf_server import BaselineService, make_handler

    service = BaselineService(tiny_servers[0], "float32", model_name="tiny")
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(service))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_serving_bench_against_pagedchat_and_the_hf_baseline(tiny_servers, hf_baseline_url, tmp_path, capsys):
    model, url, _ = tiny_servers
    argv = shlex.split(
        f"serving --model {model} --dtype float32 --url {url} --api-key {API_KEY} --baseline-url "
        f"{hf_baseline_url} --baseline-name hf_baseline --rates 50 --concurrency 1,2 --num-requests 3 "
        f"--max-tokens 5 --step-timing --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    doc = only_result(tmp_path, "serving")
    assert set(doc["systems"]) == {"pagedchat", "hf_baseline"}
    assert doc["baseline"] == {
        "name": "hf_baseline",
        "url": hf_baseline_url,
        "model": "tiny",
        "started_here": False,
        "memory": None,  # no --baseline-pid: a server given by URL is not measured
    }
    for name, points in doc["systems"].items():
        # the closed-loop point sends max(3, 2 x 2) requests
        assert [(p["load"], p["value"], p["num_requests"], p["num_failed"]) for p in points] == [
            ("rate", 50.0, 3, 0),
            ("concurrency", 1, 3, 0),
            ("concurrency", 2, 4, 0),
        ], name
        for point in points:
            assert point["num_requests"] <= point["output_tokens"] <= sum(doc["workload"]["max_tokens"]), name
            assert point["ttft_ms"]["p50"] > 0 and point["e2e_ms"]["p99"] >= point["ttft_ms"]["p99"], name
            assert "server_predicted_per_token_ms" not in point, name
    assert set(doc["ratios"]) == {"rate=50", "concurrency=1", "concurrency=2"}
    # the server times its decode steps (--step-timing): per point, the steps it ran then, split into parts
    assert all("decode_steps" not in p for p in doc["systems"]["hf_baseline"])
    alone = doc["systems"]["pagedchat"][1]
    (one,) = alone["decode_steps"]  # one request at a time: every decode step has one sequence
    assert one["batch_size"] == 1 and one["num_steps"] >= alone["output_tokens"] - 2 * alone["num_requests"]
    assert one["matmul_ms"] > 0 and one["attention_ms"] > 0 and one["step_ms"] > one["matmul_ms"]
    assert one["rest_ms"] == pytest.approx(one["step_ms"] - one["matmul_ms"] - one["attention_ms"])
    rest = alone["served_rest_ms"]
    assert rest == pytest.approx(alone["tpot_ms"]["mean"] - one["matmul_ms"] - one["attention_ms"])
    assert "timed inside the served engine" in out


def test_multiturn_bench_with_caching_on_and_off(tiny_servers, tmp_path, capsys):
    model, url_on, url_off = tiny_servers
    argv = shlex.split(
        f"multiturn --model {model} --url {url_on} --url-no-caching {url_off} --api-key {API_KEY},{USER_KEYS} "
        f"--users 2 --turns 2 --system-tokens {SYSTEM_TOKENS} --max-tokens 4 --results-dir {tmp_path}"
    )
    assert bench_main(argv) == 0
    doc = only_result(tmp_path, "multiturn")
    runs = doc["runs"]
    assert doc["workload"]["arrivals"] == "staggered"  # the default
    assert set(runs) == {
        "session/caching-on",
        "v1/caching-on",
        "session/caching-on-unpublished",
        "v1/caching-on-unpublished",
        "session/caching-off",
        "v1/caching-off",
    }
    for name, run in runs.items():
        assert run["num_turns_failed"] == 0, (name, run["errors"])
        assert [t["num_ok"] for t in run["turns"]] == [2, 2], name
        assert run["prompt_tokens"] > 2 * 48, name
    assert runs["session/caching-off"]["cached_tokens"] == 0 and runs["v1/caching-off"]["cached_tokens"] == 0
    # the warm-up request put the shared system prompt in the cache, so even turn 1 hits it: it is published, so
    # every user shares it with the warm-up's identity
    assert runs["session/caching-on"]["turns"][0]["mean_cached_tokens"] >= 32
    # unpublished, user 0's first turn computes its own copy (user 1 warmed its own in a lead-in turn)
    for api in ("session", "v1"):
        published, unpublished = runs[f"{api}/caching-on"], runs[f"{api}/caching-on-unpublished"]
        assert unpublished["turns"][0]["mean_cached_tokens"] < published["turns"][0]["mean_cached_tokens"], (
            api
        )
        assert doc["published_prompt_cache_hit_pct"][api] == {
            "published": published["cache_hit_pct"],
            "unpublished": unpublished["cache_hit_pct"],
        }
    assert (
        runs["session/caching-on"]["turns"][1]["mean_cached_tokens"]
        > runs["session/caching-on"]["turns"][0]["mean_cached_tokens"]
    )
    assert [t["name"] for t in doc["targets"]] == [
        "session API, caching on: turn 2 TTFT / turn 1 TTFT",
        "session API, caching on: prompt tokens from the cache %",
    ]
    lines = capsys.readouterr().out.splitlines()
    verdicts = [line.split()[0] for line in lines if "session API, caching on:" in line]
    assert len(verdicts) == 2 and set(verdicts) <= {
        "PASS",
        "FAIL",
    }  # the verdicts themselves depend on timing


def test_multiturn_bench_against_a_llama_cpp_baseline(tiny_servers, tmp_path, capsys):
    """The same users' /v1 conversations against pagedchat and a llama.cpp-like server: every turn of both, the same
    messages to both, history resent each turn, one connection per request, wall time and ratios reported."""
    model, url_on, _ = tiny_servers
    with fake_server("smollm.gguf", "llamacpp", LLAMA_TIMINGS) as (baseline_url, theirs):
        argv = shlex.split(
            f"multiturn --model {model} --url {url_on} --api-key {API_KEY},{USER_KEYS} --baseline-url "
            f"{baseline_url} --users 2 --turns 3 --arrivals together --system-tokens {SYSTEM_TOKENS} "
            f"--max-tokens 4 --results-dir {tmp_path}"
        )
        assert bench_main(argv) == 0
    doc = only_result(tmp_path, "multiturn-baseline")
    assert doc["baseline"] == {"name": "llama.cpp", "url": baseline_url, "model": "smollm.gguf"}
    assert set(doc["systems"]) == {"pagedchat", "llama.cpp"}
    for name, run in doc["systems"].items():
        assert run["num_turns_failed"] == 0, (name, run["errors"])
        assert [t["num_ok"] for t in run["turns"]] == [2, 2, 2], name
        assert run["wall_s"] > 0 and run["completion_tokens"] >= 6, name
    # pagedchat's published system prompt and each user's own history come from its cache
    assert doc["systems"]["pagedchat"]["turns"][2]["mean_cached_tokens"] >= SYSTEM_TOKENS // 2
    # llama.cpp's cached prompt tokens come from its timings (cache_n) when usage has none
    assert doc["systems"]["llama.cpp"]["cached_tokens"] == 6 * LLAMA_TIMINGS["cache_n"]
    # the baseline saw the warm-up and 2 users x 3 turns, each turn resending the history with the replies so far,
    # every request on its own connection (the admin counters' two reads too)
    chats = theirs.messages_asked
    assert len(chats) == 1 + 6 and theirs.connections == theirs.requests
    assert sorted(len(m) for m in chats[1:]) == [2, 2, 4, 4, 6, 6]
    longest = [m for m in chats if len(m) == 6]
    assert all(m[2] == {"role": "assistant", "content": "alpha beta gamma delta "} for m in longest)
    assert all(m[0]["role"] == "system" and m[0]["content"] == chats[0][0]["content"] for m in chats)
    ratios = doc["ratios"]
    assert ratios["wall_time"] > 0 and len(ratios["ttft_p50_per_turn"]) == 3
    assert "multiturn against llama.cpp" in capsys.readouterr().out


def test_replicas_measure_against_todays_single_process_server(tiny_servers):
    """bench/replicas/command.py's one run end to end, on the plain process (the run `--compare-plain` starts
    first): real /v1 conversations, real /metrics text, which routes nothing."""
    model, url, _ = tiny_servers
    # desk 0's prompt is the one the fixture's servers publish
    scenario = make_scenario(
        load_tokenizer(model),
        num_users=2,
        num_turns=2,
        num_desks=1,
        system_tokens=SYSTEM_TOKENS,
        user_tokens=0,
        seed=0,
    )
    spec = RunSpec("overhead/plain", "overhead", 1, "kv", "", 0)
    args = argparse.Namespace(max_tokens=4, arrivals="together")
    keys = [API_KEY, *USER_KEYS.split(",")]
    run = asyncio.run(measure(url, -1, spec, scenario, keys, args))
    assert run["num_turns_failed"] == 0 and run["throughput"]["num_failed"] == 0, run["errors"]
    assert [t["num_ok"] for t in run["turns"]] == [2, 2]
    assert run["throughput"]["num_requests"] == 4 and run["throughput"]["output_tokens"] > 0
    # turn 2 resends turn 1's history, which this user's own turn 1 left in the cache
    assert run["turns"][1]["mean_cached_tokens"] > run["turns"][0]["mean_cached_tokens"] > 0
    assert run["routing"]["num_routed"] == 0 and run["replica_prefix_hit_pct"] == {}
    assert run["server"] == {"replicas": 1, "routing": "-", "ray_address": "", "threads": 0}
    assert run["ttft_ms_all"]["p50"] > 0


def test_multiturn_document_scenario_against_a_llama_cpp_baseline(tiny_servers, tmp_path, capsys):
    """Questions about a document: each user's first message carries its own document, later turns ask about it;
    both pagedchat APIs and the baseline get the same messages, and later turns read the document from the cache."""
    model, url_on, _ = tiny_servers
    with fake_server("smollm.gguf", "llamacpp", LLAMA_TIMINGS) as (baseline_url, theirs):
        argv = shlex.split(
            f"multiturn --scenario document --model {model} --url {url_on} --api-key {API_KEY},{USER_KEYS} "
            f"--baseline-url {baseline_url} --users 2 --turns 3 --document-tokens 120 --arrivals together "
            f"--system-tokens {SYSTEM_TOKENS} --max-tokens 4 --results-dir {tmp_path}"
        )
        assert bench_main(argv) == 0
    doc = only_result(tmp_path, "multiturn-document")
    assert set(doc["systems"]) == {"pagedchat session", "pagedchat v1", "llama.cpp"}
    for name, run in doc["systems"].items():
        assert run["num_turns_failed"] == 0, (name, run["errors"])
        assert [t["num_ok"] for t in run["turns"]] == [2, 2, 2], name
    # the first turn reads each user's document; the later ones find it (and the history) in the cache
    for api in ("session", "v1"):
        turns = doc["systems"][f"pagedchat {api}"]["turns"]
        assert turns[0]["mean_prompt_tokens"] > 120 + SYSTEM_TOKENS // 2, api
        assert doc["later_turns"][f"pagedchat {api}"]["cache_hit_pct"] >= 80, api
    # turn 1 reads the document: the /v1 run found none of the session run's documents in the cache
    for api in ("session", "v1"):
        first = doc["systems"][f"pagedchat {api}"]["turns"][0]
        assert first["mean_cached_tokens"] < first["mean_prompt_tokens"] - 100, api
    # the baseline saw the /v1 run's first messages: one document per user, different between users
    firsts = [m[1]["content"] for m in theirs.messages_asked[1:] if len(m) == 2]
    assert len(firsts) == 2 and firsts[0] != firsts[1] and all("project report" in f for f in firsts)
    assert [t["name"] for t in doc["targets"]] == [
        "pagedchat session: turns 2-3 prompt from the cache %",
        "pagedchat v1: turns 2-3 prompt from the cache %",
        "later turns' TTFT p50, pagedchat /v1 ÷ llama.cpp",
    ]
    assert doc["ratios"]["later_turns_ttft_pagedchat_over_baseline"] > 0
    assert "questions about a document" in capsys.readouterr().out
