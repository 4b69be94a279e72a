"""The terminal chat's slash commands: answered here, never sent to the model."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from engine.cli_conversation import Conversation, Reply

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

HELP = """\
commands (answered here, never sent to the model):
  /help            this list
  /reset           start over: forget every turn, keep the system prompt
  /system TEXT     set the system prompt (it heads the whole conversation)
  /system          show it; /system clear removes it
  /save FILE       write the conversation: Markdown if FILE ends in .md, else JSON (overwrites FILE)
  /stats           the last reply (tokens, tokens/s, prefix-cache hits) and the KV block pool
  /exit, /quit     leave (so do Ctrl-D, and Ctrl-C at an empty prompt)
Ctrl-C stops a reply; what came so far stays in the conversation. Up-arrow recalls earlier lines.
A message that starts with "/" is sent when it begins with a space or "//" ("//etc" sends "/etc")."""


@dataclass(frozen=True)
class Command:
    """A typed slash command: its name (lowercase, with the slash) and the rest of the line."""

    name: str
    arg: str


def parse_line(line: str) -> Command | str | None:
    """A typed line: a Command when it starts with "/", else the message to send ("//x" sends "/x", a leading space
    keeps a "/" from being read as a command); None when there is nothing to send."""
    if line.startswith("/") and not line.startswith("//"):
        name, _, arg = line.partition(" ")
        return Command(name.lower(), arg.strip())
    text = (line[1:] if line.startswith("//") else line).strip()
    return text or None


@dataclass
class CommandContext:
    """What the commands read and change: the conversation, the engine (its pool and model) and the last reply."""

    conversation: Conversation
    engine: LLMEngine
    last_reply: Reply | None = None
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)


def run_command(command: Command, ctx: CommandContext) -> bool:
    """Carry out a command; False when the chat should end. A mistake (unknown name, missing or unwritable file)
    is one line on stderr, and the chat goes on."""
    name, arg = command.name, command.arg
    if name in ("/exit", "/quit"):
        return False
    if name == "/help":
        print(HELP, file=ctx.out)
    elif name == "/reset":
        ctx.conversation.reset()
        kept = " (the system prompt stays)" if ctx.conversation.system else ""
        print(f"conversation cleared{kept}", file=ctx.out)
    elif name == "/system":
        _system(arg, ctx)
    elif name == "/save":
        _save(arg, ctx)
    elif name == "/stats":
        _stats(ctx)
    else:
        print(f"unknown command {name}, try /help (to send it as a message: //{name[1:]})", file=ctx.err)
    return True


def _system(arg: str, ctx: CommandContext) -> None:
    conversation = ctx.conversation
    if not arg:
        print(
            f"system prompt: {conversation.system}" if conversation.system else "no system prompt",
            file=ctx.out,
        )
    elif arg == "clear":
        conversation.system = ""
        print("system prompt removed", file=ctx.out)
    else:
        conversation.system = arg
        print("system prompt set", file=ctx.out)


def _save(arg: str, ctx: CommandContext) -> None:
    if not arg:
        print("usage: /save FILE (Markdown if it ends in .md, else JSON)", file=ctx.err)
        return
    path = Path(arg).expanduser()
    try:
        written = ctx.conversation.save(path, ctx.engine.model_name)
    except OSError as exc:
        print(f"error: cannot write {path}: {exc.strerror or exc}", file=ctx.err)
        return
    num_messages = len(ctx.conversation.messages())
    print(f"saved {num_messages} messages to {path} ({written})", file=ctx.out)


def _stats(ctx: CommandContext) -> None:
    reply = ctx.last_reply
    if reply is None:
        print("last reply: none yet", file=ctx.out)
    else:
        ending = {"abort": ", stopped with Ctrl-C", "length": ", cut at the token limit"}
        how = ending.get(reply.finish_reason.value, "") if reply.finish_reason else ""
        first = f", first token after {reply.first_token_s:.3f} s" if reply.first_token_s is not None else ""
        print(f"last reply: {reply.summary()}{first}{how}", file=ctx.out)
    stats = ctx.engine.stats()
    print(
        f"KV pool: {stats.num_used_blocks} of {stats.num_blocks} blocks in use, {stats.num_cached_blocks} cached "
        f"(free, kept for prefix hits); {stats.block_size} tokens a block",
        file=ctx.out,
    )
