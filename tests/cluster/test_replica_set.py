"""The replica set's own pieces, without Ray: what crosses the wire, how a reply's stream is pumped (a fake
deployment handle), stats added up over replicas, each replica's disk tier, and the settings that ask for replicas."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from typing import Any

import pytest

from app.cluster.loopback import (
    LOOPBACK_ENV,
    apply_loopback_env,
    is_loopback_address,
    use_cluster_network,
)
from app.cluster.replica import replica_config
from app.cluster.replica_engine import ReplicaSetEngine, ReplicaStatus, merge_stats
from app.cluster.routing import Decision, RouteKey
from app.cluster.routing_ledger import LEDGER
from app.cluster.wire import Accepted, Failed, Rejected, slim, with_prompt
from app.engine_client.protocol import EngineInfo, EngineOverloaded, EngineUnavailable
from app.engine_client.request_stream import ReplicaLost, RequestFailed, RequestTimedOut
from app.settings import Settings
from engine.core.config import EngineConfig
from engine.core.hash_chain import BlockHasher, ChainKey
from engine.core.outputs import CompletionOutput, RequestOutput
from engine.core.sequence import FinishReason, SamplingParams
from engine.core.stats import EngineStats


def output(text: str, finished: bool = False, prompt: list[int] | None = None) -> RequestOutput:
    reason = FinishReason.LENGTH if finished else None
    sample = CompletionOutput(
        0, text, [1] * len(text), text_delta=text[-1:], num_new_tokens=1, finish_reason=reason
    )
    return RequestOutput("r1", prompt or [], [sample], num_cached_tokens=0, finished=finished)


class FakeCall:
    """A Serve streaming call: the items, then (optionally) an error, as the replica would send them."""

    def __init__(self, items: list[Any], error: BaseException | None = None) -> None:
        self.items, self.error, self.cancelled = list(items), error, False

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0)
        if self.items:
            return self.items.pop(0)
        if self.error is not None:
            raise self.error
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """The deployment handle: `options(stream=True).generate.remote(...)` gives the next FakeCall."""

    def __init__(self, calls: list[FakeCall]) -> None:
        self.calls, self.sent = calls, []
        self.generate = self

    def options(self, **_: Any) -> FakeHandle:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> FakeCall:
        self.sent.append((args, kwargs))
        return self.calls.pop(0)


def replica_set(calls: list[FakeCall]) -> ReplicaSetEngine:
    engine = ReplicaSetEngine(Settings(replicas=2))
    hasher = BlockHasher(16)
    info = EngineInfo(
        model_name="m",
        config=EngineConfig(block_size=16, max_model_len=512),
        num_blocks=64,
        kv_block_bytes=1024,
        kv_int8_block_bytes=512,
        kv_cache_dtype="float32",
        sampling_defaults=None,
        hasher=hasher,
        vocab_size=1000,
        weight_memory=None,
        tier_directory=None,
        tier_capacity_bytes=None,
    )
    engine._info, engine.ready, engine._handle = info, True, FakeHandle(calls)
    engine.replicas = {"a": ReplicaStatus("a", pid=1, rank=0, state="running")}
    return engine


async def take(stream) -> list[RequestOutput]:
    async with stream:
        return [item async for item in stream]


def test_outputs_cross_without_their_prompt_and_get_it_back():
    full = output("hi", prompt=[5, 6, 7])
    assert slim(full).prompt_token_ids == []
    assert with_prompt(slim(full), [5, 6, 7]) == full


def test_a_reply_streams_through_with_its_prompt_and_its_route_carries_the_engines_chain():
    async def run():
        engine = replica_set(
            [FakeCall([Accepted("a"), slim(output("h")), slim(output("hi", finished=True))])]
        )
        prompt = list(range(40))
        stream = await engine.add_request(
            "r1", prompt, SamplingParams(), cache_salt="t", public_prefix_len=20
        )
        assert engine.health()["replicas"][0]["in_flight"] == 1
        outputs = await take(stream)
        args, kwargs = engine._handle.sent[0]
        return engine, prompt, outputs, kwargs

    engine, prompt, outputs, kwargs = asyncio.run(run())
    assert [o.outputs[0].text for o in outputs] == ["h", "hi"]
    assert all(o.prompt_token_ids == prompt for o in outputs)
    # the route: the cacheable blocks' hashes under the request's tenant key, as the engine computes them
    expected = BlockHasher(16).chain(prompt[:32], ChainKey("t", 20))
    assert kwargs["route"] == RouteKey.from_chain(expected, None)
    assert engine.num_in_flight == 0 and engine.health()["replicas"][0]["in_flight"] == 0


@pytest.mark.parametrize(
    ("rejected", "error"),
    [
        (Rejected("invalid", "prompt too long"), ValueError),
        (Rejected("overloaded", "at its limit", 3), EngineOverloaded),
        (Rejected("unavailable", "stopped"), EngineUnavailable),
    ],
)
def test_a_refusal_raises_what_the_single_engine_raises(rejected, error):
    async def run():
        engine = replica_set([FakeCall([rejected])])
        with pytest.raises(error, match=rejected.message):
            await engine.add_request("r1", [1, 2, 3], SamplingParams())
        return engine

    engine = asyncio.run(run())
    assert engine.num_in_flight == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (FakeCall([Accepted("a"), Failed("engine step failed")]), RequestFailed),
        (FakeCall([Accepted("a"), Failed("timed out", timed_out=True)]), RequestTimedOut),
        (FakeCall([Accepted("a"), slim(output("h"))], error=RuntimeError("actor died")), ReplicaLost),
    ],
)
def test_a_failure_after_acceptance_ends_the_stream_with_its_error(call, error):
    async def run():
        engine = replica_set([call])
        stream = await engine.add_request("r1", [1, 2, 3], SamplingParams())
        with pytest.raises(error):
            await take(stream)
        return engine

    engine = asyncio.run(run())
    assert engine.num_in_flight == 0
    if error is ReplicaLost:  # /health knows at once, not at the next census
        assert engine.replicas["a"].state == "unreachable"


def test_closing_a_stream_early_cancels_its_call_so_the_replica_aborts_it():
    class Endless(FakeCall):
        """Accepted, then outputs forever (until cancelled)."""

        async def __anext__(self) -> Any:
            await asyncio.sleep(0.001)
            if self.items:
                return self.items.pop(0)
            return slim(output("x"))

    async def run():
        call = Endless([Accepted("a")])
        engine = replica_set([call])
        stream = await engine.add_request("r1", [1, 2, 3], SamplingParams())
        async with stream:
            async for _ in stream:
                break
        await asyncio.sleep(0.05)
        return engine, call

    engine, call = asyncio.run(run())
    assert call.cancelled and engine.num_in_flight == 0


def stats(**counts: int) -> EngineStats:
    base = dict.fromkeys((f.name for f in dataclasses.fields(EngineStats)), 0)
    base.update(kv_cache_dtype="int8", tier=None, block_size=16, max_model_len=512, kv_block_bytes=100)
    base.update(counts)
    return EngineStats(**base)


def test_stats_of_replicas_add_up_and_keep_the_pool_shape():
    merged = merge_stats([stats(num_running=2, num_blocks=10), stats(num_running=3, num_blocks=10)])
    assert (merged.num_running, merged.num_blocks, merged.block_size, merged.kv_cache_dtype) == (
        5,
        20,
        16,
        "int8",
    )
    with pytest.raises(EngineUnavailable):
        merge_stats([])


def test_each_replica_keeps_its_disk_tier_in_a_directory_of_its_rank():
    config = EngineConfig(kv_disk_dir="/data/kv")
    assert replica_config(config, 1).kv_disk_dir == "/data/kv/replica-1"
    assert replica_config(EngineConfig(kv_disk_dir=""), 1).kv_disk_dir == ""


def test_settings_ask_for_replicas_and_say_what_is_wrong():
    assert not Settings().uses_ray
    assert Settings(replicas=2).uses_ray and Settings(ray_address="local").uses_ray
    with pytest.raises(ValueError, match="replicas must be at least 1"):
        Settings(replicas=0)
    with pytest.raises(ValueError, match="routing must be one of kv, round-robin, least-loaded"):
        Settings(routing="random")
    with pytest.raises(ValueError, match="threads_per_replica"):
        Settings(threads_per_replica=-1)
    with pytest.raises(
        ValueError, match=r"several models on a Ray cluster \(--ray-address\) need --memory-budget"
    ):
        Settings(ray_address="10.0.0.5:6379", models=("b.gguf",))
    Settings(ray_address="10.0.0.5:6379", models=("b.gguf",), memory_budget_bytes=8 << 30)
    Settings(replicas=2, models=("b.gguf",))  # a local Ray: this machine's memory, as without replicas


def test_loopback_environment_is_set_for_ray(monkeypatch):
    for name in LOOPBACK_ENV:
        monkeypatch.delenv(name, raising=False)
    apply_loopback_env()
    assert all(os.environ[name] == value for name, value in LOOPBACK_ENV.items())


def test_joining_a_cluster_elsewhere_takes_this_machines_network_address(monkeypatch):
    for address in ("local", "", "127.0.0.1:6379", "localhost:6379", "ray://127.0.0.2:10001", "[::1]:6379"):
        assert is_loopback_address(address), address
    for address in ("10.0.0.5:6379", "ray-head.default.svc:6379", "ray://192.168.1.4:10001"):
        assert not is_loopback_address(address), address
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    constants = pytest.importorskip("ray._private.ray_constants")
    monkeypatch.setattr(constants, "ENABLE_RAY_CLUSTER", False)
    use_cluster_network()
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1" and constants.ENABLE_RAY_CLUSTER


@pytest.mark.parametrize("ray_rule", [True, False], ids=["ray's rule", "fallback"])
@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({"RAY_AUTH_TOKEN": "0123456789abcdef0123456789abcdef"}, "token"),  # a token here: present it
        ({"RAY_AUTH_TOKEN": "0123456789abcdef0123456789abcdef", "RAY_AUTH_MODE": "disabled"}, "disabled"),
        ({"HOME": "{tmp}"}, None),  # no token anywhere: nothing to present
    ],
)
def test_joining_presents_this_machines_ray_token(tmp_path, env, mode, ray_rule):
    """A driver joining with ray.init(address=...) sends no token unless RAY_AUTH_MODE=token; a cluster that `ray
    start` put in token mode then refuses it. Run in a fresh interpreter: Ray caches its auth mode per process."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    clean.update({k: v.format(tmp=tmp_path) for k, v in env.items()})
    hide = (
        "" if ray_rule else "sys.modules['ray._private.authentication.authentication_token_setup'] = None; "
    )
    code = (
        f"import os, sys; {hide}from app.cluster.ray_runtime import present_auth_token; present_auth_token(); "
        "print(os.environ.get('RAY_AUTH_MODE'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == str(mode)


def test_refusals_and_failures_cross_the_wire_as_the_same_exceptions():
    from app.cluster.wire import Failed, Rejected
    from app.engine_client.protocol import EngineOverloaded, EngineUnavailable
    from app.engine_client.request_stream import RequestFailed, RequestTimedOut

    for exc in (ValueError("prompt too long"), EngineOverloaded("busy", 7), EngineUnavailable("stopped")):
        again = Rejected.from_error(exc).to_error()
        assert type(again) is type(exc) and str(again) == str(exc)
        assert getattr(again, "retry_after", None) == getattr(exc, "retry_after", None)
    assert Rejected.from_error(RuntimeError("other")) is None
    assert type(Failed("late", timed_out=True).to_error()) is RequestTimedOut
    assert type(Failed("boom").to_error()) is RequestFailed


def test_replicas_the_cluster_has_no_room_for_are_given_up_with_their_states(monkeypatch):
    """Serve waits for good for replicas pending allocation: the start gives up after its time, deletes the
    application (which ends Serve's wait) and says why, and a load waiting on it is free again."""
    from app.cluster import ray_runtime
    from app.cluster import replica_engine as module

    deleted = threading.Event()
    stops: list[tuple[bool, str]] = []

    def deploy(*_: Any) -> Any:
        deleted.wait(10)  # serve.run's wait, until the application is deleted
        raise RuntimeError(
            "Waiting for application pagedchat-x to be RUNNING, but application doesn't exist."
        )

    def stop(started_ray: bool, app_name: str) -> None:
        stops.append((started_ray, app_name))
        deleted.set()

    monkeypatch.setattr(ray_runtime, "start_ray", lambda *_: False)
    monkeypatch.setattr(ray_runtime, "deploy", deploy)
    monkeypatch.setattr(ray_runtime, "stop", stop)
    monkeypatch.setattr(ray_runtime, "replica_states", lambda _: {"PENDING_ALLOCATION": 2})
    monkeypatch.setattr(module, "START_TIMEOUT_S", 0.2)
    engine = ReplicaSetEngine(Settings(replicas=2), app_name="pagedchat-x")
    with pytest.raises(
        ValueError, match=r"pagedchat-x did not start within 0 s \(replicas: 2 pending_allocation\)"
    ):
        asyncio.run(engine.start())
    assert stops[0] == (False, "pagedchat-x") and deleted.is_set()
    assert engine.dead_reason is not None and not engine.ready


def test_a_stop_waits_for_a_rolling_restart_and_a_restart_after_a_stop_deploys_nothing(monkeypatch):
    """An unload during a rolling restart deletes the application after the restart's deploy, never before it (a
    deploy after the delete would bring the replicas back with no one to stop them); the deleted replicas' routing
    counts go with them."""
    from app.cluster import ray_runtime

    calls: list[str] = []
    deploying = threading.Event()
    release = threading.Event()

    def deploy(*_: Any) -> Any:
        calls.append("deploy")
        deploying.set()
        release.wait(10)
        return object()

    monkeypatch.setattr(ray_runtime, "deploy", deploy)
    monkeypatch.setattr(ray_runtime, "stop", lambda started, app: calls.append(f"stop {app}"))

    seen = {"pagedchat#gone-1", "pagedchat#gone-2"}  # replicas this set's requests went to

    async def scenario() -> None:
        engine = replica_set([])
        engine._seen.update(seen)
        for name in seen:
            LEDGER.record(Decision(name, 1, 1, "longest_prefix", (name,)), 2)
        restart = asyncio.create_task(engine.rolling_restart())
        await asyncio.to_thread(deploying.wait, 10)
        stop = asyncio.create_task(engine.stop())
        await asyncio.sleep(0.1)
        assert calls == ["deploy"] and not stop.done()  # the delete waits for the deploy under way
        release.set()
        await asyncio.gather(restart, stop)
        assert calls == ["deploy", "stop pagedchat"]
        await engine.rolling_restart()  # stopped: nothing is deployed again
        assert calls == ["deploy", "stop pagedchat"]
        assert not set(LEDGER.snapshot()) & seen  # the deleted replicas' routing counts went with them

    asyncio.run(scenario())
