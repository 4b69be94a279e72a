"""The synchronous database work behind per-account API keys: made, listed and revoked by their account, looked up
by the SHA-256 of the secret a request sends (never the secret itself)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.db.account_models import ApiKey, User
from app.db.accounts import AccountConflict, UserRecord, user_record
from app.db.models import utcnow
from app.db.records import as_utc


@dataclass(frozen=True)
class ApiKeyRecord:
    """An API key as stored (never its secret): `prefix` is the key's first characters, for telling keys apart."""

    id: str
    user_id: str
    name: str
    prefix: str
    created_at: datetime
    revoked: bool


def _record(row: ApiKey) -> ApiKeyRecord:
    return ApiKeyRecord(
        row.id, row.user_id, row.name, row.prefix, as_utc(row.created_at), row.revoked_at is not None
    )


def create_key(
    s: Session, user_id: str, name: str, prefix: str, secret_hash: str, max_keys: int
) -> ApiKeyRecord:
    """Record a key of an enabled account; AccountConflict when the account is missing or disabled, or already
    has `max_keys` live keys."""
    user = s.get(User, user_id)
    if user is None or user.disabled:
        raise AccountConflict("this account is disabled or gone: it makes no API keys")
    live = (
        select(func.count()).select_from(ApiKey).where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
    )
    num_live = int(s.execute(live).scalar_one())
    if num_live >= max_keys:
        raise AccountConflict(
            f"this account has {num_live} API keys, the most it may have is {max_keys}: revoke one first"
        )
    row = ApiKey(
        user_id=user_id,
        name=name,
        prefix=prefix,
        secret_hash=secret_hash,
        created_at=utcnow(),
        revoked_at=None,
    )
    s.add(row)
    s.flush()
    return _record(row)


def list_keys(s: Session, user_id: str) -> list[ApiKeyRecord]:
    """The account's live keys, oldest first."""
    query = (
        select(ApiKey)
        .where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
        .order_by(ApiKey.created_at, ApiKey.id)
    )
    return [_record(row) for row in s.scalars(query)]


def revoke_key(s: Session, user_id: str, key_id: str) -> bool:
    """Revoke one of the account's live keys; False when it has none of that id."""
    query = (
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )
    return s.execute(query).rowcount > 0


def key_names(s: Session, key_ids: list[str]) -> dict[str, str]:
    """The name of each of these keys that exists (revoked ones too), by id."""
    if not key_ids:
        return {}
    rows = s.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(key_ids)))
    return {key_id: name for key_id, name in rows}


def key_user(s: Session, secret_hash: str) -> tuple[ApiKeyRecord, UserRecord] | None:
    """The key of this secret's hash (revoked ones too) and its account, or None for no such key."""
    found = s.execute(
        select(ApiKey, User).join(User, User.id == ApiKey.user_id).where(ApiKey.secret_hash == secret_hash)
    ).first()
    return None if found is None else (_record(found[0]), user_record(found[1]))


def key_live(s: Session, key_id: str) -> bool:
    """Whether the key exists, is not revoked, and its account is enabled."""
    query = (
        select(func.count())
        .select_from(ApiKey)
        .join(User, User.id == ApiKey.user_id)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None), User.disabled.is_(False))
    )
    return int(s.execute(query).scalar_one()) > 0
