"""Factories for service tests: a tiny random Llama with the SmolLM2 tokenizer, settings, and an app to test."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.settings import Settings, settings_from_values
from engine.core.sampling_defaults import FIELDS
from tests.app.live_clients import LIVE_CLIENTS, check_pool_idle
from tests.faults import FaultPlan, faulty_engine_factory

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
TINY_BLOCK_BYTES = 2 * 2 * 2 * 16 * 4  # layers * (K, V) * kv_heads * head_dim * fp32 bytes, per token


def smollm2_dir() -> Path:
    """The provisioned SmolLM2-135M-Instruct folder (downloaded and converted on first use)."""
    from engine.loading.provision import provision_default_model

    return provision_default_model()


TINY_MODELS = Path(tempfile.gettempdir()) / "pagedchat-test-models"  # built once per machine, reused
TINY_MODEL_PREFIX = "tiny-llama-smollm2-tok-s"  # then the seed


def make_tiny_model_dir(seed: int = 0) -> Path:
    """A random-weight 2-layer Llama (hidden 64) sharing SmolLM2's tokenizer; built once per machine and reused.
    torch and transformers are imported only to build it: test modules call this at import, during collection."""
    from filelock import FileLock

    root = TINY_MODELS
    target = root / f"{TINY_MODEL_PREFIX}{seed}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "model.safetensors").is_file():
            return target
        import torch
        from safetensors.torch import save_file
        from transformers import LlamaConfig, LlamaForCausalLM

        source = smollm2_dir()
        vocab_size = json.loads((source / "config.json").read_text())["vocab_size"]
        staging = Path(tempfile.mkdtemp(dir=root))
        config = LlamaConfig(vocab_size=vocab_size, **TINY_CONFIG)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                noise = torch.randn(param.shape, generator=gen) * 0.5
                param.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else noise)
        tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(str(staging))
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, staging / name)
        _drop_sampling_defaults(staging / "generation_config.json")
        staging.rename(target)
    return target


def _drop_sampling_defaults(path: Path) -> None:
    """A random model samples with the built-in defaults, not with SmolLM2's card values its tokenizer came with."""
    if path.is_file():
        config = json.loads(path.read_text())
        dropped = {"do_sample", *FIELDS}
        path.write_text(json.dumps({k: v for k, v in config.items() if k not in dropped}, indent=2))


def make_settings(tmp_path: Path, model_dir: Path | str, **overrides: Any) -> Settings:
    """Settings for a test server: tiny KV pool, fp32 on CPU, a temp SQLite database and cache dir (which holds the
    disk tier)."""
    values: dict[str, Any] = dict(
        model=str(model_dir),
        database_url=f"sqlite:///{tmp_path / 'chat.db'}",
        cache_dir=str(tmp_path / "cache"),
        secret_key="test-secret",
        device="cpu",
        dtype="float32",
        block_size=16,
        kv_cache_bytes=256 * 16 * TINY_BLOCK_BYTES,  # 256 blocks of 16 tokens
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        num_threads=1,
        flush_interval_s=0.05,
        allowed_hosts=("testserver",),  # the TestClient's Host
    )
    values.update(overrides)
    return settings_from_values(values)


def make_engine_factory(settings: Settings):
    """The default engine factory, built from settings (the real LLMEngine)."""
    from engine.llm_engine import LLMEngine

    return lambda: LLMEngine(settings.engine_config())


LOOPBACK_CLIENT = ("127.0.0.1", 50000)
# The TestClient's requests go to http://testserver; a browser on the server's own page sends its origin with every
# write, and cookie-authenticated writes without it are refused as cross-site (app/http/csrf.py).
SAME_ORIGIN = {"origin": "http://testserver"}


@contextlib.contextmanager
def make_client(tmp_path: Path, faults: FaultPlan | None = None, **overrides: Any) -> Iterator[TestClient]:
    """A TestClient (from loopback, sending the app's own Origin as the chat page does) on a fresh app with the
    tiny model, running the app's lifespan.

    With `faults`, the app's engine injects them (tests/faults.py); `faults.injected` counts what fired. While it
    is open, every test's teardown checks that its pool holds no block (tests/app/live_clients.py), and so does
    its exit.
    """
    from app.main import create_app

    settings = make_settings(tmp_path, make_tiny_model_dir(), **overrides)
    factory = None if faults is None else faulty_engine_factory(make_engine_factory(settings), faults)
    app = create_app(settings, engine_factory=factory)
    with contextlib.ExitStack() as stack:
        with cheap_password_hashes():  # the app's Passwords is made at startup, in TestClient's enter
            client = stack.enter_context(TestClient(app, client=LOOPBACK_CLIENT, headers=SAME_ORIGIN))
        LIVE_CLIENTS.append(client)
        try:
            yield client
        finally:
            LIVE_CLIENTS.remove(client)
        check_pool_idle(client)  # once more before shutdown (not after an error: that would hide it)


