"""`pagedchat chat`: a terminal chat with the engine in this process.

Ctrl-C during a reply stops it between two engine steps (the request is aborted, its blocks go back to the pool) and
keeps what came so far in the conversation; slash commands are answered here (engine/cli_commands.py). The
conversation goes to stdout; the banner, per-reply figures, errors and logs to stderr.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO

from engine.cli_commands import Command, CommandContext, parse_line, run_command
from engine.cli_conversation import Conversation, Reply, Turn
from engine.core.sequence import FinishReason, SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

PROMPT = "you> "
BANNER = "pagedchat — type a message; /help lists the commands; Ctrl-C stops a reply; Ctrl-D quits."
# a Ctrl-C at the prompt this soon after one stopped a reply is the same impatient double press: it does not quit
STOP_GRACE_S = 1.0
HISTORY_LENGTH = 1000


class ReplyInterrupt:
    """While a reply streams, Ctrl-C (SIGINT) asks it to stop instead of raising: the loop aborts the request between
    two steps (a KeyboardInterrupt inside the model would leave a step half done). A second Ctrl-C before the
    reply has stopped raises KeyboardInterrupt, for a step that does not end."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = signal.default_int_handler

    def __enter__(self) -> ReplyInterrupt:
        self.requested = False
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


class LineReader:
    """input() with GNU readline's line editing and history (up-arrow; kept across chats in `history_path`) when
    stdin is a terminal; plain input() from a pipe."""

    def __init__(self, history_path: Path | None) -> None:
        self.history_path = history_path
        self.readline: Any = None
        if sys.stdin.isatty():
            try:
                import readline
            except ImportError:  # Windows' Python has none: lines still work, without editing keys or history
                readline = None
            self.readline = readline
        if self.readline is not None and history_path is not None:
            self.readline.set_history_length(HISTORY_LENGTH)
            try:
                self.readline.read_history_file(history_path)
            except FileNotFoundError:  # the first chat
                pass
            except OSError as exc:
                logger.warning("chat history %s not read: %s", history_path, exc)

    def read(self, prompt: str) -> str:
        """The next line; EOFError at Ctrl-D, KeyboardInterrupt at Ctrl-C."""
        return input(prompt)

    def pending_text(self) -> str:
        """What was typed on the line a Ctrl-C interrupted ('' without readline)."""
        return self.readline.get_line_buffer() if self.readline is not None else ""

    def close(self) -> None:
        """Keep the history for the next chat."""
        if self.readline is None or self.history_path is None:
            return
        try:
            self.history_path.parent.mkdir(parents=True, exist_ok=True)
            self.readline.write_history_file(self.history_path)
        except OSError as exc:
            logger.warning("chat history not written to %s: %s", self.history_path, exc)


def stream_reply(
    engine: LLMEngine,
    request_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    interrupt: ReplyInterrupt,
    out: TextIO,
) -> Reply:
    """Run one request to its end, writing its text to `out` as it comes; once `interrupt` is requested, abort it
    before the next step. ValueError when the engine refuses the request."""
    engine.add_request(request_id, prompt_ids, params)
    pieces: list[str] = []
    last = None
    aborted = False
    while engine.has_unfinished_requests():
        if interrupt.requested and not aborted:
            engine.abort_request(request_id)  # its blocks are free now; the next step gives its final output
            aborted = True
        for output in engine.step():
            last = output
            for sample in output.outputs:
                if sample.text_delta:
                    pieces.append(sample.text_delta)
                    out.write(sample.text_delta)
                    out.flush()
    assert last is not None and last.finished, f"request {request_id} left the engine without a final output"
    sample = last.outputs[0] if last.outputs else None  # none when it was stopped before its first token
    if sample is not None:
        reason = sample.finish_reason
    else:
        reason = FinishReason.ERROR if last.error else FinishReason.ABORT
    metrics = last.metrics
    first_token_s = None
    if metrics.arrival_time is not None and metrics.first_token_time is not None:
        first_token_s = metrics.first_token_time - metrics.arrival_time
    return Reply(
        text="".join(pieces),
        num_prompt_tokens=len(prompt_ids),
        num_cached_tokens=last.num_cached_tokens,
        num_tokens=len(sample.token_ids) if sample is not None else 0,
        finish_reason=reason,
        error=last.error,
        first_token_s=first_token_s,
        decode_s=metrics.decode_time,
    )


