"""The router's chains against a real (tiny) engine: same conversation, same hashes, same cached prefix."""

from __future__ import annotations

import pytest

from app.cluster.digest import ReplicaDigest
from app.cluster.routing import choose, pool_hasher, route_key
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.hash_chain import BlockHasher, ChainKey
from tests.app.factories import TINY_BLOCK_BYTES, make_tiny_model_dir

BS = 16
CHAT = [
    {"role": "system", "content": "You answer questions about the solar system, briefly and precisely."},
    {"role": "user", "content": "Which planet has the longest day, and how long is it in Earth days?"},
]


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    config = EngineConfig(
        model=str(make_tiny_model_dir()),
        device="cpu",
        dtype="float32",
        block_size=BS,
        kv_cache_bytes=128 * BS * TINY_BLOCK_BYTES,
        max_model_len=512,
        num_threads=1,
        prefix_cache_salt="pool-7",  # the ingress must hash with it too
    )
    return LLMEngine(config)


def run(engine: LLMEngine, request_id: str, prompt: list[int], salt: str | None, public: int = 0):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine.add_request(request_id, prompt, params, cache_salt=salt, public_prefix_len=public)
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    return done[0]


def decide(engine: LLMEngine, route):
    digest = ReplicaDigest.from_engine("r1", engine.cache_digest(), 100.0)
    return choose(route, [digest, ReplicaDigest.unknown("r2")], "kv", 100.0)


def test_a_conversations_next_turn_matches_what_the_engine_then_takes_from_its_cache(engine):
    hasher = pool_hasher(engine.config)
    turn1 = engine.apply_chat_template(CHAT)
    public = len(
        engine.apply_chat_template(CHAT[:1], add_generation_prompt=False)
    )  # the system prompt's tokens
    key = ChainKey("alice\nsession", public)
    out1 = run(engine, "t1", turn1, "alice\nsession", public)
    route1 = route_key(hasher, turn1, key)
    assert len(route1.chain) == (len(turn1) - 1) // BS >= 2
    assert decide(engine, route1).matched_blocks == len(route1.chain)  # every block of the prompt is cached

    # turn 2: the history (prompt, reply) and a new question, as the service would send it
    question = engine.apply_chat_template([{"role": "user", "content": "And the shortest?"}])
    turn2 = turn1 + list(out1.outputs[0].token_ids) + question
    route2 = route_key(hasher, turn2, key)
    d = decide(engine, route2)
    assert (d.replica, d.outcome) == ("r1", "longest_prefix")
    out2 = run(engine, "t2", turn2, "alice\nsession", public)
    # the engine took exactly the blocks the router saw (plus, at most, part of the next block, copied)
    assert d.matched_blocks * BS <= out2.num_cached_tokens < (d.matched_blocks + 1) * BS
    assert d.matched_blocks > len(route1.chain)  # the reply's full blocks count too

    # another tenant with the same text: only the blocks wholly inside the public system prompt are shared
    bob = route_key(hasher, turn2, ChainKey("bob", public))
    assert decide(engine, bob).matched_blocks == public // BS
    assert run(engine, "b1", turn2, "bob", public).num_cached_tokens == public // BS * BS


def test_a_router_hashing_with_another_pool_salt_sees_nothing(engine):
    prompt = engine.apply_chat_template(CHAT)
    run(engine, "p1", prompt, None)
    right = route_key(pool_hasher(engine.config), prompt, ChainKey())
    wrong = route_key(BlockHasher(BS, b""), prompt, ChainKey())
    assert decide(engine, right).matched_blocks == len(right.chain) > 0
    assert decide(engine, wrong).matched_blocks == 0
