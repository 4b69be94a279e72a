"""`pagedchat serve`: flags override PAGEDCHAT_* environment variables; uvicorn runs the app."""

from __future__ import annotations

import argparse
import logging
import sys
from types import FrameType

from app.settings import Settings, load_settings

LOG_FORMAT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    """Every flag defaults to None, so that only flags actually given override the environment."""
    p = argparse.ArgumentParser(
        prog="pagedchat serve", description="Run the chat service (HTTP, SSE, WebSocket)."
    )
    p.add_argument("--host", help="listen address (PAGEDCHAT_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="listen port (PAGEDCHAT_PORT, default 8000)")
    p.add_argument("--model", help="a local HF folder or smollm2-135m-instruct (PAGEDCHAT_MODEL)")
    p.add_argument(
        "--database-url", help="SQLAlchemy URL (PAGEDCHAT_DATABASE_URL, default SQLite in the cache dir)"
    )
    p.add_argument(
        "--api-key",
        dest="api_keys",
        action="append",
        help="required on /v1 when given; repeatable (PAGEDCHAT_API_KEYS, comma-separated)",
    )
    p.add_argument("--admin-token", help="guards /api/admin (PAGEDCHAT_ADMIN_TOKEN; unset: loopback only)")
    p.add_argument("--cache-dir", help="PAGEDCHAT_CACHE_DIR")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    limits = p.add_argument_group("limits")
    limits.add_argument("--max-body-bytes", type=int)
    limits.add_argument(
        "--max-queued-requests", type=int, help="requests waiting beyond max-num-seqs before 503"
    )
    limits.add_argument("--request-timeout-s", type=float)
    limits.add_argument("--default-max-tokens", type=int, help="reply length of session turns")
    limits.add_argument(
        "--shutdown-grace-s", type=float, help="how long running replies may finish at shutdown"
    )
    limits.add_argument("--client-requests-per-minute", type=int, help="per API key / browser; 0: no limit")
    limits.add_argument("--client-max-streams", type=int, help="requests in flight per client; 0: no limit")
    limits.add_argument("--db-busy-timeout-ms", type=int, help="wait for a database lock this long, then 503")
    engine = p.add_argument_group("engine")
    engine.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    engine.add_argument("--device", choices=["auto", "cpu", "cuda"])
    engine.add_argument("--block-size", type=int)
    engine.add_argument("--kv-cache-bytes", type=int)
    engine.add_argument("--memory-utilization", type=float)
    engine.add_argument("--max-model-len", type=int)
    engine.add_argument("--max-num-seqs", type=int)
    engine.add_argument("--max-num-batched-tokens", type=int)
    engine.add_argument(
        "--no-prefix-caching", dest="enable_prefix_caching", action="store_const", const=False
    )
    engine.add_argument("--seed", type=int)
    engine.add_argument("--num-threads", type=int)
    return p


def configure_logging(level: str) -> None:
    """Root logging with the request id in every line."""
    from app.middleware import RequestIdFilter

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.addFilter(RequestIdFilter())
    root.setLevel(level.upper())


def run(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM: admit nothing new from then on; running replies get `shutdown_grace_s`."""
    import uvicorn

    from app.main import create_app

    app = create_app(settings)

    class DrainingServer(uvicorn.Server):
        """Tells the app as soon as a shutdown signal arrives, before uvicorn waits for open connections."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            logging.getLogger(__name__).warning("signal %d: draining (no new replies)", sig)
            app.state.services.start_draining()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        ws_max_size=settings.ws_max_frame_bytes,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 5,
        proxy_headers=False,
    )
    DrainingServer(config).run()


def serve_main(argv: list[str]) -> int:
    """Entry point of `pagedchat serve`."""
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    if "api_keys" in overrides:
        overrides["api_keys"] = tuple(overrides["api_keys"])
    try:
        settings = load_settings(**overrides)
    except ValueError as exc:
        print(f"pagedchat serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    run(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve_main(sys.argv[1:]))
