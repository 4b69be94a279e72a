"""Tenants stay apart against a real `pagedchat serve` with default settings: a cross-site write carrying the
victim's cookie is refused and creates nothing, an owner's stored text is capped, and a client that drops its cookie
to become a fresh owner on every request is limited per address."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

EVIL = "http://evil.example"
CROSS_SITE_TEXT = {"origin": EVIL, "content-type": "text/plain"}  # a form or no-cors fetch: no preflight


def test_a_cross_site_write_with_the_victims_cookie_changes_nothing(server):
    base = server.base_url
    other_port = f"http://127.0.0.1:{urlsplit(base).port + 1}"  # another origin on the same host
    with httpx.Client(base_url=base, timeout=30) as victim:
        assert victim.get("/").status_code == 200 and "pagedchat_browser" in victim.cookies
        for origin in (EVIL, other_port):
            headers = {**CROSS_SITE_TEXT, "origin": origin}
            refused = victim.post("/api/sessions", content='{"title": "pwned"}', headers=headers)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "cross_origin_request"
        assert victim.get("/api/sessions").json()["sessions"] == []
        created = victim.post("/api/sessions", json={"title": "mine"}, headers={"origin": base})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        posted = victim.post(
            f"/api/sessions/{sid}/messages", content='{"content": "hi"}', headers=CROSS_SITE_TEXT
        )
        assert posted.status_code == 403
        deleted = victim.delete(f"/api/sessions/{sid}", headers={"origin": EVIL})
        assert deleted.status_code == 403
        assert victim.get(f"/api/sessions/{sid}").json()["messages"] == []
        login = victim.post("/admin/login", data={"token": "x"}, headers={"origin": EVIL})
        assert login.status_code == 403


def test_an_owner_cannot_store_more_than_its_quota(server):
    # the measurement: 300 sessions with 199k-character system prompts from one browser
    base = server.base_url
    prompt = "p" * 199_000
    with httpx.Client(base_url=base, timeout=60, headers={"origin": base}) as owner:
        owner.get("/")
        statuses = [
            owner.post("/api/sessions", json={"system_prompt": prompt}).status_code for _ in range(300)
        ]
        refused = owner.post("/api/sessions", json={"system_prompt": prompt})
    # 50 MiB per owner: 263 sessions of 199,008 bytes (prompt + "New chat") fit, the 264th does not
    assert statuses == [201] * 263 + [403] * 37
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert (
        "over the limit of 52428800 bytes of text per owner (max_bytes_per_owner)"
        in refused.json()["error"]["message"]
    )


def test_a_client_that_drops_its_cookie_is_limited_per_address(server):
    base = server.base_url
    statuses = []
    for _ in range(31):  # a fresh client each time: no cookie, a new owner
        response = httpx.post(base + "/api/sessions", json={}, headers={"origin": base}, timeout=30)
        statuses.append(response.status_code)
    assert statuses == [201] * 30 + [429]
    assert response.json()["error"]["code"] == "identity_rate_limited"
    assert 1 <= int(response.headers["retry-after"]) <= 60
