"""`python -m tests.fault_server [pagedchat serve flags]`: the product's server around a faulty engine (tests only).

The faults are PAGEDCHAT_TEST_FAULTS (e.g. `markers`, `step_delay_ms=25`; see tests/faults.py); everything else is
`pagedchat serve` as shipped: its settings, uvicorn config and draining on SIGTERM. `GET /test/faults` answers the
faults injected so far, per site.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app import main as app_main
from app.engine_client.async_engine import engine_factory as build_engine
from app.settings import Settings
from tests.faults import FAULTS_ENV, FaultPlan, faulty_engine_factory


def faulty_create_app(plan: FaultPlan) -> Callable[..., Starlette]:
    """`create_app` with the plan's faults in its engines and a /test/faults route."""
    product_create_app = app_main.create_app

    def create_app(settings: Settings, engine_factory: Callable | None = None) -> Starlette:
        factory = engine_factory or build_engine(settings.engine_config())
        served = product_create_app(
            settings,
            faulty_engine_factory(factory, plan),
            # the models served beside --model (app/http/model_registry.py) get the same faults
            model_factory=lambda config: faulty_engine_factory(build_engine(config), plan),
        )

        async def injected(request: Request) -> JSONResponse:
            return JSONResponse(dict(plan.injected))

        served.router.routes.insert(0, Route("/test/faults", injected, methods=["GET"]))
        return served

    return create_app


def main(argv: list[str]) -> int:
    """Serve like `pagedchat serve argv...`, with the faults of PAGEDCHAT_TEST_FAULTS."""
    plan = FaultPlan.parse(os.environ.get(FAULTS_ENV, ""))
    # app.cli.run() builds its app through app.main.create_app; patched before app.cli is imported, this process
    # serves the faulty one whichever way app.cli refers to it
    app_main.create_app = faulty_create_app(plan)
    from app.cli import serve_main

    return serve_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
