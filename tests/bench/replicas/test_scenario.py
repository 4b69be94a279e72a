"""bench/replicas/scenario.py: desks' system prompts that share no leading text, users at their desks, growing
conversations, and the published prompt files a server reads back exactly."""

from __future__ import annotations

import pytest

from app.http.public_prefix import published_prompts
from app.settings import settings_from_env
from bench.common.workload import system_prompt, user_turns
from bench.replicas.scenario import DESK_TAG, desk_prompts, make_scenario, server_env, write_prompt_files


class WordTokenizer:
    """One id per distinct whitespace-separated word: enough of a tokenizer for prompt and message lengths."""

    def __init__(self) -> None:
        self.word_to_id: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.word_to_id.setdefault(w, len(self.word_to_id)) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        id_to_word = {i: w for w, i in self.word_to_id.items()}
        return " ".join(id_to_word[i] for i in ids)


def test_desk_prompts_share_no_leading_text_and_desk_0_is_the_plain_prompt():
    tok = WordTokenizer()
    prompts = desk_prompts(tok, 3, 120)
    assert prompts[0] == system_prompt(tok, 120)
    assert prompts[1] == DESK_TAG.format(number=2) + prompts[0]
    assert prompts[2] == DESK_TAG.format(number=3) + prompts[0]
    first_words = [p.split()[:2] for p in prompts]
    assert len({tuple(w) for w in first_words}) == 3  # every pair differs from the first token on
    assert all(len(tok.encode(p)) <= 120 + 2 for p in prompts)


def test_users_sit_at_desk_u_mod_g_with_their_own_seeded_scripts():
    tok = WordTokenizer()
    scenario = make_scenario(
        tok, num_users=5, num_turns=3, num_desks=2, system_tokens=80, user_tokens=0, seed=7
    )
    assert (scenario.num_users, scenario.num_turns) == (5, 3)
    assert scenario.desk_of_user == (0, 1, 0, 1, 0)
    assert scenario.system_of(3) == scenario.system_prompts[1]
    assert scenario.scripts == tuple(tuple(user_turns(u, 3, 7)) for u in range(5))
    again = make_scenario(tok, num_users=5, num_turns=3, num_desks=2, system_tokens=80, user_tokens=0, seed=7)
    assert again == scenario  # the same load for every run of an invocation
    other = make_scenario(tok, num_users=5, num_turns=3, num_desks=2, system_tokens=80, user_tokens=0, seed=8)
    assert other.scripts != scenario.scripts


def test_long_user_messages_are_about_user_tokens_long_and_differ_per_turn():
    tok = WordTokenizer()
    scenario = make_scenario(
        tok, num_users=2, num_turns=3, num_desks=1, system_tokens=60, user_tokens=50, seed=0
    )
    for script in scenario.scripts:
        assert len(set(script)) == 3
        assert all(30 <= len(tok.encode(message)) <= 55 for message in script), [
            len(m.split()) for m in script
        ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_desks": 0}, "--system-prompts must be at least 1, got 0"),
        ({"num_users": 0}, "needs --users >= 1 and --turns >= 1, got 0 and 2"),
        ({"user_tokens": -1}, "--user-tokens must be 0"),
    ],
)
def test_bad_sizes_are_refused_with_the_option_named(kwargs, message):
    sizes = {"num_users": 2, "num_turns": 2, "num_desks": 1, "system_tokens": 40, "user_tokens": 0, "seed": 0}
    with pytest.raises(ValueError, match=message):
        make_scenario(WordTokenizer(), **{**sizes, **kwargs})


def test_the_server_publishes_exactly_the_desks_prompts(tmp_path):
    prompts = desk_prompts(WordTokenizer(), 2, 60)
    env = server_env(write_prompt_files(prompts, tmp_path), ["warm", "user-0"])
    assert env["PAGEDCHAT_API_KEYS"] == "warm,user-0"
    settings = settings_from_env(env)
    assert settings.api_keys == ("warm", "user-0")
    assert published_prompts(settings) == prompts