# argon2id at RFC 9106's parameters takes 64 MiB and ~0.2 s of CPU on 4 lanes a hash, by design: the route tests
# sign in dozens of times (about a second a sign-in under the suite's load). Their apps hash with these cheap
# argon2id parameters instead; the parameters' own behaviour (verify, rehash when they change) is
# tests/app/db/test_accounts_store.py's, the hashing queue's tests/app/accounts/test_passwords_queue.py's, and the
# real servers of tests/e2e hash at the real cost.
CHEAP_HASH_PARAMETERS = dict(time_cost=1, memory_cost=1024, parallelism=1)


@contextlib.contextmanager
def cheap_password_hashes() -> Iterator[None]:
    """Apps started inside hash passwords with CHEAP_HASH_PARAMETERS (Passwords' default hasher)."""
    import pytest
    from argon2 import PasswordHasher

    import app.accounts.passwords

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            app.accounts.passwords, "PasswordHasher", lambda: PasswordHasher(**CHEAP_HASH_PARAMETERS)
        )
        yield


def pool_state(client: TestClient) -> dict[str, Any]:
    """The admin snapshot of the block pool."""
    response = client.get("/api/admin/state")
    assert response.status_code == 200, response.text
    return response.json()


def pool_is_idle(state: dict[str, Any]) -> bool:
    """Whether an admin state shows no block in use and no live sequence."""
    return "u" not in state["block_states"] and not state["sequences"]


def service_is_idle(state: dict[str, Any]) -> bool:
    """The pool idle, nothing waiting, and the service holding no stream, reply or undelivered output."""
    service = state["service"]
    return (
        pool_is_idle(state)
        and state["stats"]["num_waiting"] == 0
        and service["in_flight_requests"] == 0
        and service["streaming_replies"] == 0
        and service["pending_outputs"] == 0
    )


def wait_pool_idle(
    client: TestClient, timeout_s: float = 5.0, idle: Callable[[dict[str, Any]], bool] = pool_is_idle
) -> dict[str, Any]:
    """Poll the admin state until `idle(state)` (by default: no block in use, no live sequence; aborts land at
    the engine's next step)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = pool_state(client)
        if idle(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{idle.__name__} still false after {timeout_s} s: {state['stats']} {state.get('service')}"
            )
        time.sleep(0.02)


def metric(text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (`default` when absent, else an assertion)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    if default is not None:
        return default
    raise AssertionError(f"{name} {labels} not in metrics")


def sse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse SSE lines into [{"event": name or None, "data": str}] (comments and blank lines dropped)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in lines:
        if not line:
            if current:
                events.append(current)
                current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            current["data"] = current["data"] + "\n" + value if "data" in current else value
        elif field == "event":
            current["event"] = value
    if current:
        events.append(current)
    return events


def chat_prompt_ids(messages: list[dict[str, str]]) -> list[int]:
    """What the server's tokenizer renders for a /v1/chat/completions request (template + generation prompt)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(make_tiny_model_dir()))
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


# A Qwen2.5-style chat template (written for the tests): tools go into the system turn, calls are
# <tool_call> JSON blocks, tool results come back in a user turn as <tool_response> blocks.
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are a helpful assistant.' }}

# Tools

You may call one or more functions. Their signatures are in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each call, return a JSON object with the function name and arguments in <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role != 'system' %}<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}{% if not tools %}<|im_start|>system
{{ message.content }}<|im_end|>
{% endif %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def make_tiny_tools_model_dir() -> Path:
    """The tiny random model with a chat template that renders tools (Qwen2.5's format)."""
    from filelock import FileLock

    source = make_tiny_model_dir()
    target = source.parent / "tiny-llama-tools-template"
    with FileLock(str(target) + ".lock"):
        if (target / "chat_template.jinja").is_file() and (
            target / "chat_template.jinja"
        ).read_text() == TOOLS_TEMPLATE:
            return target
        shutil.rmtree(target, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=source.parent))
        for item in source.iterdir():
            shutil.copy(item, staging / item.name)
        (staging / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
        staging.rename(target)
    return target
