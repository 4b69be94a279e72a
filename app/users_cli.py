"""`pagedchat users`: accounts from the command line, on the server's database (running or not), e.g. the first admin.

    pagedchat users add --admin alice            # asks for the password twice
    printf '%s\\n' "$PW" | pagedchat users add bob --password-stdin
    pagedchat users list
    pagedchat users passwd alice                 # a new password; every sign-in of alice ends
    pagedchat users role bob admin

The database is the one `pagedchat serve` uses with the same PAGEDCHAT_* variables (or --database-url / --cache-dir).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from app.accounts.passwords import Passwords, check_password
from app.db import accounts
from app.db.database import create_db_engine, upgrade_to_head
from app.http.identity import normalize_username
from app.settings import settings_from_env

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    """The subcommands: add, list, passwd, role."""
    p = argparse.ArgumentParser(
        prog="pagedchat users",
        description="Manage the accounts of `pagedchat serve --auth local|oidc` on its database.",
    )
    p.add_argument(
        "--database-url", help="SQLAlchemy URL (default: PAGEDCHAT_DATABASE_URL, else the cache dir's)"
    )
    p.add_argument(
        "--cache-dir", help="the server's cache dir (default: PAGEDCHAT_CACHE_DIR or ~/.cache/pagedchat)"
    )
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="create an account (a password is asked for)")
    add.add_argument("username")
    add.add_argument("--admin", action="store_true", help="an admin: manages accounts on the /account page")
    add.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    sub.add_parser("list", help="list the accounts")
    passwd = sub.add_parser("passwd", help="set a new password; every sign-in of the account ends")
    passwd.add_argument("username")
    passwd.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    role = sub.add_parser("role", help="make an account admin or user")
    role.add_argument("username")
    role.add_argument("role", choices=("admin", "user"))
    return p


def read_password(from_stdin: bool, stdin: TextIO = sys.stdin) -> str:
    """The new password: one line of stdin, else asked twice on the terminal; ValueError saying what is wrong."""
    if from_stdin:
        return check_password(stdin.readline().rstrip("\r\n"))
    if not stdin.isatty():
        raise ValueError("no terminal to ask for the password: pipe it in with --password-stdin")
    first = getpass.getpass("Password: ")
    check_password(first)
    if getpass.getpass("Repeat it: ") != first:
        raise ValueError("the two passwords differ")
    return first


def users_main(argv: list[str], stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Entry point of `pagedchat users`."""
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in (("database_url", args.database_url), ("cache_dir", args.cache_dir)) if v}
    try:
        settings = settings_from_env(**overrides)
        if not settings.database_url:  # the default SQLite file lives in the cache dir
            Path(settings.resolved_cache_dir).mkdir(parents=True, exist_ok=True)
        if args.command == "list":
            users = _on_database(settings.resolved_database_url, accounts.list_users)
            for user in users:
                state = " (disabled)" if user.disabled else ""
                stdout.write(f"{user.username}\t{user.role}{state}\n")
            return 0
        name = normalize_username(args.username)
        if args.command == "role":
            user = _on_database(settings.resolved_database_url, _set_role, name, args.role)
            stdout.write(f"{user.username} is now {user.role}\n")
            return 0
        password_hash = _hash(read_password(args.password_stdin, stdin))
        if args.command == "add":
            role = "admin" if args.admin else "user"
            user = _on_database(
                settings.resolved_database_url, accounts.create_user, name, password_hash, role
            )
            stdout.write(f"created {user.role} account {user.username}\n")
        else:
            _on_database(settings.resolved_database_url, _set_password, name, password_hash)
            stdout.write(f"new password set for {name}; its sign-ins ended and its API keys revoked\n")
    except (ValueError, accounts.AccountConflict, LookupError) as exc:
        print(f"pagedchat users: {exc}", file=sys.stderr)
        return 2
    return 0


def _hash(password: str) -> str:
    passwords = Passwords()
    try:
        return passwords.hash_now(password)
    finally:
        passwords.close()


def _on_database(url: str, fn: Callable[..., T], *args: Any) -> T:
    """Run `fn(session, *args)` in one transaction on the database, migrated to head first."""
    engine = create_db_engine(url)
    try:
        upgrade_to_head(engine)
        with sessionmaker(engine).begin() as s:
            return fn(s, *args)
    finally:
        engine.dispose()


def _find(s: Session, username: str) -> accounts.UserRecord:
    user = accounts.find_user(s, username)
    if user is None:
        raise LookupError(f"no account named {username!r}")
    return user


def _set_role(s: Session, username: str, role: str) -> accounts.UserRecord:
    user = accounts.update_user(s, _find(s, username).id, role=role)
    assert user is not None
    return user


def _set_password(s: Session, username: str, password_hash: str) -> None:
    accounts.set_password(s, _find(s, username).id, password_hash, revoke=True)
