"""Chat export as files: Markdown whose structure survives any message (checked by parsing it back with
CommonMark), and file names that are safe whatever the title."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from markdown_it import MarkdownIt

from app.chat.export import closed_markdown, escape_inline, export_filename, export_markdown
from app.db import MessageRecord, MessageStatus, PromptChange, SessionRecord

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def make_session(**fields) -> SessionRecord:
    values = dict(
        id="s1", owner="o", title="Chat", system_prompt="", settings={}, created_at=T0, updated_at=T0
    )
    return SessionRecord(**{**values, **fields})


def make_message(position: int, role: str, content: str, **fields) -> MessageRecord:
    values = dict(
        id=position + 1,
        session_id="s1",
        parent_id=position or None,  # the message before it (ids are position + 1)
        position=position,
        role=role,
        content=content,
        token_ids=None,
        status=MessageStatus.FINISHED if role == "assistant" else MessageStatus.COMPLETE,
        finish_reason="stop" if role == "assistant" else None,
        prompt_tokens=None,
        completion_tokens=None,
        cached_tokens=None,
        truncated_turns=None,
        timings=None,
        tokenizer_fingerprint=None,
        error=None,
        created_at=T0,
        updated_at=T0,
    )
    return MessageRecord(**{**values, **fields})


def headings(markdown: str) -> list[str]:
    """The document's top-level headings, as a CommonMark reader sees them."""
    tokens = MarkdownIt("commonmark").parse(markdown)
    found = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open" and t.level == 0]
    return ["".join(child.content for child in inline.children or []) for inline in found]


def fences(markdown: str) -> list[tuple[str, str]]:
    return [(t.info, t.content) for t in MarkdownIt("commonmark").parse(markdown) if t.type == "fence"]


def test_markdown_has_the_title_settings_and_each_role_as_a_heading_with_code_intact() -> None:
    code = 'def f(x):\n    return x  # <b>not bold</b>\n\n\nprint(f("`"))'
    session = make_session(
        title="Fix *this* <script>",
        system_prompt="Answer in Python.",
        settings={"temperature": 0.5, "stop": ["`"]},
    )
    messages = [
        make_message(0, "user", "Why does\n\n    this fail?"),
        make_message(1, "assistant", f"Like so:\n\n```python\n{code}\n```\nDone.", completion_tokens=30),
        make_message(2, "user", "And then?"),
        make_message(
            3,
            "assistant",
            "Half an ans",
            status=MessageStatus.STOPPED,
            finish_reason="length",
            completion_tokens=1,
        ),
    ]
    text = export_markdown(session, messages, exported_at=T0)
    assert headings(text) == ["Fix *this* <script>", "System", "User", "Assistant", "User", "Assistant"]
    assert text.startswith(
        "# Fix \\*this\\* \\<script\\>\n\n_Exported from pagedchat on 2026-01-02 03:04:05 UTC"
    )
    assert '- temperature: `0.5`\n- stop: ``["`"]``\n' in text
    assert fences(text) == [("python", code + "\n")]  # the code as it was written, blank lines and all
    assert "## Assistant\n\n_2026-01-02 03:04:05 UTC · 30 tokens_\n\nLike so:" in text
    assert "_2026-01-02 03:04:05 UTC · 1 token · stopped · hit the token limit_\n\nHalf an ans\n" in text


def test_a_system_prompt_changed_after_turns_is_shown_where_it_took_effect() -> None:
    minute = timedelta(minutes=1)
    session = make_session(system_prompt="")  # the prompt now: removed at the end
    messages = [
        make_message(i, role, f"{role} {i}", created_at=T0 + i * minute)
        for i, role in enumerate(["user", "assistant", "user", "assistant"])
    ]
    changes = [
        PromptChange(
            T0 + 1.5 * minute, "Be brief.", "Answer in French."
        ),  # between the first turn and the second
        PromptChange(T0 + 9 * minute, "Answer in French.", ""),  # after the last message
    ]
    text = export_markdown(session, messages, exported_at=T0, prompt_changes=changes)
    assert headings(text) == [
        "Chat",
        "System",
        "User",
        "Assistant",
        "System prompt changed",
        "User",
        "Assistant",
        "System prompt changed",
    ]
    first, changed, removed = text.split("## System")[1:]
    assert first.split("## User")[0].strip() == "Be brief."  # the prompt the chat started with, not today's
    assert changed.startswith(" prompt changed\n\n_2026-01-02 03:05:35 UTC_\n\nAnswer in French.\n")
    assert removed.strip() == "prompt changed\n\n_2026-01-02 03:13:05 UTC_\n\n_(removed)_"
    # without recorded changes: the session's prompt at the top, as before
    plain = export_markdown(make_session(system_prompt="Be brief."), messages, exported_at=T0)
    assert headings(plain) == ["Chat", "System", "User", "Assistant", "User", "Assistant"]


def test_a_reply_stopped_inside_a_fence_is_closed_so_the_next_heading_stays_one() -> None:
    messages = [
        make_message(0, "assistant", "Here:\n\n````js\nlet a = '```';\n", status=MessageStatus.STOPPED),
        make_message(1, "user", "Go on"),
    ]
    text = export_markdown(make_session(), messages, exported_at=T0)
    assert headings(text) == ["Chat", "Assistant", "User"]
    assert fences(text) == [("js", "let a = '```';\n")]


def test_an_open_html_block_becomes_a_code_block() -> None:
    body = "<pre>\nstill open\n\n# not a heading of the chat"
    assert closed_markdown(body) == f"```text\n{body}\n```"
    text = export_markdown(
        make_session(), [make_message(0, "user", body), make_message(1, "user", "x")], exported_at=T0
    )
    assert headings(text) == ["Chat", "User", "User"]


@pytest.mark.parametrize(
    "body",
    ["plain", "- a list\n- of two", "> a quote", "    indented code", "```\nclosed\n```", "a\r\nwindows\r\n"],
)
def test_text_that_closes_its_blocks_is_kept_as_written(body: str) -> None:
    assert closed_markdown(body) == body.replace("\r\n", "\n").rstrip("\n")


def test_inline_text_is_escaped_and_kept_on_one_line() -> None:
    assert escape_inline("a\n b  [x](javascript:y) & #1 `z`") == "a b \\[x\\](javascript:y) \\& \\#1 \\`z\\`"


@pytest.mark.parametrize(
    ("title", "extension", "expected"),
    [
        ("Trip to Oslo!", "md", ("trip-to-oslo.md", "trip-to-oslo.md")),
        ("../../etc/passwd", "json", ("etc-passwd.json", "etc-passwd.json")),
        ('a "quoted"; name\r\nX-Evil: 1', "md", ("a-quoted-name-x-evil-1.md", "a-quoted-name-x-evil-1.md")),
        ("Café crème", "md", ("cafe-creme.md", "café-crème.md")),
        ("日本語のチャット", "md", ("chat.md", "日本語のチャット.md")),
        ("...", "md", ("chat.md", "chat.md")),
        ("", "json", ("chat.json", "chat.json")),
        ("CON", "md", ("chat-con.md", "chat-con.md")),
        ("snake_case__name", "md", ("snake-case-name.md", "snake-case-name.md")),
        ("x" * 300, "md", ("x" * 80 + ".md", "x" * 80 + ".md")),
    ],
)
def test_file_names_are_safe(title: str, extension: str, expected: tuple[str, str]) -> None:
    assert export_filename(title, extension) == expected
