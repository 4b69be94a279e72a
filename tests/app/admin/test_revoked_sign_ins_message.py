"""The start-up warning about revoked admin sign-ins says what can have changed: a sign-in keeps the admin token's
fingerprint keyed by the secret key, so a new secret key alone revokes them too (the warning used to blame the
token then)."""

from __future__ import annotations

import logging

from tests.app.factories import make_client

TOKEN = "an-admin-token-of-24-chars"


def sign_in_and_restart(tmp_path, caplog, **restart) -> str:
    """Sign in with TOKEN under secret key one, then start again on the same database with `restart`; the log of
    that start."""
    with make_client(tmp_path, admin_token=TOKEN, secret_key="secret key one") as client:
        response = client.post("/admin/login", data={"token": TOKEN}, follow_redirects=False)
        assert response.status_code == 303, response.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.main"), make_client(tmp_path, **restart):
        pass
    return caplog.text


def test_a_new_secret_key_alone_revokes_sign_ins_and_the_warning_names_it(tmp_path, caplog):
    log = sign_in_and_restart(tmp_path, caplog, admin_token=TOKEN, secret_key="secret key two")
    assert "the admin token or the secret key changed: revoked 1 admin sign-ins" in log, log
    assert "the admin token changed" not in log


def test_no_admin_token_now_revokes_sign_ins_and_the_warning_says_so(tmp_path, caplog):
    log = sign_in_and_restart(tmp_path, caplog, secret_key="secret key one")
    assert "no admin token is set: revoked 1 admin sign-ins made with one" in log, log


def test_the_same_token_and_secret_key_keep_sign_ins(tmp_path, caplog):
    log = sign_in_and_restart(tmp_path, caplog, admin_token=TOKEN, secret_key="secret key one")
    assert "revoked" not in log, log
