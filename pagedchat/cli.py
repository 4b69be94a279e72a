"""The `pagedchat` console script: `serve` and `bench` live above the engine; `generate` and `chat` in engine.cli."""

from __future__ import annotations

import sys

USAGE = """usage: pagedchat {serve,users,generate,chat,bench} ...

  serve      run the chat service: browser UI, OpenAI-compatible API, admin page
  users      accounts of `serve --auth local|oidc`: add (the first admin), list, passwd, role
  generate   generate replies to prompts with the engine
  chat       interactive terminal chat
  bench      benchmarks: throughput, memory, serving, multiturn, quality, step, prefill, attention; make-gguf

Run `pagedchat COMMAND --help` for the options of each."""


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand's own entry point; each imports only what it needs."""
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "serve":
        from app.cli import serve_main

        return serve_main(rest)
    if command == "users":
        from app.users_cli import users_main

        return users_main(rest)
    if command == "bench":
        from bench.cli import bench_main

        return bench_main(rest)
    if command in ("generate", "chat"):
        from engine.cli import main as engine_main

        return engine_main(argv)
    print(USAGE, file=sys.stderr if command not in ("-h", "--help") else sys.stdout)
    return 0 if command in ("-h", "--help") else 2


if __name__ == "__main__":
    raise SystemExit(main())
