"""Sampling defaults: what a request gets for the fields it leaves out, layered request > server > model > built-in."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from engine.core.sequence import SamplingParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingDefaults:
    """Defaults one source sets (None: this source leaves the field to the next). Valid by construction: a value
    SamplingParams would refuse raises ValueError naming the field."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None

    def __post_init__(self) -> None:
        SamplingParams(**self.given())  # raises ValueError naming the first bad field

    def given(self) -> dict[str, Any]:
        """The fields this source sets."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def over(self, fallback: SamplingDefaults) -> SamplingDefaults:
        """These defaults, with `fallback`'s where these leave a field unset."""
        return dataclasses.replace(fallback, **self.given())


FIELDS = tuple(f.name for f in dataclasses.fields(SamplingDefaults))
# SamplingParams' own field defaults (OpenAI's): what a model without a generation config samples with
BUILTIN = SamplingDefaults(**{name: getattr(SamplingParams(), name) for name in FIELDS})


def effective_defaults(server: SamplingDefaults, model: SamplingDefaults) -> SamplingDefaults:
    """Every field set: the server's flags win over the model's generation config, which wins over the built-in."""
    return server.over(model.over(BUILTIN))


def default_sources(server: SamplingDefaults, model: SamplingDefaults) -> dict[str, str]:
    """Where each effective default comes from: "server" (a flag), "model" (its generation config) or "built-in"."""
    sources = {}
    for name in FIELDS:
        if getattr(server, name) is not None:
            sources[name] = "server"
        else:
            sources[name] = "model" if getattr(model, name) is not None else "built-in"
    return sources


def from_generation_config(generation_config: Any | None) -> SamplingDefaults:
    """The sampling fields a model's generation config sets (a transformers GenerationConfig, or None for a model
    without one). A value SamplingParams would refuse is left out with a warning: the model still serves."""
    if generation_config is None:
        return SamplingDefaults()
    values: dict[str, Any] = {}
    for name in FIELDS:
        value = getattr(generation_config, name, None)
        if value is None:
            continue
        try:
            SamplingDefaults(**{name: value})
        except ValueError as exc:
            logger.warning("ignoring %s=%r of the model's generation config: %s", name, value, exc)
            continue
        values[name] = value
    return SamplingDefaults(**values)
