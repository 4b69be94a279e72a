"""Prefix-cache isolation: block hashes salted per tenant, so a cache hit never tells one tenant what another sent."""

from __future__ import annotations

import pytest

from engine.core.block_manager import BlockManager
from engine.core.hash_chain import ChainKey
from engine.core.sequence import SamplingParams, Sequence
from tests.app.factories import make_client
from tests.reliability.helpers import peer, session_events

SECRET = [
    {"role": "system", "content": "You are the assistant of ACME's merger team. " * 3},
    {"role": "user", "content": "Draft the press release for the takeover of Globex, announced on Monday."},
]


def make_seq(seq_id: int, tokens: list[int], salt: str | None) -> Sequence:
    return Sequence(
        seq_id, f"r{seq_id}", list(tokens), len(tokens), SamplingParams(), 0.0, chain_key=ChainKey(salt)
    )


def test_block_manager_matches_prefixes_only_under_the_same_salt():
    bm = BlockManager(16, 4)
    tokens = list(range(100, 113))  # 3 full blocks and one token
    owner = make_seq(0, tokens, "tenant-a")
    assert bm.allocate_slots(owner, len(tokens), bm.match_prefix(owner)) == []
    owner.num_computed_tokens = len(tokens)
    bm.cache_full_blocks(owner)
    assert len(bm.match_prefix(make_seq(1, tokens, "tenant-a"))) == 3
    assert bm.match_prefix(make_seq(2, tokens, "tenant-b")) == []
    assert bm.match_prefix(make_seq(3, tokens, None)) == []
    assert bm.match_prefix(make_seq(4, tokens, "")) == []  # the empty salt is a tenant too, not "no salt"
    # the salt reaches every block through the chain: tenant b's full chain differs block by block
    a, b = make_seq(5, tokens, "tenant-a"), make_seq(6, tokens, "tenant-b")
    assert all(bm._block_hash(a, i) != bm._block_hash(b, i) for i in range(3))
    assert all(len(bm._block_hash(a, i)) == 16 for i in range(3))  # blake2b digests, never Python's hash()


def cached(client, headers: dict[str, str]) -> tuple[int, int]:
    response = client.post(
        "/v1/chat/completions", json={"messages": SECRET, "max_tokens": 2}, headers=headers
    )
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


@pytest.fixture(scope="module", params=[None, False], ids=["keys-isolate", "isolation-off"])
def keyed(request, tmp_path_factory):
    with make_client(
        tmp_path_factory.mktemp("isolation"),
        api_keys=("sk-a", "sk-b"),
        prefix_cache_isolation=request.param,
    ) as c:
        yield c, request.param is None


def test_another_tenants_prompt_is_no_cache_hit(keyed):
    client, isolated = keyed
    a, b = {"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-b"}
    assert cached(client, a)[0] == 0
    hit, num_prompt = cached(client, a)
    assert hit == (num_prompt - 1) // 16 * 16 > 0  # tenant a reuses every full block of its own prompt
    assert cached(client, b)[0] == (0 if isolated else hit)
    assert cached(client, a)[0] == hit  # and b's request did not disturb a's cache


def test_sessions_share_a_system_prompt_only_within_one_owner(keyed):
    client, isolated = keyed
    system = "You are a careful assistant who answers in one short sentence. " * 4

    def first_turn_cached(owner) -> int:
        sid = owner.post("/api/sessions", json={"system_prompt": system, "settings": {"max_tokens": 2}})
        events = session_events(owner, sid.json()["id"], "hi")
        assert events[0]["prompt_tokens"] == num_prompt
        return events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]

    num_prompt = 64  # the template's rendering of the system prompt and "hi", in the SmolLM2 tokenizer

    a = peer(client, headers={"authorization": "Bearer sk-a"})
    b = peer(client, headers={"authorization": "Bearer sk-b"})
    assert first_turn_cached(a) == 0
    shared = first_turn_cached(a)
    # a second session of the same owner reuses the system prompt's blocks
    assert shared == (num_prompt - 1) // 16 * 16
    assert first_turn_cached(b) == (0 if isolated else shared)
