"""Settings declared once, as dataclass fields with their help beside them; flags and env variables follow from them.

`option()` puts a field's help text and `--help` group (and choices, flag spelling) in its metadata. From config
classes `add_options` derives the argparse flags (`--field-name`; bools as `--x/--no-x`; tuples as a repeatable flag)
in the groups of GROUPS, `parse_env` reads `PAGEDCHAT_FIELD_NAME` variables into the field types, and `to_env` writes
a config back out. An int option declared with `unit="bytes"` takes a size with a unit as well (`512MiB`, `4GiB`,
`90MB`) in both.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "PAGEDCHAT_"
_SCALARS = (bool, int, float, str, tuple)
_KIND_NAMES = {bool: "true or false (1/0, yes/no, on/off)", int: "an integer", float: "a number"}
_SIZE_FORMS = "a size in bytes: an integer or a number with a unit (512MiB, 4GiB, 90MB; B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
# units by their lower-case spelling: decimal (kB, MB...) as `human_bytes` prints them, binary (KiB, MiB...) as --help
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# the `--help` groups, in the order they are shown, each with the line under its title; every option names one
GROUPS = {
    "server": "where the service listens, which hosts and origins it answers, where it keeps its files",
    "accounts": "who may use the service: accounts, API keys, the admin surface",
    "model": "what is served, and what a request that leaves sampling out gets",
    "engine": "how the engine runs: device, batch, threads, replicas",
    "cache": "the KV cache: its budget and dtype, prefix sharing, the disk tier",
    "limits": "what one request, client or owner may take; 0 turns a limit off where its help says so",
    "speculative": "speculative decoding: tokens proposed from the conversation's own text, verified several to a "
    "weight pass, with the same output",
    "advanced": "engine internals and timings: kernels, block size, structured-output budgets, store timing "
    "(the defaults suit most deployments)",
}


def option(
    default: Any,
    help: str,
    *,
    group: str,
    choices: tuple[Any, ...] | None = None,
    flag: str | None = None,
    unit: str | None = None,
) -> Any:
    """A dataclass field whose metadata holds its help, `--help` group (one of GROUPS), choices, flag (default
    `--field-name`) and unit ("bytes": an int option that also takes `512MiB`, `4GiB`, `90MB`); RuntimeError on empty
    help or an unknown group."""
    if not help:
        raise RuntimeError("an option needs help text: what it does, and its unit")
    if group not in GROUPS:
        raise RuntimeError(f"option group {group!r} is not one of {', '.join(GROUPS)}")
    metadata = {"help": help, "choices": choices, "group": group, "flag": flag, "unit": unit}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Option:
    """One settable field of a config class: its name, value type and declaration."""

    name: str
    kind: type  # bool, int, float, str or tuple (of str)
    optional: bool  # None allowed ("unset": the consumer's own default)
    field: dataclasses.Field

    @property
    def env_var(self) -> str:
        """PAGEDCHAT_ and the field name in capitals."""
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        """The command-line flag: declared, else `--field-name`."""
        return self.field.metadata.get("flag") or "--" + self.name.replace("_", "-")

    @property
    def help(self) -> str:
        """What the option does; empty: left out of `--help`."""
        return self.field.metadata.get("help", "")

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The values allowed, where the field declares them."""
        return self.field.metadata.get("choices")

    @property
    def is_size(self) -> bool:
        """A byte count that takes a unit: declared `unit="bytes"`."""
        return self.field.metadata.get("unit") == "bytes"

    @property
    def group(self) -> str | None:
        """The `--help` group (one of GROUPS); None for a plain field, which `--help` leaves out."""
        return self.field.metadata.get("group")


@functools.cache
def options(cls: type) -> tuple[Option, ...]:
    """The fields of dataclass `cls` with a plain value type (nested configs are not options), in order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
        if optional:
            hint = next(a for a in args if a is not type(None))
        kind = typing.get_origin(hint) or hint
        if kind in _SCALARS:
            found.append(Option(f.name, kind, optional, f))
    return tuple(found)


def check_choices(config: Any) -> None:
    """ValueError naming the field when a value is not among its declared choices."""
    for opt in options(type(config)):
        value = getattr(config, opt.name)
        if opt.choices is not None and value not in opt.choices:
            allowed = ", ".join(map(str, opt.choices))
            raise ValueError(f"{opt.name} must be one of {allowed}, got {value!r}")


def parse_value(opt: Option, raw: str, var: str | None = None) -> Any:
    """One environment string in the option's type; the ValueError names the variable (default: its own)."""
    raw = raw.strip()
    try:
        if opt.optional and raw.lower() in ("", "none", "auto"):
            return None
        if opt.kind is tuple:
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if opt.kind is bool:
            if raw.lower() in _TRUE + _FALSE:
                return raw.lower() in _TRUE
            raise ValueError(raw)
        if opt.is_size:
            return parse_size(raw)
        if opt.kind is int:
            return int(float(raw)) if "e" in raw.lower() else int(raw)
        return opt.kind(raw)
    except ValueError:
        raise ValueError(f"{var or opt.env_var} must be {_kind_name(opt)}, got {raw!r}") from None