def send_message(text: str, ctx: CommandContext, params: SamplingParams, request_id: str) -> Reply | None:
    """Add the user's message, stream the reply and keep it (a stopped one too, marked); None when nothing ran."""
    conversation, engine = ctx.conversation, ctx.engine
    conversation.turns.append(Turn("user", text))
    try:
        prompt_ids = engine.apply_chat_template(conversation.messages())
    except Exception as exc:  # the template's own refusal (e.g. a model without a system role): its words
        conversation.turns.pop()
        print(f"error: the chat template refused the conversation: {type(exc).__name__}: {exc}", file=ctx.err)
        return None
    max_len = engine.config.max_model_len
    room = max_len - len(prompt_ids)
    if room < 1:
        conversation.turns.pop()
        print(
            f"error: the conversation is {len(prompt_ids)} tokens and the context holds {max_len} (max_model_len): "
            f"/save FILE keeps it, /reset starts over",
            file=ctx.err,
        )
        return None
    turn_params = params if params.max_tokens <= room else dataclasses.replace(params, max_tokens=room)
    print("assistant> ", end="", file=ctx.out, flush=True)
    try:
        with ReplyInterrupt() as interrupt:
            reply = stream_reply(engine, request_id, prompt_ids, turn_params, interrupt, ctx.out)
    except ValueError as exc:
        conversation.turns.pop()
        print(file=ctx.out)
        print(f"error: {exc}", file=ctx.err)
        return None
    print(file=ctx.out)
    ctx.last_reply = reply
    if reply.error is not None:
        conversation.turns.pop()
        print(f"error: {reply.error}", file=ctx.err)
        return reply
    if reply.stopped and not reply.text:
        conversation.turns.pop()
        print(
            "[stopped before the first word: your message is dropped; up-arrow brings it back]", file=ctx.out
        )
    else:
        conversation.turns.append(Turn("assistant", reply.text, stopped=reply.stopped))
        if reply.stopped:
            print("[stopped: the reply so far stays in the conversation]", file=ctx.out)
    if reply.finish_reason is FinishReason.LENGTH and turn_params.max_tokens < params.max_tokens:
        print(f"[the context ({max_len} tokens) is full: /reset starts over]", file=ctx.err)
    print(f"[{reply.summary()}]", file=ctx.err)
    return reply


def run_chat(
    engine: LLMEngine,
    params: SamplingParams,
    system: str = "",
    history_path: Path | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The chat loop, until /exit, Ctrl-D or Ctrl-C at an empty prompt; the exit status (0)."""
    ctx = CommandContext(Conversation(system=system), engine, out=out or sys.stdout, err=err or sys.stderr)
    reader = LineReader(history_path)
    print(BANNER, file=ctx.err)
    grace_until = 0.0
    num_sent = 0
    try:
        while True:
            try:
                line = reader.read(PROMPT)
            except EOFError:  # Ctrl-D
                print(file=ctx.out)
                return 0
            except KeyboardInterrupt:  # Ctrl-C at the prompt
                print(file=ctx.out)
                if reader.pending_text():  # a line being typed: dropped, as a shell does
                    continue
                if time.monotonic() < grace_until:
                    print("(the reply is stopped; Ctrl-C again or Ctrl-D quits)", file=ctx.err)
                    grace_until = 0.0
                    continue
                return 0
            grace_until = 0.0
            parsed = parse_line(line)
            if parsed is None:
                continue
            if isinstance(parsed, Command):
                if not run_command(parsed, ctx):
                    return 0
                continue
            reply = send_message(parsed, ctx, params, f"chat-{num_sent}")
            num_sent += 1
            if reply is not None and reply.stopped:
                grace_until = time.monotonic() + STOP_GRACE_S
    finally:
        reader.close()
