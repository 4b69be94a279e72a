"""Function tools on /v1/chat/completions: the request's `tools`, `tool_choice` and `parallel_tool_calls`, checked
(400s naming the field), and what they make of a request: the tools the chat template renders, the names the
output parser accepts, and, for a forced call, the grammar the output must follow.

A forced call ("required", or a named function) is a Lark grammar over the template's tool-call markers with the
call's JSON embedded as an llguidance `%json` schema: `{"name": <one of the tools>, "arguments": <its parameters
schema>}`. Calls are written in the Hermes / Qwen2.5 format (app/openai/tool_calls.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from app.http.errors import bad_request
from app.openai.tool_calls import CLOSE, OPEN
from engine.core.structured import JSON_OPTIONS, StructuredOutput

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128
CHOICES = ("none", "auto", "required")
NO_TEMPLATE_SUPPORT = (
    "the model's chat template has no tool support (it does not render `tools`), so this server cannot offer "
    "tools to this model"
)
UNPARSED_FORMAT = (
    "the model's chat template renders tools, but its tool calls are not written as <tool_call>...</tool_call> "
    "(Hermes / Qwen2.5 style), the only format this server parses; tools are not offered to this model"
)


@dataclass(frozen=True)
class ToolPlan:
    """What a request's tools make of it: `render` goes to the chat template (None: no tools rendered), `names` are
    the callable tools (empty: no output parsing), `forced` constrains the output to calls, `single` allows at
    most one call, `strict` holds the parameters schema of each `strict: true` tool (a call to one whose arguments
    do not validate is not a call)."""

    render: list[dict[str, Any]] | None
    names: frozenset[str]
    forced: StructuredOutput | None
    single: bool
    strict: dict[str, dict[str, Any]] = field(default_factory=dict)


def tool_plan(body: dict[str, Any]) -> ToolPlan | None:
    """The request's tool plan, None when it has no tools; 400 for a malformed tools, tool_choice or
    parallel_tool_calls."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request(
            f"parallel_tool_calls must be true or false, got {json.dumps(parallel)[:80]}",
            "parallel_tool_calls",
        )
    if tools is None:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice needs tools: the request has none", "tool_choice")
        return None
    functions = _functions(tools)
    names = [f["name"] for f in functions]
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = _named_choice(choice)
        if name not in names:
            raise bad_request(
                f"tool_choice names the function {name!r}, which is not among the tools ({', '.join(names)})",
                "tool_choice",
            )
        chosen = [f for f in functions if f["name"] == name]
    elif choice in CHOICES:
        chosen = functions
    else:
        raise bad_request(
            f'tool_choice must be one of {", ".join(CHOICES)} or {{"type": "function", "function": '
            f'{{"name": ...}}}}, got {json.dumps(choice)[:80]}',
            "tool_choice",
        )
    if choice == "none":  # the model is not told about the tools, and nothing is parsed as a call
        return ToolPlan(None, frozenset(), None, False)
    single = parallel is False
    forced = None if choice == "auto" else _forced(chosen, single)
    strict = {f["name"]: f["parameters"] for f in chosen if f["strict"]}
    return ToolPlan(tools, frozenset(f["name"] for f in chosen), forced, single, strict)


def _functions(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list) or not tools:
        raise bad_request(
            "tools must be a non-empty list of {type: function, function: {...}} objects", "tools"
        )
    if len(tools) > MAX_TOOLS:
        raise bad_request(f"tools holds {len(tools)} tools, over the limit of {MAX_TOOLS}", "tools")
    functions, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise bad_request(f'{where}.type must be "function"', "tools")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function must be an object with a name", "tools")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise bad_request(
                f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {json.dumps(name)[:80]}",
                "tools",
            )
        if name in seen:
            raise bad_request(f"{where}.function.name {name!r} is given twice", "tools")
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"{where}.function.description must be a string", "tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise bad_request(
                f'{where}.function.parameters must be a JSON schema object with "type": "object"', "tools"
            )
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request(f"{where}.function.strict must be true or false", "tools")
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            raise bad_request(
                f"{where}.function.parameters is not a valid JSON schema: {exc.message}", "tools"
            ) from None
        functions.append({"name": name, "parameters": parameters, "where": where, "strict": strict is True})
    return functions


def _named_choice(choice: dict[str, Any]) -> str:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            'tool_choice as an object must be {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
    return name


def _forced(functions: list[dict[str, Any]], single: bool) -> StructuredOutput:
    """A grammar whose every derivation is one call (or several, newline-separated) to one of `functions`."""
    for f in functions:  # each schema alone first, so that a bad one is named
        try:
            StructuredOutput.json_schema(f["parameters"])
        except ValueError as exc:
            raise bad_request(f"{f['where']}.function.parameters: {exc}", "tools") from None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    repeat = "" if single else ' ("\\n" call)*'
    grammar = (
        f"start: call{repeat}\n"
        f"call: {json.dumps(OPEN + chr(10))} body {json.dumps(chr(10) + CLOSE)}\n"
        f"body: %json {json.dumps(schema)}\n"
    )
    try:
        return StructuredOutput("grammar", grammar)
    except ValueError as exc:
        raise bad_request(f"tools: the forced tool call does not compile: {exc}", "tools") from None
