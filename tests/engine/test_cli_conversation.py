"""The terminal chat's line parsing and conversation, without an engine (engine/cli_commands.py, cli_conversation.py);
the chat itself, in a terminal, is tests/e2e/test_cli_chat.py."""

from __future__ import annotations

import json

import pytest

from engine.cli_commands import Command, parse_line
from engine.cli_conversation import Conversation, Reply, Turn
from engine.core.sequence import FinishReason


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("/help", Command("/help", "")),
        ("/SAVE  my chat.json ", Command("/save", "my chat.json")),
        ("/system You are terse.", Command("/system", "You are terse.")),
        ("/etc/hosts is a file", Command("/etc/hosts", "is a file")),  # a command: unknown, so not sent
        ("//etc/hosts is a file", "/etc/hosts is a file"),
        (" /etc/hosts is a file", "/etc/hosts is a file"),
        ("  hello there  ", "hello there"),
        ("   ", None),
        ("//", "/"),
    ],
)
def test_a_line_is_a_command_or_the_message_sent(line, parsed):
    assert parse_line(line) == parsed


def make_conversation() -> Conversation:
    return Conversation(
        system="Be brief.",
        turns=[Turn("user", "hi"), Turn("assistant", "Hello! How", stopped=True), Turn("user", "go on")],
    )


def test_a_stopped_reply_is_in_the_template_messages_as_the_user_saw_it():
    assert make_conversation().messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello! How"},
        {"role": "user", "content": "go on"},
    ]
    assert Conversation(turns=[Turn("user", "hi")]).messages() == [{"role": "user", "content": "hi"}]


def test_reset_keeps_the_system_prompt():
    conversation = make_conversation()
    conversation.reset()
    assert conversation.messages() == [{"role": "system", "content": "Be brief."}]


def test_save_writes_json_with_the_stopped_mark_and_markdown_for_md(tmp_path):
    conversation = make_conversation()
    assert conversation.save(tmp_path / "chat.json", "tiny") == "JSON"
    saved = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert saved == {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello! How", "stopped": True},
            {"role": "user", "content": "go on"},
        ],
    }
    assert conversation.save(tmp_path / "chat.MD", "tiny") == "Markdown"
    assert (tmp_path / "chat.MD").read_text(encoding="utf-8") == (
        "# Chat with tiny\n\n## System\n\nBe brief.\n\n## You\n\nhi\n\n"
        "## Assistant (stopped with Ctrl-C)\n\nHello! How\n\n## You\n\ngo on\n"
    )


def test_save_where_no_file_can_be_written_raises_oserror(tmp_path):
    conversation = make_conversation()
    with pytest.raises(FileNotFoundError):
        conversation.save(tmp_path / "no-such-folder" / "chat.json", "tiny")
    with pytest.raises(IsADirectoryError):
        conversation.save(tmp_path, "tiny")


def test_reply_summary_and_speed():
    reply = Reply(
        text="abc",
        num_prompt_tokens=40,
        num_cached_tokens=32,
        num_tokens=11,
        finish_reason=FinishReason.ABORT,
        first_token_s=0.05,
        decode_s=0.5,
    )
    assert reply.stopped and reply.tokens_per_s == 20.0
    assert reply.summary() == "11 tokens, 20.0 tokens/s; 40 prompt tokens, 32 from the prefix cache"
    one = Reply("a", 5, 0, 1, FinishReason.STOP)
    assert not one.stopped and one.tokens_per_s is None
    assert one.summary() == "1 token; 5 prompt tokens, 0 from the prefix cache"
