"""Prefix-cache isolation: a cache hit never tells one caller what another sent; published prompts stay shared.

The guess attack: caller A sends a secret system prompt, caller B sends the same text as a guess. Shared blocks
would report B's guess as cached (and answer it faster); with isolation B sees 0 cached tokens, whoever B is: another
browser cookie, another API key, another anonymous /v1 address. A still reuses every full block of its own prompts,
and a system prompt the operator published is shared by everyone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.common.servers import stop_server
from engine.core.block_manager import BlockManager
from engine.core.hash_chain import ChainKey, salt_tag
from engine.core.sequence import SamplingParams, Sequence
from tests.app.factories import make_client, make_tiny_model_dir
from tests.e2e.conftest import Server, server_env, start_server
from tests.reliability.helpers import peer, session_events

BLOCK = 16
SECRET = [
    {"role": "system", "content": "You are the assistant of ACME's merger team. " * 3},
    {"role": "user", "content": "Draft the press release for the takeover of Globex, announced on Monday."},
]
PUBLISHED = "You are the help desk of the city library. Answer questions about opening hours and loans. " * 2
DEFAULT_SYSTEM = "You are a friendly assistant of the city library, answering in one short paragraph. " * 2


def make_seq(seq_id: int, tokens: list[int], salt: str | None) -> Sequence:
    return Sequence(
        seq_id, f"r{seq_id}", list(tokens), len(tokens), SamplingParams(), 0.0, chain_key=ChainKey(salt)
    )


def full_blocks(num_tokens: int) -> int:
    """Prompt tokens a full prefix hit serves (the last token is always computed)."""
    return (num_tokens - 1) // BLOCK * BLOCK


def own_hit(hit: int, num_prompt: int) -> bool:
    """A caller's own prompt again: every full block, and up to the last token where the first request filled the
    prompt's last block (that block is then copied, not recomputed)."""
    return 0 < full_blocks(num_prompt) <= hit <= num_prompt - 1


def secret(tag: str) -> list[dict[str, str]]:
    """SECRET with its system prompt made unique to one test (the servers' caches outlive a test)."""
    return [{"role": "system", "content": f"[{tag}] " + SECRET[0]["content"]}, SECRET[1]]


