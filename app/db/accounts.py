"""The synchronous database work behind accounts: users and sign-ins, one function per operation (invites:
app/db/account_invites.py; API keys: app/db/account_keys.py).

Used by the async store (app/db/account_store.py) and by `pagedchat users` (app/users_cli.py), which works on the
database directly. Password hashes come in ready made: hashing belongs to app/accounts/passwords.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from app.db.account_models import ACCOUNT_ROLES, ApiKey, Invite, User, UserSession
from app.db.models import ChatSession, Preset, expires_in, utcnow
from app.db.records import as_utc
from app.db.usage import forget


class AccountConflict(Exception):
    """A write that would break an account rule: a taken username, or an instance without an enabled admin."""


@dataclass(frozen=True)
class UserRecord:
    """An account as stored, without its password hash."""

    id: str
    username: str
    role: str
    created_at: datetime
    disabled: bool
    has_password: bool
    oidc_issuer: str | None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def user_record(row: User) -> UserRecord:
    """Copy an ORM user into a record."""
    return UserRecord(
        id=row.id,
        username=row.username,
        role=row.role,
        created_at=as_utc(row.created_at),
        disabled=bool(row.disabled),
        has_password=row.password_hash is not None,
        oidc_issuer=row.oidc_issuer,
    )


def _check_role(role: str) -> None:
    if role not in ACCOUNT_ROLES:
        raise ValueError(f"role must be one of {', '.join(ACCOUNT_ROLES)}, got {role!r}")


def _by_name(s: Session, username: str) -> User | None:
    return s.scalar(select(User).where(User.username == username))


def check_new_account(s: Session, username: str, role: str) -> None:
    """A new account's (or invite's) role must exist and its username be free (AccountConflict)."""
    _check_role(role)
    if _by_name(s, username) is not None:
        raise AccountConflict(f"the username {username!r} is taken")


def _num_enabled_admins(s: Session) -> int:
    query = select(func.count()).select_from(User).where(User.role == "admin", User.disabled.is_(False))
    return int(s.execute(query).scalar_one())


def _revoke_sessions(s: Session, user_id: str) -> int:
    query = (
        update(UserSession)
        .where(UserSession.user_id == user_id, UserSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return s.execute(query).rowcount


def _revoke_keys(s: Session, user_id: str) -> int:
    query = (
        update(ApiKey)
        .where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return s.execute(query).rowcount


def _drop_pending_invites(s: Session, user_id: str) -> int:
    """An invite lives only while its creator is an enabled admin: its unused invites go when that ends."""
    return s.execute(delete(Invite).where(Invite.created_by == user_id, Invite.used_at.is_(None))).rowcount


def create_user(
    s: Session,
    username: str,
    password_hash: str | None,
    role: str,
    oidc: tuple[str, str] | None = None,
) -> UserRecord:
    """Insert an account; AccountConflict when the username is taken."""
    check_new_account(s, username, role)
    issuer, subject = oidc or (None, None)
    row = User(
        username=username,
        password_hash=password_hash,
        role=role,
        oidc_issuer=issuer,
        oidc_subject=subject,
        created_at=utcnow(),
        disabled=False,
    )
    s.add(row)
    s.flush()
    return user_record(row)


def ensure_admin(s: Session, username: str, password_hash: str) -> bool:
    """Create `username` as an admin unless an account of that name exists (left as it is); True when created."""
    if _by_name(s, username) is not None:
        return False
    create_user(s, username, password_hash, "admin")
    return True


def credentials(s: Session, username: str) -> tuple[UserRecord, str | None] | None:
    """The account of this name and its password hash (None: no password), or None."""
    row = _by_name(s, username)
    return None if row is None else (user_record(row), row.password_hash)


def get_user(s: Session, user_id: str) -> UserRecord | None:
    """The account, or None."""
    row = s.get(User, user_id)
    return None if row is None else user_record(row)


def find_user(s: Session, username: str) -> UserRecord | None:
    """The account of this name, or None."""
    row = _by_name(s, username)
    return None if row is None else user_record(row)


def usernames(s: Session, user_ids: list[str]) -> dict[str, str]:
    """The username of each of these accounts that exists, by id."""
    if not user_ids:
        return {}
    rows = s.execute(select(User.id, User.username).where(User.id.in_(user_ids)))
    return {user_id: name for user_id, name in rows}


def list_users(s: Session) -> list[UserRecord]:
    """Every account, by name."""
    return [user_record(row) for row in s.scalars(select(User).order_by(User.username))]


def set_password(s: Session, user_id: str, password_hash: str, *, revoke: bool) -> bool:
    """Replace the password hash; `revoke`: end every sign-in of the account and revoke its API keys too (a key
    made with a stolen sign-in must not outlive the password change that ends it). False when it is missing."""
    row = s.get(User, user_id)
    if row is None:
        return False
    row.password_hash = password_hash
    if revoke:
        _revoke_sessions(s, user_id)
        _revoke_keys(s, user_id)
    return True


def update_user(
    s: Session, user_id: str, *, role: str | None = None, disabled: bool | None = None
) -> UserRecord | None:
    """Change the role and/or disable or enable; disabling ends every sign-in and revokes every API key, and an
    account that is no longer an enabled admin loses its pending invites. AccountConflict when no enabled admin
    would be left. None when the account is missing."""
    row = s.get(User, user_id)
    if row is None:
        return None
    num_admins = _num_enabled_admins(s)
    if role is not None:
        _check_role(role)
        row.role = role
    if disabled is not None:
        row.disabled = disabled
        if disabled:
            _revoke_sessions(s, user_id)
            _revoke_keys(s, user_id)
    if row.role != "admin" or row.disabled:
        _drop_pending_invites(s, user_id)
    s.flush()
    if num_admins and _num_enabled_admins(s) == 0:
        raise AccountConflict("refused: no enabled admin would be left (make another account admin first)")
    return user_record(row)


def delete_user(s: Session, user_id: str, owner: str) -> bool:
    """Delete the account, its sign-ins, API keys and pending invites, and every chat and preset of `owner` (its
    owner id); AccountConflict for the last enabled admin. False when it is missing."""
    row = s.get(User, user_id)
    if row is None:
        return False
    if row.role == "admin" and not row.disabled and _num_enabled_admins(s) == 1:
        raise AccountConflict("refused: this is the last enabled admin (make another account admin first)")
    s.execute(delete(ChatSession).where(ChatSession.owner == owner))  # messages go by ON DELETE CASCADE
    s.execute(delete(Preset).where(Preset.owner == owner))  # system prompts of its own, like its chats
    forget(s, owner)
    _drop_pending_invites(s, user_id)
    s.delete(row)  # its sign-ins and API keys go by ON DELETE CASCADE
    return True


def create_session(
    s: Session, session_hash: str, user_id: str, client: str | None, lifetime_s: float
) -> None:
    """Record a sign-in valid for `lifetime_s` unless revoked."""
    s.add(
        UserSession(
            id=session_hash,
            user_id=user_id,
            client=(client or "")[:64],
            created_at=utcnow(),
            expires_at=expires_in(lifetime_s),
        )
    )


def session_user(s: Session, session_hash: str) -> UserRecord | None:
    """The account of a live sign-in (not revoked, not expired, account enabled), or None."""
    row = s.get(UserSession, session_hash)
    if row is None or row.revoked_at is not None or as_utc(row.expires_at) <= utcnow():
        return None
    user = s.get(User, row.user_id)
    return None if user is None or user.disabled else user_record(user)


def revoke_session(s: Session, session_hash: str) -> bool:
    """End one sign-in; False when it was missing or ended already."""
    query = (
        update(UserSession)
        .where(UserSession.id == session_hash, UserSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return s.execute(query).rowcount > 0


def drop_expired(s: Session) -> int:
    """Delete sign-ins and invites past their expiry, and used invites; returns how many rows went."""
    now = utcnow()
    gone = s.execute(delete(UserSession).where(UserSession.expires_at <= now)).rowcount
    return (
        gone
        + s.execute(delete(Invite).where((Invite.expires_at <= now) | Invite.used_at.isnot(None))).rowcount
    )


def oidc_user(s: Session, issuer: str, subject: str, usernames: list[str]) -> UserRecord:
    """The account of this OpenID Connect identity, created on its first sign-in with the first free name of
    `usernames` (the caller's last candidate must be unique to the identity)."""
    row = s.scalar(select(User).where(User.oidc_issuer == issuer, User.oidc_subject == subject))
    if row is not None:
        return user_record(row)
    for name in usernames:
        if _by_name(s, name) is None:
            return create_user(s, name, None, "user", oidc=(issuer, subject))
    raise AccountConflict(f"no free username for the identity {subject!r} of {issuer}")
