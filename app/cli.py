"""`pagedchat serve`: flags override PAGEDCHAT_* environment variables; uvicorn runs the app."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from app.http.model_catalog import model_entries
from app.settings import Settings, load_settings
from engine.cli import fetch_model
from engine.core.config import EngineConfig
from engine.core.options import add_options, given_options
from engine.core.paths import CACHE_DIR_ENV

LOG_FORMAT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"
STARTUP_FAILURE = 3  # uvicorn's exit status for a start that failed, the `cannot start: ...` refusals' too
logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """A flag for every setting and engine knob, each defaulting to None so that only flags given override the env."""
    p = argparse.ArgumentParser(
        prog="pagedchat serve",
        usage="%(prog)s [-h] [FLAG ...]",  # every flag is listed below, in its group: not again in one long line
        description="Run the chat service (HTTP, SSE, WebSocket). Every flag overrides its PAGEDCHAT_* variable.",
    )
    # grouped by each field's `group` (server, accounts, model, engine, cache, limits, then advanced)
    add_options(p, EngineConfig, Settings, defaults=False, show_env=True)
    return p


def configure_logging(level: str) -> None:
    """Root logging with the request id in every line."""
    from app.http.middleware import RequestIdFilter

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.addFilter(RequestIdFilter())
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:  # a hub download logs every request at INFO
        logging.getLogger("httpx2").setLevel(logging.WARNING)


def export_cache_dir(settings: Settings) -> None:
    """Make the cache dir the settings resolved (--cache-dir, else $PAGEDCHAT_CACHE_DIR, else ~/.cache/pagedchat)
    this process's PAGEDCHAT_CACHE_DIR. The database, secret key and KV tier take it from the settings; what is
    per machine rather than per service reads the variable (`engine.core.paths.cache_dir()`): the default model's
    provisioning, the native kernels' builder, the replica processes this one starts. Exporting the one resolved
    value before any of them runs puts the models and kernels where the flag says too."""
    os.environ[CACHE_DIR_ENV] = settings.resolved_cache_dir


def run(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM: admit nothing new from then on; running replies get `shutdown_grace_s`, then
    every stream ends with a final event saying why (app/http/server.py). The exit status: 0, or ENGINE_FAILURE
    when the engine died while serving (`--exit-on-engine-failure`)."""
    from app.http.server import build_server
    from app.main import create_app

    server = build_server(create_app(settings), settings)
    server.run()
    return server.exit_status


def repeated_models(argv: list[str]) -> list[str]:
    """`--model` given several times: the first stays `--model`, each other one becomes `--models` (served beside it)."""
    out: list[str] = []
    seen = False
    for arg in argv:
        if arg == "--model" or arg.startswith("--model="):
            if seen:
                arg = "--models" + arg.removeprefix("--model")
            seen = True
        out.append(arg)
    return out


def serve_main(argv: list[str]) -> int:
    """Entry point of `pagedchat serve`."""
    args = build_parser().parse_args(repeated_models(argv))
    try:
        settings = load_settings(**given_options(args, Settings), **given_options(args, EngineConfig))
        model_entries(settings)  # the models served: a missing file, two of one id, a missing --models-dir
    except ValueError as exc:
        print(f"pagedchat serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    export_cache_dir(settings)
    from app.http.server import check_can_listen

    try:  # a port in use is refused now, not after the model has loaded
        check_can_listen(settings.host, settings.port)
    except ValueError as exc:
        logger.error("cannot start: %s", exc)
        return STARTUP_FAILURE
    try:  # a hub id is fetched here, before the server starts: a bad id is one line, not a failed lifespan
        fetch_model(settings.engine)
    except ValueError as exc:
        print(f"pagedchat serve: {exc}", file=sys.stderr)
        return 2
    return run(settings)


if __name__ == "__main__":
    raise SystemExit(serve_main(sys.argv[1:]))