def v1_cached(client: httpx.Client, messages: list[dict[str, str]], **extra: Any) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one /v1/chat/completions call."""
    response = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def session_cached(client: httpx.Client, system: str, content: str = "hi") -> tuple[int, int]:
    """(cached tokens, prompt tokens) of the first turn of a new session (what the chat UI prints)."""
    created = client.post("/api/sessions", json={"system_prompt": system, "settings": {"max_tokens": 2}})
    assert created.status_code == 201, created.text
    events = session_events(client, created.json()["id"], content)
    return events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"], events[0]["prompt_tokens"]


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


def test_purging_a_tenant_forgets_its_free_blocks_and_nothing_else():
    bm = BlockManager(32, 4)
    tokens = list(range(100, 113))  # 3 full blocks and one token
    public = ChainKey("tenant-a", public_prefix_len=4)  # its first block is everyone's

    def computed(seq: Sequence) -> Sequence:
        bm.allocate_slots(seq, len(seq), bm.match_prefix(seq))
        seq.num_computed_tokens = len(seq)
        bm.cache_full_blocks(seq)
        return seq

    def seq_of(seq_id: int, toks: list[int], key: ChainKey) -> Sequence:
        return Sequence(seq_id, f"r{seq_id}", list(toks), len(toks), SamplingParams(), 0.0, chain_key=key)

    gone = [computed(make_seq(0, tokens, "tenant-a")), computed(make_seq(1, tokens, "tenant-a\nnarrower"))]
    gone.append(computed(seq_of(2, [7] * 4 + tokens, public)))
    kept = computed(make_seq(3, tokens, "tenant-b"))
    running = computed(make_seq(4, [9] * 13, "tenant-a"))  # still in use: its sequence's until it ends
    for seq in [*gone, kept]:
        bm.free(seq)
    # 3 blocks of each of tenant a's three chains, but the public first block of the last
    assert bm.purge_salt(salt_tag("tenant-a")) == 3 + 3 + 3
    assert bm.match_prefix(make_seq(5, tokens, "tenant-a")) == []
    assert bm.match_prefix(make_seq(6, tokens, "tenant-a\nnarrower")) == []
    assert len(bm.match_prefix(seq_of(7, [7] * 4 + tokens, public))) == 1  # the public block stays
    assert len(bm.match_prefix(make_seq(8, tokens, "tenant-b"))) == 3
    assert len(bm.match_prefix(make_seq(9, [9] * 13, "tenant-a"))) == 3
    bm.check_invariants([running])
    stats = bm.stats()
    assert (stats.num_cached_blocks, stats.num_used_blocks) == (3 + 1, 3 + 1)
    # the forgotten blocks are handed out first, before any cached one
    fresh = make_seq(10, list(range(500, 513)), "tenant-c")
    bm.allocate_slots(fresh, len(fresh), [])
    assert all(bm.blocks[b].block_hash is None for b in fresh.block_table)
    assert len(bm.match_prefix(make_seq(11, tokens, "tenant-b"))) == 3


# ---- in process: API keys, isolation on (the default) and off -----------------------------------------------
@pytest.fixture(scope="module", params=[True, False], ids=["isolated-by-default", "isolation-off"])
def keyed(request, tmp_path_factory):
    overrides = {} if request.param else {"prefix_cache_isolation": False}
    with make_client(tmp_path_factory.mktemp("isolation"), api_keys=("sk-a", "sk-b"), **overrides) as c:
        yield c, request.param


def test_another_tenants_prompt_is_no_cache_hit(keyed):
    client, isolated = keyed
    a, b = {"authorization": "Bearer sk-a"}, {"authorization": "Bearer sk-b"}

    def cached(headers: dict[str, str]) -> tuple[int, int]:
        return v1_cached(peer(client, headers=headers), SECRET)

    assert cached(a)[0] == 0
    hit, num_prompt = cached(a)
    assert own_hit(hit, num_prompt)  # tenant a reuses every full block of its own prompt
    assert cached(b)[0] == (0 if isolated else hit)
    assert cached(a)[0] == hit  # and b's request did not disturb a's cache


def test_sessions_share_a_system_prompt_only_within_one_owner(keyed):
    client, isolated = keyed
    system = "You are a careful assistant who answers in one short sentence. " * 4
    num_prompt = 64  # the template's rendering of the system prompt and "hi", in the SmolLM2 tokenizer

    a = peer(client, headers={"authorization": "Bearer sk-a"})
    b = peer(client, headers={"authorization": "Bearer sk-b"})
    first, prompt_tokens = session_cached(a, system)
    # at most the template's head that a's own /v1 prompt above shares with it (part of a block a cached, copied)
    assert prompt_tokens == num_prompt and first < BLOCK
    shared = session_cached(a, system)[0]
    # a second session of the same owner reuses the system prompt's blocks
    assert own_hit(shared, num_prompt)
    # isolated, b reuses none of a's blocks: only the head its own /v1 prompt shares, as a's first session did
    assert session_cached(b, system)[0] == (first if isolated else shared)


# ---- a real server, the default settings: the guess attack across cookies and addresses ----------------------
@pytest.fixture(scope="module")
def open_server(tmp_path_factory) -> Iterator[Server]:
    """`pagedchat serve` without API keys, one shared prompt file and a default system prompt."""
    tmp_path = tmp_path_factory.mktemp("open-server")
    (tmp_path / "library.txt").write_text(PUBLISHED + "\n")
    env = server_env(
        tmp_path,
        str(make_tiny_model_dir()),
        PAGEDCHAT_SHARED_PROMPT_FILES=str(tmp_path / "library.txt"),
        PAGEDCHAT_DEFAULT_SYSTEM_PROMPT=DEFAULT_SYSTEM,
    )
    server = start_server(tmp_path, env)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(make_tiny_model_dir()))


def browser(server: Server) -> httpx.Client:
    """A new browser: its own cookie jar (the first session it creates hands it its cookie)."""
    return httpx.Client(base_url=server.base_url, headers={"origin": server.base_url}, timeout=30)


def anonymous(server: Server, address: str, **headers: str) -> httpx.Client:
    """An anonymous /v1 caller whose connections come from `address` (a 127.0.0.x loopback address)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=server.base_url, transport=transport, headers=headers, timeout=30)


