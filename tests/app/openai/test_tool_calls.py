"""The incremental tool-call parser: the same result however the text is split, malformed calls kept as content."""

from __future__ import annotations

import json

import pytest

from app.openai.tool_calls import ToolCall, ToolCallParser

NAMES = frozenset({"get_weather", "add"})
ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = ONE + '\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}\n</tool_call>'


def parse(pieces: list[str]) -> tuple[str, list[tuple[str, dict]]]:
    """Content and (name, arguments) of the calls, checking that content never follows a call it preceded."""
    parser = ToolCallParser(NAMES)
    items: list[str | ToolCall] = []
    for piece in pieces:
        items += parser.feed(piece).items
    items += parser.finish().items
    content = "".join(i for i in items if isinstance(i, str))
    calls = [(i.name, json.loads(i.arguments)) for i in items if isinstance(i, ToolCall)]
    assert all(i.id.startswith("call_") for i in items if isinstance(i, ToolCall))
    return content, calls


def splits(text: str) -> list[list[str]]:
    """The text whole, in single characters, and cut in two at every boundary."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


CASES = [
    ("Hello there.", ("Hello there.", [])),
    (ONE, ("", [("get_weather", {"city": "Paris"})])),
    (TWO, ("", [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2})])),
    ("Let me check.\n" + ONE, ("Let me check.", [("get_weather", {"city": "Paris"})])),
    # malformed JSON inside a call: the whole call text comes back as content, nothing lost
    ("<tool_call>\n{not json}\n</tool_call>", ("<tool_call>\n{not json}\n</tool_call>", [])),
    # an unknown tool name or arguments that are not an object: content too
    (
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', []),
    ),
    (
        '<tool_call>{"name": "add", "arguments": 3}</tool_call>',
        ('<tool_call>{"name": "add", "arguments": 3}</tool_call>', []),
    ),
    # a call cut by max_tokens: its text is content
    ('<tool_call>\n{"name": "add", "argu', ('<tool_call>\n{"name": "add", "argu', [])),
    # an output stopped at </tool_call> (excluded as a stop string): the open call parses, so it is a call
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n', ("", [("add", {"a": 1})])),
    # Llama 3's key for the arguments is read as them; a call without either takes none
    ('<tool_call>{"name": "add", "parameters": {"a": 2}}</tool_call>', ("", [("add", {"a": 2})])),
    ('<tool_call>{"name": "get_weather"}</tool_call>', ("", [("get_weather", {})])),
    ("a <tool_ b", ("a <tool_ b", [])),
    ("ends with <tool_c", ("ends with <tool_c", [])),
    ("  \n", ("  \n", [])),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_every_split_gives_the_same_result(text, expected):
    for pieces in splits(text):
        assert parse(pieces) == expected, pieces


def test_content_after_a_call_keeps_its_order():
    parser = ToolCallParser(NAMES)
    items = parser.feed(ONE + " and more").items + parser.finish().items
    assert isinstance(items[0], ToolCall) and items[1:] == [" and more"]


def test_a_strict_tools_call_counts_only_when_its_arguments_validate():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    good = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    bad = '<tool_call>{"name": "add", "arguments": {"a": "one"}}</tool_call>'
    for text, is_call in [(good, True), (bad, False)]:
        parser = ToolCallParser(NAMES, {"add": schema})
        items = parser.feed(text).items + parser.finish().items
        assert [isinstance(i, ToolCall) for i in items] == [is_call], items
        if not is_call:
            assert "".join(items) == bad  # kept whole as content, nothing lost
