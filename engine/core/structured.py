"""What a request's output must match (a JSON schema, any JSON object, a regex, a Lark grammar), as a plain value.

`StructuredOutput(kind, spec)` rides in SamplingParams. Construction compiles the spec to an llguidance grammar and
checks it, so a bad schema or pattern raises ValueError (naming what is wrong) where the request is built, before
it reaches the engine; the engine then builds a token matcher from `grammar` with its own tokenizer
(engine/worker/grammar.py). A forced tool call is a json_schema constraint over the tool's parameters.

JSON output has bounded whitespace: at most MAX_JSON_WHITESPACE characters between two tokens of the JSON text,
and none before or after it, so a model cannot spend its budget on a run of blank lines.

A repetition count above MAX_REPEAT_COUNT is refused up front: `a{100000}` in a regex, a Lark grammar or a schema's
`pattern` (a count's minimum: llguidance's token masks follow the forced run of a minimum count, so each costs time
in proportion to it, ~56 ms for a{100000} on a 49k vocabulary, on every token; `a{0,100000}` costs nothing), and
Lark's `item ~ n..m` (expanded into n..m items). Patterns that are costly some other way, e.g. nested counts, are
stopped by the engine's limits on mask time (engine/worker/mask_budget.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("json_object", "json_schema", "regex", "grammar")
MAX_JSON_WHITESPACE = 8  # characters of whitespace allowed between two JSON tokens
MAX_SPEC_CHARS = 64 * 1024  # a schema's JSON text, a regex or a grammar
MAX_REPEAT_COUNT = 2_000  # a{2000}: ~1-2 ms a mask on a 49k vocabulary, under the engine's 10 ms a mask
# a count `{n}`, `{n,}` or `{n,m}` whose brace is not escaped (an even number of backslashes before it): its minimum n
_REGEX_COUNT = re.compile(r"(?<!\\)(?:\\\\)*(\{\s*(\d+)\s*(?:,\s*\d*\s*)?\})")
_LARK_COUNT = re.compile(r"(~\s*(\d+)(?:\s*\.\.\s*(\d+))?)")  # Lark's `item ~ n` and `item ~ n..m`: both
JSON_OPTIONS = {"whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{0,{MAX_JSON_WHITESPACE}}}"}


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on a request's output: `kind` (one of KINDS) and `spec` (the schema's JSON text, the regex or
    the Lark grammar; empty for json_object). ValueError on construction when the spec does not compile."""

    kind: str
    spec: str = ""
    grammar: str = field(default="", init=False, compare=False, repr=False)  # llguidance's grammar text

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.spec, str):
            raise ValueError(f"structured output spec must be a string, got {type(self.spec).__name__}")
        if len(self.spec) > MAX_SPEC_CHARS:
            raise ValueError(
                f"the {self.kind} is {len(self.spec)} characters, over the limit of {MAX_SPEC_CHARS}"
            )
        if self.kind != "json_object" and not self.spec:
            raise ValueError(f"a {self.kind} constraint needs a non-empty spec")
        if self.kind == "regex":
            _check_counts("regex", self.spec, _REGEX_COUNT)
        elif self.kind == "grammar":
            _check_counts("Lark grammar", self.spec, _REGEX_COUNT)
            _check_counts("Lark grammar", self.spec, _LARK_COUNT)
        object.__setattr__(self, "grammar", _compile(self.kind, self.spec))

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> StructuredOutput:
        """A JSON-schema constraint from a schema object (e.g. a tool's parameters)."""
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, separators=(",", ":"), sort_keys=True))

    @property
    def is_json(self) -> bool:
        """The output is a JSON text (json_object or json_schema)."""
        return self.kind in ("json_object", "json_schema")


def _compile(kind: str, spec: str) -> str:
    """llguidance's grammar text for the constraint, checked (ValueError with the compiler's message)."""
    from llguidance import LLMatcher  # imported here: the core stays cheap to import for its other users

    if kind == "json_object":
        grammar = LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    elif kind == "json_schema":
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
        for pattern in _schema_patterns(schema):
            _check_counts("JSON schema's pattern", pattern, _REGEX_COUNT)
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    elif kind == "regex":
        grammar = LLMatcher.grammar_from_regex(spec)
    else:
        grammar = LLMatcher.grammar_from_lark(spec)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        what = {"json_schema": "JSON schema", "regex": "regex", "grammar": "Lark grammar"}.get(kind, kind)
        raise ValueError(f"invalid {what}: {messages[0].strip()}")
    return grammar


def _check_counts(what: str, text: str, counts: re.Pattern[str]) -> None:
    """ValueError naming the first repetition count in `text` above MAX_REPEAT_COUNT."""
    for match in counts.finditer(text):
        numbers = [int(n) for n in match.groups()[1:] if n]
        if max(numbers) > MAX_REPEAT_COUNT:
            raise ValueError(
                f"the {what} asks for {max(numbers)} repetitions ({match.group(1)!r}), over the limit of "
                f"{MAX_REPEAT_COUNT}: every token mask would cost time in proportion to them"
            )


def _schema_patterns(node: Any) -> list[str]:
    """Every regex of a JSON schema: `pattern` values and `patternProperties` keys, at any depth."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                found.append(value)
            elif key == "patternProperties" and isinstance(value, dict):
                found.extend(value)
            found.extend(_schema_patterns(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_schema_patterns(item))
    return found