def public_head_len(tokenizer: Any, system: str | None) -> int:
    """Tokens of the ChatML head before the first user message's text: all the template's and the operator's."""
    if system is None:  # SmolLM2's template writes its own default system message
        system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_guess_attack_across_browser_cookies(open_server, tokenizer):
    victim, attacker = browser(open_server), browser(open_server)
    system = secret("cookies")[0]["content"]
    assert session_cached(victim, system)[0] == 0
    hit, num_prompt = session_cached(victim, system)
    assert own_hit(hit, num_prompt)  # the victim's own second chat reuses its blocks
    assert session_cached(attacker, system)[0] == 0  # the exact guess: no hit
    other = "You are the assistant of Initech's audit team."
    # another guess: only what the attacker's own first guess shares with it (the template's head)
    heads = [
        tokenizer.encode(f"<|im_start|>system\n{text}", add_special_tokens=False) for text in (system, other)
    ]
    own = next(i for i, (x, y) in enumerate(zip(*heads, strict=False)) if x != y)
    assert session_cached(attacker, other)[0] == own < BLOCK
    assert session_cached(victim, system)[0] == hit  # the attacker disturbed nothing


def test_guess_attack_across_anonymous_addresses(open_server):
    victim, attacker = anonymous(open_server, "127.0.0.2"), anonymous(open_server, "127.0.0.3")
    messages = secret("addresses")
    assert v1_cached(victim, messages)[0] == 0
    hit, num_prompt = v1_cached(victim, messages)
    assert own_hit(hit, num_prompt)
    assert v1_cached(attacker, messages)[0] == 0
    # without API keys a bearer token proves nothing: it splits an address's cache, never joins another's
    assert v1_cached(anonymous(open_server, "127.0.0.3", authorization="Bearer anything"), messages)[0] == 0
    assert v1_cached(anonymous(open_server, "127.0.0.2", authorization="Bearer anything"), messages)[0] == 0
    # a request's own cache_salt narrows the same way: a fresh chain, reused only with the same salt and caller
    assert v1_cached(victim, messages, cache_salt="s1")[0] == 0
    assert v1_cached(victim, messages, cache_salt="s1")[0] == hit
    assert v1_cached(attacker, messages, cache_salt="s1")[0] == 0
    assert v1_cached(victim, messages)[0] == hit


def test_published_prompts_are_shared_across_callers(open_server, tokenizer):
    one, two = browser(open_server), browser(open_server)
    # a shared prompt file's text: every caller reuses the blocks wholly inside the public head
    shared = public_head_len(tokenizer, PUBLISHED) // BLOCK * BLOCK
    assert shared >= 32
    session_cached(one, PUBLISHED, "When do you open on Sunday?")
    assert session_cached(two, PUBLISHED, "Can I renew a loan online?")[0] == shared
    asked = [{"role": "system", "content": PUBLISHED}, {"role": "user", "content": "Where is the map room?"}]
    assert v1_cached(anonymous(open_server, "127.0.0.4"), asked)[0] == shared
    # the server's default system prompt, in sessions that set none
    default = public_head_len(tokenizer, DEFAULT_SYSTEM) // BLOCK * BLOCK
    session_cached(one, "", "Hello there")
    assert session_cached(two, "", "Good morning")[0] == default > 0
    # the template's own default system message, in /v1 chats without a system message
    template = public_head_len(tokenizer, None) // BLOCK * BLOCK
    v1_cached(anonymous(open_server, "127.0.0.5"), [{"role": "user", "content": "Is the cafe open?"}])
    plain = [{"role": "user", "content": "Do you lend e-books?"}]
    assert v1_cached(anonymous(open_server, "127.0.0.6"), plain)[0] == template == 16