def parse_size(raw: str) -> int:
    """Bytes from an integer (`1e9` too, as any int option takes) or a number with a unit: `512MiB`, `4GiB`,
    `90MB`, `1.5 GB` (units in any case); ValueError otherwise."""
    raw = raw.strip()
    if (found := _SIZE.fullmatch(raw.lower())) is None or found[2] not in _SIZE_UNITS:
        return int(float(raw)) if "e" in raw.lower() else int(raw)
    return int(float(found[1]) * _SIZE_UNITS[found[2]])


def size_text(num_bytes: int) -> str:
    """A byte count as `parse_size` reads it, in the largest binary unit it is a whole number of: 2GiB, 256KiB, 1000."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes and num_bytes % scale == 0:
            return f"{num_bytes // scale}{unit}"
    return str(num_bytes)


def _kind_name(opt: Option) -> str:
    """What a value of the option must be, for an error."""
    return _SIZE_FORMS if opt.is_size else _KIND_NAMES.get(opt.kind, opt.kind.__name__)


def _size_argument(raw: str) -> int:
    """argparse's `type` for a byte-size flag: argparse puts the flag before the message."""
    try:
        return parse_size(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {_SIZE_FORMS}, got {raw!r}") from None


def parse_env(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """The values of `cls`'s options that `env` sets (PAGEDCHAT_FIELD_NAME), parsed into their types."""
    return {opt.name: parse_value(opt, env[opt.env_var]) for opt in options(cls) if opt.env_var in env}


def to_env(config: Any) -> dict[str, str]:
    """PAGEDCHAT_* variables that `parse_env` reads back as `config`'s values (None: left unset)."""
    env = {}
    for opt in options(type(config)):
        value = getattr(config, opt.name)
        if value is None:
            continue
        if isinstance(value, bool):
            env[opt.env_var] = "1" if value else "0"
        elif isinstance(value, tuple):
            env[opt.env_var] = ",".join(value)
        else:
            env[opt.env_var] = str(value)
    return env


def add_options(
    parser: argparse.ArgumentParser, *classes: type, defaults: bool = True, show_env: bool = False
) -> None:
    """One flag per option of `classes`, in the argument groups of GROUPS, added in that order (so that the usage
    line follows it too); within a group, in the order of `classes` and their fields.

    defaults=False: every flag defaults to None, so that only flags actually given override another source.
    show_env: the help names each option's PAGEDCHAT_* variable.
    """
    order = {name: rank for rank, name in enumerate(GROUPS)}
    found = sorted((opt for cls in classes for opt in options(cls)), key=lambda opt: order.get(opt.group, -1))
    used = {opt.group for opt in found}
    groups = {name: parser.add_argument_group(name, text) for name, text in GROUPS.items() if name in used}
    for opt in found:
        kwargs: dict[str, Any] = {"dest": opt.name, "help": _help_text(opt, show_env)}
        default = opt.field.default if defaults else None
        if opt.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif opt.kind is tuple:
            kwargs["action"] = "append"
            default = list(default) if default else None
        else:
            kwargs["type"] = _size_argument if opt.is_size else opt.kind
            kwargs["choices"] = opt.choices
        if opt.kind is not bool and opt.choices is None:
            # named after the flag: `--api-key API_KEY`, not `API_KEYS`
            kwargs["metavar"] = opt.flag.lstrip("-").upper().replace("-", "_")
        target = parser if opt.group is None else groups[opt.group]  # a plain field: hidden (no help)
        target.add_argument(opt.flag, default=default, **kwargs)


def given_options(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values `args` holds for `cls`'s options, leaving out None (not given); repeated flags as tuples."""
    values = {}
    for opt in options(cls):
        value = getattr(args, opt.name, None)
        if value is not None:
            values[opt.name] = tuple(value) if opt.kind is tuple else value
    return values


SIZE_EXAMPLES = (
    "512MiB",
    "4GiB",
    "90MB",
)  # the forms a size option's help shows (--help and the docs' reference)


def shown_default(opt: Option) -> str | None:
    """A single-valued option's default as `--help` and the docs' reference show it: on/off, a size with its unit,
    the value; None when it is unset (None or empty). A repeatable option's tuple is its callers' to show."""
    default = opt.field.default
    if default is None or default == "":
        return None
    if opt.kind is bool:
        return "on" if default else "off"
    return size_text(default) if opt.is_size else str(default)


def _help_text(opt: Option, show_env: bool) -> str:
    if not opt.help:
        return argparse.SUPPRESS
    notes = []
    if opt.is_size:
        notes.append(f"a size: {', '.join(SIZE_EXAMPLES)} or bytes")
    if opt.kind is tuple:
        notes.append("repeatable")
    elif (default := shown_default(opt)) is not None:
        notes.append(f"default: {default}")
    if show_env:
        notes.append(opt.env_var + (", comma-separated" if opt.kind is tuple else ""))
    text = opt.help + (f" ({'; '.join(notes)})" if notes else "")
    return text.replace("%", "%%")
