"""Reading a request's output constraint: OpenAI's `response_format`, or vLLM's `guided_json` / `guided_regex` /
`guided_grammar` extra fields, as the engine's StructuredOutput (or None: free text).

The spec is compiled here (StructuredOutput's construction), so a bad schema, regex or grammar is a 400 naming
the field before the request is queued.
"""

from __future__ import annotations

import json
from typing import Any

from app.http.errors import bad_request
from engine.core.structured import StructuredOutput

FORMAT_TYPES = ("text", "json_object", "json_schema")
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar")


def structured_output(body: dict[str, Any]) -> StructuredOutput | None:
    """The constraint the request asks for; 400 for a malformed one, or for more than one."""
    given = [name for name in ("response_format", *GUIDED_FIELDS) if body.get(name) is not None]
    if len(given) > 1:
        raise bad_request(
            f"only one of response_format, {', '.join(GUIDED_FIELDS)} may constrain the output; got "
            f"{', '.join(given)}",
            given[1],
        )
    if not given:
        return None
    name = given[0]
    value = body[name]
    try:
        if name == "response_format":
            return _response_format(value)
        if name == "guided_json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise ValueError(f"guided_json must be a JSON schema object, got {json.dumps(value)[:80]}")
            return StructuredOutput.json_schema(schema)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {json.dumps(value)[:80]}")
        return StructuredOutput("regex" if name == "guided_regex" else "grammar", value)
    except json.JSONDecodeError as exc:
        raise bad_request(f"{name} is not valid JSON: {exc}", name) from None
    except ValueError as exc:
        message = str(exc)
        raise bad_request(message if message.startswith(name) else f"{name}: {message}", name) from None


def _response_format(value: Any) -> StructuredOutput | None:
    if not isinstance(value, dict):
        raise ValueError(f"response_format must be an object, got {json.dumps(value)[:80]}")
    kind = value.get("type")
    if kind not in FORMAT_TYPES:
        raise ValueError(
            f"response_format.type must be one of {', '.join(FORMAT_TYPES)}, got {json.dumps(kind)[:80]}"
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema must be an object with a `schema` (and a `name`)")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise ValueError(
            f"response_format.json_schema.schema must be a JSON schema object, got {json.dumps(schema)[:80]}"
        )
    return StructuredOutput.json_schema(schema)