# ---- a real server with API keys --------------------------------------------------------------------------------
def test_guess_attack_across_api_keys(tmp_path, tokenizer):
    env = server_env(tmp_path, str(make_tiny_model_dir()), PAGEDCHAT_API_KEYS="sk-a,sk-b")
    server = start_server(tmp_path, env)
    try:
        a = httpx.Client(base_url=server.base_url, headers={"authorization": "Bearer sk-a"}, timeout=30)
        b = httpx.Client(base_url=server.base_url, headers={"authorization": "Bearer sk-b"}, timeout=30)
        assert v1_cached(a, SECRET)[0] == 0
        hit, num_prompt = v1_cached(a, SECRET)
        assert own_hit(hit, num_prompt)
        assert v1_cached(b, SECRET)[0] == 0
        # a key's sessions and its /v1 calls are one tenant: a session's first turn reuses the system prompt that
        # the same key sent through /v1 (up to the user's text)
        # (its full blocks, and the block it parts inside, copied)
        head = public_head_len(tokenizer, SECRET[0]["content"])
        reused = session_cached(a, SECRET[0]["content"])[0]
        assert 0 < head // BLOCK * BLOCK <= reused <= head
        assert session_cached(b, SECRET[0]["content"])[0] == reused
        assert session_cached(browser(server), SECRET[0]["content"])[0] == 0  # a cookie is another tenant
    finally:
        stop_server(server)


# ---- accounts as the identity (--auth local): the salt, quotas and rate limits key on the account ----------------
ACCOUNT_PASSWORD = "account password 1"


@pytest.fixture(scope="module")
def accounts_app(tmp_path_factory):
    """An in-process app with accounts, a sessions quota and a request rate per client."""
    with make_client(
        tmp_path_factory.mktemp("accounts-isolation"),
        auth="local",
        first_admin="root",
        first_admin_password=ACCOUNT_PASSWORD,
        max_sessions_per_owner=6,
        client_requests_per_minute=8,
    ) as running:
        admin = signed_in(running, "root")
        for name in ("ann", "ben", "cy", "dee"):
            created = admin.post("/api/users", json={"username": name, "password": ACCOUNT_PASSWORD})
            assert created.status_code == 201, created.text
        yield running


def signed_in(running, username: str) -> Any:
    """A new browser (its own cookie jar) signed in as `username`."""
    device = peer(running)
    response = device.post("/auth/login", json={"username": username, "password": ACCOUNT_PASSWORD})
    assert response.status_code == 200, response.text
    return device


def test_guess_attack_across_accounts_and_one_cache_across_an_accounts_devices(accounts_app):
    laptop, phone = signed_in(accounts_app, "ann"), signed_in(accounts_app, "ann")
    attacker = signed_in(accounts_app, "ben")
    system = secret("accounts")[0]["content"]
    assert session_cached(laptop, system)[0] == 0
    hit, num_prompt = session_cached(phone, system)
    assert own_hit(hit, num_prompt)  # another device of the same account: the same tenant
    assert session_cached(attacker, system)[0] == 0  # another account: no hit, whatever the guess
    messages = secret("accounts-v1")
    # /v1 with the account's cookie: the account's own cache, where the new prompt shares only the template's head
    # with the account's chat above (part of a block, copied)
    head, num_v1 = v1_cached(laptop, messages)
    assert head < BLOCK
    assert own_hit(v1_cached(phone, messages)[0], num_v1)
    # the attacker's own head only, none of the account's blocks
    assert v1_cached(attacker, messages)[0] == head
    assert session_cached(laptop, system)[0] == hit  # the attacker disturbed nothing


def test_quotas_and_rate_limits_count_the_account_across_its_devices(accounts_app):
    laptop, phone, other = (signed_in(accounts_app, n) for n in ("cy", "cy", "dee"))
    statuses = [device.post("/api/sessions", json={}).status_code for device in (laptop, phone) * 4]
    assert statuses == [201] * 6 + [403] * 2  # max_sessions_per_owner counts both devices together
    assert other.post("/api/sessions", json={}).status_code == 201
    hello = [{"role": "user", "content": "hi"}]
    codes = [
        device.post("/v1/chat/completions", json={"messages": hello, "max_tokens": 1}).status_code
        for device in (laptop, phone) * 5
    ]
    assert codes == [200] * 8 + [429] * 2  # client_requests_per_minute: one client, however many devices
    assert other.post("/v1/chat/completions", json={"messages": hello, "max_tokens": 1}).status_code == 200
