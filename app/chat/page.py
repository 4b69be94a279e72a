"""GET /: the chat page, with its settings form's bounds and defaults."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from app.chat.chat_settings import CHAT_TEMPERATURE_RANGE, chat_defaults
from app.http.account_auth import signed_in_account
from app.http.admin_auth import is_admin
from app.http.services import Services, services
from app.http.templates import NO_STORE, render


async def chat_page(request: Request) -> Response:
    """GET /: the chat UI (the middleware hands out the browser cookie that owns its sessions); with accounts on,
    the sign-in page first."""
    svc = services(request)
    account = signed_in_account(request) if svc.settings.auth != "none" else None
    if svc.settings.auth != "none" and account is None:
        return RedirectResponse("/login", status_code=303, headers=NO_STORE)
    context = {
        "account": account.user.username if account is not None else None,
        "model_name": svc.models.default_name,
        "models": svc.models.names,  # more than one: the page has a model picker
        "sampling_defaults": svc.sampling_defaults,
        "sampling_source": sampling_source_text(svc.sampling_sources),
        "default_system_prompt": svc.settings.default_system_prompt,
        "setting_rows": setting_rows(svc),
        "admin": await is_admin(request, svc),  # the admin link shows to admins only
    }
    return render(request, "chat.html", context)


@dataclass(frozen=True)
class SettingField:
    """A number field of the chat settings form: its bounds, and the server's default with where that comes from."""

    name: str
    label: str
    min: float | None
    max: float | None
    step: float
    default: float | int
    source: str  # server, model or built-in

    @property
    def id(self) -> str:
        return "set-" + self.name.replace("_", "-")


def setting_rows(svc: Services) -> list[list[SettingField]]:
    """The chat settings form's number fields, two to a row; their bounds are the ones the server holds chats to."""
    defaults, sources = chat_defaults(svc.settings, svc.engine.info)  # --model's: the page's own, per model
    low, high = CHAT_TEMPERATURE_RANGE

    def field(name: str, label: str, bounds: tuple[float | None, float | None], step: float) -> SettingField:
        return SettingField(name, label, *bounds, step, defaults[name], sources[name])

    return [
        [field("temperature", "Temperature", (low, high), 0.05), field("top_p", "Top p", (0, 1), 0.05)],
        [
            field("top_k", "Top k", (0, None), 1),
            field("repetition_penalty", "Repetition penalty", (0.01, 10), 0.05),
        ],
        [field("max_tokens", "Max tokens", (1, None), 1)],
    ]


SOURCE_LABELS = {
    "server": "from the server's flags",
    "model": "from the model's generation config",
    "built-in": "built-in",
}


def sampling_source_text(sources: dict[str, str]) -> str:
    """Where the default of each sampling field comes from, in words: "temperature, top p from ...; ..."."""
    by_source: dict[str, list[str]] = {}
    for name, source in sources.items():
        by_source.setdefault(source, []).append(name.replace("_", " "))
    return "; ".join(f"{', '.join(names)} {SOURCE_LABELS[source]}" for source, names in by_source.items())


routes = [Route("/", chat_page, methods=["GET"])]
