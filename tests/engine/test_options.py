"""Flags, PAGEDCHAT_* variables and help derived from a config dataclass's fields (engine/core/options.py)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from engine.core.config import EngineConfig
from engine.core.options import (
    GROUPS,
    add_options,
    check_choices,
    given_options,
    option,
    options,
    parse_env,
    parse_size,
    size_text,
    to_env,
)


@dataclass(frozen=True)
class ToyConfig:
    """Every kind of option once."""

    name: str = option("toy", "what it is called", group="model")
    size: int = option(16, "how big", choices=(8, 16), group="engine")
    ratio: float = option(0.5, "a fraction", group="advanced")
    limit: int | None = option(None, "unset: no limit", group="limits")
    fast: bool = option(True, "go fast", flag="--speed", group="engine")
    tags: tuple[str, ...] = option((), "labels", flag="--tag", group="server")
    budget: int | None = option(None, "bytes to spend", unit="bytes", group="cache")
    frame: int = option(256 * 1024, "largest frame", unit="bytes", group="limits")
    hidden: str = ""

    def __post_init__(self) -> None:
        check_choices(self)


def test_options_know_kind_optionality_flag_and_variable():
    found = {opt.name: opt for opt in options(ToyConfig)}
    assert [(o.kind, o.optional) for o in found.values()] == [
        (str, False),
        (int, False),
        (float, False),
        (int, True),
        (bool, False),
        (tuple, False),
        (int, True),
        (int, False),
        (str, False),
    ]
    assert (found["limit"].flag, found["limit"].env_var) == ("--limit", "PAGEDCHAT_LIMIT")
    assert (found["fast"].flag, found["tags"].flag) == ("--speed", "--tag")


def test_environment_strings_become_typed_values():
    env = {
        "PAGEDCHAT_SIZE": "8",
        "PAGEDCHAT_RATIO": " 0.25 ",
        "PAGEDCHAT_LIMIT": "auto",
        "PAGEDCHAT_FAST": "off",
        "PAGEDCHAT_TAGS": "a, b,,c",
        "PAGEDCHAT_OTHER": "ignored",
    }
    assert parse_env(ToyConfig, env) == {
        "size": 8,
        "ratio": 0.25,
        "limit": None,
        "fast": False,
        "tags": ("a", "b", "c"),
    }
    assert parse_env(ToyConfig, {"PAGEDCHAT_LIMIT": "2e3", "PAGEDCHAT_FAST": "YES"}) == {
        "limit": 2000,
        "fast": True,
    }


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PAGEDCHAT_SIZE": "sixteen"}, "PAGEDCHAT_SIZE must be an integer, got 'sixteen'"),
        ({"PAGEDCHAT_RATIO": "half"}, "PAGEDCHAT_RATIO must be a number, got 'half'"),
        (
            {"PAGEDCHAT_FAST": "maybe"},
            "PAGEDCHAT_FAST must be true or false (1/0, yes/no, on/off), got 'maybe'",
        ),
    ],
)
def test_bad_environment_strings_name_the_variable(env, message):
    with pytest.raises(ValueError) as error:
        parse_env(ToyConfig, env)
    assert str(error.value) == message


def test_to_env_round_trips_and_leaves_none_unset():
    config = ToyConfig(name="x", size=8, ratio=0.1, limit=None, fast=False, tags=("a", "b"))
    env = to_env(config)
    assert "PAGEDCHAT_LIMIT" not in env and env["PAGEDCHAT_FAST"] == "0" and env["PAGEDCHAT_TAGS"] == "a,b"
    assert ToyConfig(**parse_env(ToyConfig, env)) == config


def test_choices_are_checked_with_the_field_name():
    with pytest.raises(ValueError, match=r"^size must be one of 8, 16, got 12$"):
        ToyConfig(size=12)


def test_flags_with_field_defaults():
    parser = argparse.ArgumentParser()
    add_options(parser, ToyConfig)
    assert ToyConfig(**given_options(parser.parse_args([]), ToyConfig)) == ToyConfig()
    args = parser.parse_args(["--no-speed", "--tag", "a", "--tag", "b", "--limit", "3", "--size", "8"])
    assert given_options(args, ToyConfig) == {
        "name": "toy",
        "size": 8,
        "ratio": 0.5,
        "limit": 3,
        "fast": False,
        "tags": ("a", "b"),
        "frame": 256 * 1024,
        "hidden": "",
    }
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "12"])


def test_flags_without_defaults_give_only_what_was_typed():
    parser = argparse.ArgumentParser()
    add_options(parser, ToyConfig, defaults=False, show_env=True)
    assert given_options(parser.parse_args([]), ToyConfig) == {}
    assert given_options(parser.parse_args(["--speed", "--ratio", "1"]), ToyConfig) == {
        "fast": True,
        "ratio": 1.0,
    }
    text = parser.format_help()
    assert "how big (default: 16; PAGEDCHAT_SIZE)" in text
    assert "labels (repeatable; PAGEDCHAT_TAGS, comma-separated)" in text
    assert "advanced:" in text and "--hidden" not in text


def test_help_groups_follow_groups_order_whatever_the_field_order():
    parser = argparse.ArgumentParser()
    add_options(parser, ToyConfig)
    groups = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups if g._group_actions}
    assert groups == {
        "options": ["help", "hidden"],  # a plain field: no group, no help (suppressed)
        "server": ["tags"],
        "model": ["name"],
        "engine": ["size", "fast"],
        "cache": ["budget"],
        "limits": ["limit", "frame"],
        "advanced": ["ratio"],
    }
    assert list(groups)[1:] == [g for g in GROUPS if g in groups]
    assert parser.format_help().index("--tag TAG") < parser.format_help().index("--name NAME")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"help": "", "group": "model"}, "an option needs help text: what it does, and its unit"),
        (
            {"help": "what it does", "group": "tuning"},
            "option group 'tuning' is not one of server, accounts, ",
        ),
    ],
)
def test_an_option_without_help_or_a_known_group_is_refused(kwargs, message):
    with pytest.raises(RuntimeError) as error:
        option(0, **kwargs)
    assert str(error.value).startswith(message)


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("512MiB", 512 * 2**20),
        ("4GiB", 4 * 2**30),
        ("90MB", 90_000_000),
        ("1.5 GiB", 3 * 2**29),
        ("64kib", 65_536),
        ("12kB", 12_000),
        ("100B", 100),
        (" 123456 ", 123_456),
        ("1e9", 1_000_000_000),
        ("0", 0),
    ],
)
def test_sizes_take_a_unit_or_are_plain_integers(raw, value):
    assert parse_size(raw) == value


@pytest.mark.parametrize("raw", ["90 MiBs", "4G", "1e3kB", "MiB", "-1MiB", "lots"])
def test_a_bad_size_is_refused_by_the_flag_and_the_variable_with_the_forms(raw, capsys):
    forms = "an integer or a number with a unit (512MiB, 4GiB, 90MB; B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    with pytest.raises(ValueError) as error:
        parse_env(ToyConfig, {"PAGEDCHAT_BUDGET": raw})
    assert str(error.value) == f"PAGEDCHAT_BUDGET must be a size in bytes: {forms}, got {raw!r}"
    parser = argparse.ArgumentParser()
    add_options(parser, ToyConfig)
    with pytest.raises(SystemExit):
        parser.parse_args([f"--budget={raw}"])
    assert f"argument --budget: must be a size in bytes: {forms}, got {raw!r}" in capsys.readouterr().err


def test_size_flags_and_variables_take_units_and_help_says_so():
    parser = argparse.ArgumentParser()
    add_options(parser, ToyConfig)
    args = parser.parse_args(["--budget", "90MiB", "--frame", "1024"])
    assert (args.budget, args.frame) == (90 * 2**20, 1024)
    assert parse_env(ToyConfig, {"PAGEDCHAT_BUDGET": "4GiB", "PAGEDCHAT_FRAME": "2KiB"}) == {
        "budget": 4 * 2**30,
        "frame": 2048,
    }
    assert ToyConfig(**parse_env(ToyConfig, to_env(ToyConfig(budget=5 * 2**20)))).budget == 5 * 2**20
    text = " ".join(parser.format_help().split())
    assert "bytes to spend (a size: 512MiB, 4GiB, 90MB or bytes)" in text
    assert "largest frame (a size: 512MiB, 4GiB, 90MB or bytes; default: 256KiB)" in text
    assert [size_text(n) for n in (2**31, 3 * 2**20, 1000, 0)] == ["2GiB", "3MiB", "1000", "0"]


def test_every_byte_count_of_the_engine_takes_units():
    assert {o.name for o in options(EngineConfig) if o.is_size} == {"kv_cache_bytes", "kv_disk_bytes"}
    config = EngineConfig(**parse_env(EngineConfig, {"PAGEDCHAT_KV_CACHE_BYTES": "90MiB"}))
    assert config.kv_cache_bytes == 90 * 2**20
