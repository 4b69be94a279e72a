"""A chat as a file: JSON that holds everything the API shows (and, when asked, the token ids), Markdown for people.

Markdown: the title, the settings, the system prompt the chat started with, then each message under its role as a
heading with its text as written (the model's Markdown and code stay intact), and a system prompt changed after some
turns under "System prompt changed" where it took effect (before the first message made after the change). A message that leaves a block open (a reply stopped inside a code fence)
would swallow the headings after it, so its fence is closed; anything else left open (a raw HTML block) is shown as
a code block instead. markdown-it-py (CommonMark) decides what is open.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from markdown_it import MarkdownIt

from app.db import MessageRecord, PromptChange, SessionRecord
from app.http.messages import message_fields

EXPORT_VERSION = 1
MAX_FILENAME_CHARS = 80
ROLE_HEADINGS = {"system": "System", "user": "User", "assistant": "Assistant"}
# statuses worth a word under a reply (a finished one needs none)
STATUS_NOTES = {
    "stopped": "stopped",
    "failed": "failed",
    "interrupted": "interrupted",
    "streaming": "incomplete",
}
WINDOWS_RESERVED = {
    "con",
    "prn",
    "aux",
    "nul",
    *(f"com{i}" for i in range(1, 10)),
    *(f"lpt{i}" for i in range(1, 10)),
}

_COMMONMARK = MarkdownIt("commonmark")
_PROBE = "pagedchat-export-probe"
# inside a line, only these can start markup (`<` raw HTML, `&` an entity, `#` a heading's closing run)
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]<>!|~&#])")


def export_json(
    session: SessionRecord,
    messages: list[MessageRecord],
    *,
    exported_at: datetime,
    active_leaf_id: int | None = None,
    token_ids: bool = False,
    prompt_changes: Sequence[PromptChange] = (),
) -> dict[str, Any]:
    """The chat as a JSON object: every message of every branch (each names its `parent_id`), the leaf of the
    branch on show, and the system prompt's changes after turns (`system_prompt` is the current one); `token_ids`
    adds each message's token ids and tokenizer fingerprint."""
    return {
        "pagedchat_export": EXPORT_VERSION,
        "exported_at": exported_at.isoformat(),
        "session": {
            "id": session.id,
            "title": session.title,
            "system_prompt": session.system_prompt,
            "settings": session.settings,
            "preset_id": session.preset_id,  # what the chat leaves unset comes from it
            "created_at": session.created_at.isoformat(),
            "updated_at": session.updated_at.isoformat(),
        },
        "active_leaf_id": active_leaf_id,
        "messages": [_message_json(m, token_ids) for m in messages],
        "system_prompt_changes": [
            {"changed_at": c.changed_at.isoformat(), "previous": c.previous, "system_prompt": c.system_prompt}
            for c in prompt_changes
        ],
    }


def _message_json(m: MessageRecord, token_ids: bool) -> dict[str, Any]:
    fields = {
        **message_fields(m),
        "status": str(m.status),
        "position": m.position,
        "created_at": m.created_at.isoformat(),
        "updated_at": m.updated_at.isoformat(),
    }
    if token_ids:
        fields["token_ids"] = None if m.token_ids is None else list(m.token_ids)
        fields["tokenizer_fingerprint"] = m.tokenizer_fingerprint
    return fields


def export_markdown(
    session: SessionRecord,
    messages: list[MessageRecord],
    *,
    exported_at: datetime,
    preset_name: str | None = None,
    prompt_changes: Sequence[PromptChange] = (),
) -> str:
    """The chat as a Markdown document; `preset_name`: the preset the chat follows, if any; `prompt_changes`: the
    system prompt's changes after turns, each shown before the first message made after it."""
    lines = [
        f"# {escape_inline(session.title) or 'Untitled chat'}",
        "",
        f"_Exported from pagedchat on {_when(exported_at)} · started {_when(session.created_at)} · "
        f"{len(messages)} message{'' if len(messages) == 1 else 's'}_",
        "",
    ]
    if preset_name is not None:
        lines += [f"Preset: {escape_inline(preset_name)}", ""]
    if session.settings:
        lines += ["Settings:", ""]
        lines += [f"- {name}: {_inline_code(json.dumps(value))}" for name, value in session.settings.items()]
        lines.append("")
    first_prompt = prompt_changes[0].previous if prompt_changes else session.system_prompt
    if first_prompt:
        lines += ["## System", "", closed_markdown(first_prompt), ""]
    pending = list(prompt_changes)
    for m in messages:
        while pending and pending[0].changed_at <= m.created_at:
            lines += _change_lines(pending.pop(0))
        lines += [f"## {ROLE_HEADINGS.get(m.role, m.role)}", "", f"_{_message_note(m)}_", ""]
        if m.content:
            lines += [closed_markdown(m.content), ""]
        if m.error:
            lines += [f"> Error: {escape_inline(m.error)}", ""]
    for change in pending:  # after the last message shown
        lines += _change_lines(change)
    return "\n".join(lines)


def _change_lines(change: PromptChange) -> list[str]:
    lines = ["## System prompt changed", "", f"_{_when(change.changed_at)}_", ""]
    return lines + [closed_markdown(change.system_prompt) if change.system_prompt else "_(removed)_", ""]


def _message_note(m: MessageRecord) -> str:
    parts = [_when(m.created_at)]
    if m.role == "assistant":
        if m.completion_tokens is not None:
            parts.append(f"{m.completion_tokens} token{'' if m.completion_tokens == 1 else 's'}")
        if str(m.status) in STATUS_NOTES:
            parts.append(STATUS_NOTES[str(m.status)])
        if m.finish_reason == "length":
            parts.append("hit the token limit")
    return " · ".join(parts)


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def closed_markdown(text: str) -> str:
    """`text` made safe to be followed by a heading: a fence it leaves open is closed; anything else it leaves open
    (a raw HTML block) turns the whole text into a code block."""
    body = text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    if _nothing_open(body):
        return body
    fence = next((t for t in _COMMONMARK.parse(_probed(body)) if t.type == "fence" and t.level == 0), None)
    if fence is not None:
        closed = f"{body}\n{fence.markup}"
        if _nothing_open(closed):
            return closed
    return _code_block(body)


def _probed(body: str) -> str:
    return f"{body}\n\n# {_PROBE}\n"


def _nothing_open(body: str) -> bool:
    """Whether a heading after `body` (and a blank line) is a heading of the document, not inside `body`'s block."""
    probe_line = body.count("\n") + 2
    tokens = _COMMONMARK.parse(_probed(body))
    return any(t.type == "heading_open" and t.level == 0 and t.map and t.map[0] == probe_line for t in tokens)


def _code_block(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _inline_code(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def escape_inline(text: str) -> str:
    """One line of plain text as Markdown that shows it as is: whitespace runs become one space, punctuation that
    can start markup inside a line is backslash-escaped."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", " ".join(text.split()))


def export_filename(title: str, extension: str) -> tuple[str, str]:
    """(ASCII name, Unicode name) of an exported file: the title's letters and digits joined by dashes, no path,
    no leading dot, no reserved device name; "chat" when nothing is left."""
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return _safe_stem(ascii_title) + "." + extension, _safe_stem(title) + "." + extension


def _safe_stem(title: str) -> str:
    stem = re.sub(r"[^\w]+|_+", "-", unicodedata.normalize("NFC", title)).strip("-").lower()
    stem = stem[:MAX_FILENAME_CHARS].rstrip("-") or "chat"
    return f"chat-{stem}" if stem in WINDOWS_RESERVED else stem
