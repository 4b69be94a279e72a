"""The account flags (one immutable config: bad combinations are refused with the reason) and `pagedchat users`."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from app.settings import Settings, settings_from_env
from app.users_cli import users_main


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auth": "ldap"}, "auth must be one of none, local, oidc, got 'ldap'"),
        ({"first_admin": "alice", "first_admin_password": "x" * 8}, "first_admin needs accounts"),
        ({"auth": "local", "first_admin": "alice"}, "first_admin 'alice' needs a password"),
        ({"auth": "oidc"}, "--auth oidc needs oidc_issuer and oidc_client_id"),
        (
            {"auth": "oidc", "oidc_issuer": "http://idp.example", "oidc_client_id": "c"},
            "oidc_issuer must be an https:// URL (http:// only on loopback), got 'http://idp.example'",
        ),
        (
            {"auth": "oidc", "oidc_issuer": "https://idp", "oidc_client_id": "c", "oidc_scopes": "email"},
            "oidc_scopes must include openid",
        ),
        ({"auth": "local", "account_session_days": 0}, "account_session_days must be positive, got 0"),
    ],
)
def test_account_settings_refuse_what_cannot_work(values, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings(**values)


def test_account_settings_come_from_the_environment():
    env = {
        "PAGEDCHAT_AUTH": "oidc",
        "PAGEDCHAT_OIDC_ISSUER": "http://127.0.0.1:9000",
        "PAGEDCHAT_OIDC_CLIENT_ID": "pagedchat",
        "PAGEDCHAT_OIDC_CLIENT_SECRET": "s3cret",
        "PAGEDCHAT_FIRST_ADMIN": "alice",
        "PAGEDCHAT_FIRST_ADMIN_PASSWORD": "correct horse",
    }
    settings = settings_from_env(env)
    assert (settings.auth, settings.oidc_issuer, settings.oidc_client_secret) == (
        "oidc",
        "http://127.0.0.1:9000",
        "s3cret",
    )
    assert (settings.first_admin, settings.first_admin_password) == ("alice", "correct horse")
    assert Settings().auth == "none"  # the cookie identity stays the default


def run(tmp_path: Path, *argv: str, stdin: str = "") -> tuple[int, str]:
    out = io.StringIO()
    code = users_main(["--database-url", f"sqlite:///{tmp_path / 'chat.db'}", *argv], io.StringIO(stdin), out)
    return code, out.getvalue()


def test_users_command_adds_lists_resets_and_promotes(tmp_path, capsys):
    assert run(tmp_path, "add", "--admin", "Alice", "--password-stdin", stdin="correct horse\n") == (
        0,
        "created admin account alice\n",
    )
    assert run(tmp_path, "add", "bob", "--password-stdin", stdin="battery staple\n")[0] == 0
    assert run(tmp_path, "list") == (0, "alice\tadmin\nbob\tuser\n")
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        (stored,) = conn.execute("SELECT password_hash FROM users WHERE username = 'alice'").fetchone()
    assert stored.startswith("$argon2id$") and PasswordHasher().verify(stored, "correct horse")
    assert run(tmp_path, "add", "alice", "--password-stdin", stdin="another one\n")[0] == 2
    assert "the username 'alice' is taken" in capsys.readouterr().err
    assert run(tmp_path, "add", "carol", "--password-stdin", stdin="short\n")[0] == 2
    assert "password must be 8 to 1024 characters, got 5" in capsys.readouterr().err
    assert run(tmp_path, "add", "dave")[0] == 2  # no terminal to ask on
    assert "pipe it in with --password-stdin" in capsys.readouterr().err
    assert run(tmp_path, "role", "bob", "admin") == (0, "bob is now admin\n")
    assert run(tmp_path, "passwd", "bob", "--password-stdin", stdin="new password\n")[0] == 0
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        (stored,) = conn.execute("SELECT password_hash FROM users WHERE username = 'bob'").fetchone()
    assert PasswordHasher().verify(stored, "new password")
    assert run(tmp_path, "role", "nobody", "admin")[0] == 2
    assert "no account named 'nobody'" in capsys.readouterr().err
