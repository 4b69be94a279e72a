"""What the `--auth local` security modules share: a module server with a first admin `root`, browsers that write as
the server's own pages do, a signed-in root, and accounts made by it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.conftest import Server, server_env, start_server
from tests.e2e.zygote import CHEAP_PASSWORD_HASHES_ENV

ROOT, ROOT_PASSWORD = "root", "root password 1"
PASSWORD = "a password 1"  # every account the tests make


def start_accounts_server(tmp_path: Path, model: str, **env: str) -> Server:
    """`pagedchat serve --auth local` with the admin `root` made at start; `env`: more PAGEDCHAT_* variables."""
    values = {
        CHEAP_PASSWORD_HASHES_ENV: "1",  # these modules test what accounts may do, not what a hash costs
        "PAGEDCHAT_AUTH": "local",
        "PAGEDCHAT_FIRST_ADMIN": ROOT,
        "PAGEDCHAT_FIRST_ADMIN_PASSWORD": ROOT_PASSWORD,
    }
    return start_server(tmp_path, server_env(tmp_path, model, **values, **env))


def browser(server: Server) -> httpx.Client:
    """A client with a cookie jar that writes as the server's own pages do (same Origin)."""
    return httpx.Client(base_url=server.base_url, headers={"Origin": server.base_url}, timeout=30)


@contextmanager
def signed_in(server: Server, username: str, password: str = PASSWORD) -> Iterator[httpx.Client]:
    """A browser signed in as `username`."""
    with browser(server) as client:
        response = client.post("/auth/login", json={"username": username, "password": password})
        assert response.status_code == 200, response.text
        yield client


def add_user(root: httpx.Client, username: str, role: str = "user") -> dict[str, Any]:
    """An account made by the signed-in admin `root`, with PASSWORD."""
    response = root.post("/api/users", json={"username": username, "password": PASSWORD, "role": role})
    assert response.status_code == 201, response.text
    return response.json()["user"]
