"""`pagedchat generate` and `pagedchat chat`: the engine without the web service."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from engine.core.config import EngineConfig
from engine.core.options import add_options, given_options
from engine.core.sampling_defaults import BUILTIN, SamplingDefaults
from engine.core.sequence import SamplingParams


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every EngineConfig field (defaults from the fields), for each subcommand that builds an engine."""
    add_options(parser, EngineConfig, title="engine")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """An EngineConfig from parsed engine arguments."""
    return EngineConfig(**given_options(args, EngineConfig))


def fetch_model(config: EngineConfig) -> None:
    """Download the model now when it is a hub id, before anything else starts: the download's progress bar shows
    first, and a bad id, revision or network ends in one line (ValueError); local models are left to the engine."""
    from engine.loading.hub import fetch_if_hub_id

    fetch_if_hub_id(config.model, revision=config.model_revision, gguf_file=config.gguf_file)


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=256)
    unset = "unset: the model's generation_config.json, else {} (as `pagedchat serve` and the chat page)"
    parser.add_argument("--temperature", type=float, help=unset.format(BUILTIN.temperature))
    parser.add_argument("--top-p", type=float, help=unset.format(BUILTIN.top_p))
    parser.add_argument("--top-k", type=int, help=unset.format(BUILTIN.top_k))
    parser.add_argument("--repetition-penalty", type=float, help=unset.format(BUILTIN.repetition_penalty))


def sampling_params_from_args(args: argparse.Namespace, model_defaults: SamplingDefaults) -> SamplingParams:
    """The flags given, else the model's generation config, else the built-in defaults; ValueError on a bad flag."""
    given = SamplingDefaults(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
    )
    chosen = given.over(model_defaults.over(BUILTIN))
    return SamplingParams(max_tokens=args.max_tokens, **chosen.given())


def _generate(args: argparse.Namespace) -> int:
    from engine import LLM

    llm = LLM(**vars(config_from_args(args)))
    params = sampling_params_from_args(args, llm.engine.sampling_defaults)
    prompts = args.prompt
    started = time.perf_counter()
    if args.raw:
        outputs = llm.generate(prompts, params)
    else:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    elapsed = time.perf_counter() - started
    for out in outputs:
        print(out.outputs[0].text)
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"[{num_tokens} tokens in {elapsed:.2f} s, {num_tokens / elapsed:.1f} tok/s]", file=sys.stderr)
    return 0


def _chat(args: argparse.Namespace) -> int:
    from engine import LLMEngine

    engine = LLMEngine(config_from_args(args))
    params = sampling_params_from_args(args, engine.sampling_defaults)
    messages: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    print("pagedchat — type a message, /reset to start over, Ctrl-D to quit.", file=sys.stderr)
    turn = 0
    while True:
        try:
            text = input("you> ").strip()
        except EOFError:
            print(file=sys.stderr)
            return 0
        if not text:
            continue
        if text == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": text})
        prompt = engine.apply_chat_template(messages)
        try:
            engine.add_request(f"chat-{turn}", prompt, params)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            messages.pop()
            continue
        turn += 1
        print("assistant> ", end="", flush=True)
        reply, cached = "", 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                delta = out.outputs[0].text_delta
                reply += delta
                cached = out.num_cached_tokens
                print(delta, end="", flush=True)
        print(f"\n[{len(prompt)} prompt tokens, {cached} from the prefix cache]", file=sys.stderr)
        messages.append({"role": "assistant", "content": reply})


def build_parser() -> argparse.ArgumentParser:
    """The `pagedchat generate|chat` parser: prompts, sampling and every engine flag."""
    parser = argparse.ArgumentParser(prog="pagedchat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate replies to prompts")
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    _sampling_args(gen)
    add_engine_args(gen)
    chat = sub.add_parser("chat", help="interactive terminal chat that keeps the conversation")
    chat.add_argument("--system", default="", help="system prompt")
    _sampling_args(chat)
    add_engine_args(chat)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pagedchat generate|chat` (pagedchat.cli dispatches here)."""
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # a hub download logs every request at INFO
    args = build_parser().parse_args(argv)
    try:
        return _generate(args) if args.command == "generate" else _chat(args)
    except (
        ValueError
    ) as exc:  # bad input (a missing model file, an impossible option): a line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
