"""Tool calls out of generated text: the Hermes / Qwen2.5 format, `<tool_call>\\n{"name": ..., "arguments": {...}}
\\n</tool_call>`, one or several, parsed incrementally as the text streams.

Text before, between and after calls is content and streams as it comes, except a tail that could be the start of
`<tool_call>` (held until it is told apart) and whitespace-only runs (held: the newlines between calls are not
content). Text inside a call is held until `</tool_call>` closes it. A call whose body is not a JSON object with a
`name` among the request's tools and an object `arguments` is not lost: its whole text, markers included, is
released as content. At the end of the output, a call left open is a call if its body parses (the output stopped
at `</tool_call>`, as with parallel_tool_calls false) and content otherwise (cut by max_tokens).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonschema

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str


@dataclass
class Parsed:
    """What one piece of text released, in order: content texts and completed calls."""

    items: list[str | ToolCall] = field(default_factory=list)

    @property
    def content(self) -> str:
        return "".join(i for i in self.items if isinstance(i, str))

    @property
    def calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return "call_" + uuid.uuid4().hex[:24]


def _partial_marker(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of OPEN."""
    for size in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


class ToolCallParser:
    """Feed it the text deltas of one sample; `finish()` at the end. `names` are the callable tools; `strict` the
    parameters schemas of the strict ones, whose calls count only when their arguments validate."""

    def __init__(self, names: frozenset[str], strict: dict[str, dict[str, Any]] | None = None) -> None:
        self.names = names
        self.strict = strict or {}
        self.num_calls = 0
        self._buf = ""  # text not released yet
        self._inside = False  # after an OPEN not closed yet
        self._space = ""  # released whitespace held back until content follows it

    def feed(self, text: str) -> Parsed:
        self._buf += text
        out = Parsed()
        while True:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = _partial_marker(self._buf)
                    self._content(out, self._buf[: len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep :]
                    return out
                self._content(out, self._buf[:at])
                self._buf = self._buf[at + len(OPEN) :]
                self._inside = True
            else:
                at = self._buf.find(CLOSE)
                if at < 0:
                    return out
                body = self._buf[:at]
                self._buf = self._buf[at + len(CLOSE) :]
                self._inside = False
                self._close(out, body, OPEN + body + CLOSE)

    def finish(self) -> Parsed:
        """The end of the output: releases whatever was held."""
        out = Parsed()
        if self._inside:
            self._inside = False
            self._close(out, self._buf, OPEN + self._buf)
        else:
            self._content(out, self._buf)
        self._buf = ""
        if self._space and not self.num_calls:
            out.items.append(self._space)
        self._space = ""
        return out

    def _close(self, out: Parsed, body: str, raw: str) -> None:
        call = self._call(body)
        if call is None:
            self._content(out, raw)
        else:
            self.num_calls += 1
            out.items.append(call)
            self._space = ""  # whitespace before a call is layout, not content

    def _content(self, out: Parsed, text: str) -> None:
        if not text:
            return
        if text.isspace():
            self._space += text
            return
        stripped = text.rstrip()
        out.items.append(self._space + stripped)
        self._space = text[len(stripped) :]

    def _call(self, body: str) -> ToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        # `parameters` is Llama 3's key for the arguments; a call without either takes none
        name, arguments = value.get("name"), value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if name not in self.names or not isinstance(arguments, dict):
            return None
        if name in self.strict and not jsonschema.validators.validator_for(self.strict[name])(
            self.strict[name]
        ).is_valid(arguments):
            return None
        return ToolCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))
