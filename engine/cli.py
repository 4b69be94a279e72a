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

HISTORY_FILE = "chat_history"  # under the cache dir: the chat's input lines, for up-arrow in the next chat


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every EngineConfig field (defaults from the fields), for each subcommand that builds an engine."""
    add_options(parser, EngineConfig)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """An EngineConfig from parsed engine arguments."""
    return EngineConfig(**given_options(args, EngineConfig))


def fetch_model(config: EngineConfig) -> None:
    """Download the model now when it is a hub id, before anything else starts: the download's progress bar shows
    first, and a bad id, revision or network ends in one line (ValueError); local models are left to the engine."""
    from engine.loading.hub import fetch_if_hub_id

    fetch_if_hub_id(config.model, revision=config.model_revision, gguf_file=config.gguf_file)


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="longest reply, in tokens (default: %(default)s)"
    )
    unset = "unset: the model's generation_config.json, else {} (as `pagedchat serve` and the chat page)"
    parser.add_argument("--temperature", type=float, help=unset.format(BUILTIN.temperature))
    parser.add_argument("--top-p", type=float, help=unset.format(BUILTIN.top_p))
    parser.add_argument("--top-k", type=int, help=unset.format(BUILTIN.top_k))
    parser.add_argument("--repetition-penalty", type=float, help=unset.format(BUILTIN.repetition_penalty))
    parser.add_argument(
        "--ignore-eos", action="store_true", help="go on past the end-of-sequence token, up to --max-tokens"
    )


def _verbosity_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="logs (on stderr) at INFO; -vv at DEBUG (default: warnings and errors only)",
    )


def sampling_params_from_args(args: argparse.Namespace, model_defaults: SamplingDefaults) -> SamplingParams:
    """The flags given, else the model's generation config, else the built-in defaults; ValueError on a bad flag."""
    given = SamplingDefaults(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
    )
    chosen = given.over(model_defaults.over(BUILTIN))
    return SamplingParams(max_tokens=args.max_tokens, ignore_eos=args.ignore_eos, **chosen.given())


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
    from engine.cli_chat import run_chat
    from engine.core.paths import cache_dir

    engine = LLMEngine(config_from_args(args))
    try:
        params = sampling_params_from_args(args, engine.sampling_defaults)
        return run_chat(engine, params, system=args.system, history_path=cache_dir() / HISTORY_FILE)
    finally:
        engine.close()


def build_parser() -> argparse.ArgumentParser:
    """The `pagedchat generate|chat` parser: prompts, sampling and every engine flag."""
    parser = argparse.ArgumentParser(prog="pagedchat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate replies to prompts")
    gen.add_argument("prompt", nargs="+", help="a prompt; several: one reply each")
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    _sampling_args(gen)
    _verbosity_arg(gen)
    add_engine_args(gen)
    chat = sub.add_parser(
        "chat",
        help="interactive terminal chat that keeps the conversation",
        description="Interactive terminal chat. Ctrl-C stops a reply (what came so far stays in the conversation); "
        "/help lists the commands (/reset, /system, /save, /stats, /exit); Ctrl-D quits.",
    )
    chat.add_argument("--system", default="", help="system prompt")
    _sampling_args(chat)
    _verbosity_arg(chat)
    add_engine_args(chat)
    return parser


def configure_logging(verbosity: int) -> None:
    """Logs to stderr, at WARNING unless -v (INFO) or -vv (DEBUG): stdout is the conversation's alone."""
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if level > logging.DEBUG:  # a hub download logs every request at INFO: -vv shows them
        logging.getLogger("httpx2").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pagedchat generate|chat` (pagedchat.cli dispatches here)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    try:
        return _generate(args) if args.command == "generate" else _chat(args)
    except ValueError as exc:
        # bad input (a missing model file, an impossible option): a line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the model loads, or a second one in a step that does not end
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
