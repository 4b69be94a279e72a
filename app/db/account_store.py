"""Accounts in the database: users and their sign-ins (app/db/accounts.py), invites (account_invites.py) and API
keys (account_keys.py), bound as one feature's async methods run on the database's threads (app/db/threads.py)."""

from __future__ import annotations

from app.db import account_invites, account_keys, accounts
from app.db.threads import FeatureStore, reads, writes


class AccountStore(FeatureStore):
    """Users, sign-ins, invites and API keys. Secrets never reach the database: sign-ins, invites and API keys are
    stored by the SHA-256 of their secret (`*_hash`), passwords as argon2id hashes made by the caller."""

    create_user = writes(accounts.create_user)
    ensure_admin = writes(accounts.ensure_admin)
    user_credentials = reads(accounts.credentials)
    get_user = reads(accounts.get_user)
    list_users = reads(accounts.list_users)
    usernames = reads(accounts.usernames)
    set_password = writes(accounts.set_password)
    update_user = writes(accounts.update_user)
    delete_user = writes(accounts.delete_user)
    create_user_session = writes(accounts.create_session)
    session_user = reads(accounts.session_user)
    revoke_user_session = writes(accounts.revoke_session)
    drop_expired_accounts_rows = writes(accounts.drop_expired)
    oidc_user = writes(accounts.oidc_user)
    create_invite = writes(account_invites.create_invite)
    get_invite = reads(account_invites.get_invite)
    accept_invite = writes(account_invites.accept_invite)
    list_invites = reads(account_invites.list_invites)
    revoke_invite = writes(account_invites.revoke_invite)
    create_api_key = writes(account_keys.create_key)
    list_api_keys = reads(account_keys.list_keys)
    revoke_api_key = writes(account_keys.revoke_key)
    api_key_user = reads(account_keys.key_user)
    api_key_live = reads(account_keys.key_live)
    api_key_names = reads(account_keys.key_names)
