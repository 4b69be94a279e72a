"""Attachments through the session API on the real tiny engine: upload, chips, the files' blocks at a fixed place in
the prompt (later turns read them from the prefix cache), edit/regenerate, ownership, CSRF, quotas, limits, export,
and hostile files that leave the server up and store nothing."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from tests.app.chat.pdf_factories import nested_pdf, text_pdf
from tests.app.factories import SAME_ORIGIN, chat_prompt_ids, make_client, sse_events, wait_pool_idle

GREEDY = {"temperature": 0, "max_tokens": 8}
# about 350 tokens of the tiny model: most of each later prompt
NOTES = "\n".join(
    f"- item {i}: the {i}th line of the project notes, with a number {i * 7}." for i in range(14)
)
EVIL = {"origin": "https://evil.example"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with make_client(tmp_path_factory.mktemp("attachments"), max_attachments_per_message=3) as c:
        yield c


def new_session(client: TestClient, **fields) -> str:
    response = client.post("/api/sessions", json={"settings": GREEDY, **fields})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def upload(client: TestClient, sid: str, filename: str, data: bytes, headers: dict | None = None):
    headers = {"content-type": "application/octet-stream", **(headers or {})}
    return client.post(
        f"/api/sessions/{sid}/attachments", params={"filename": filename}, content=data, headers=headers
    )


def attach(client: TestClient, sid: str, filename: str, data: bytes) -> dict:
    response = upload(client, sid, filename, data)
    assert response.status_code == 201, response.text
    return response.json()


def send(client: TestClient, sid: str, content: str, path: str = "messages", **fields) -> list[dict]:
    with client.stream(
        "POST", f"/api/sessions/{sid}/{path}", json={"content": content, **fields}
    ) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(e["data"]) for e in sse_events(response.iter_lines())]


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_an_uploaded_file_waits_as_a_chip_until_sent(client):
    sid = new_session(client)
    chip = attach(client, sid, "notes.md", NOTES.encode())
    assert chip["filename"] == "notes.md" and chip["media_type"] == "text/markdown"
    assert chip["bytes"] == len(NOTES.encode()) and chip["message_id"] is None
    assert 300 < chip["tokens"] < 450  # the document block in the model's tokens
    assert client.get(f"/api/sessions/{sid}/attachments").json()["attachments"] == [chip]
    full = client.get(f"/api/sessions/{sid}/attachments/{chip['id']}").json()
    assert full["text"] == NOTES and full["id"] == chip["id"]
    assert client.delete(f"/api/sessions/{sid}/attachments/{chip['id']}").status_code == 204
    assert client.get(f"/api/sessions/{sid}/attachments").json()["attachments"] == []
    assert client.get(f"/api/sessions/{sid}/attachments/{chip['id']}").status_code == 404


def test_the_file_goes_before_the_question_and_later_turns_read_it_from_the_cache(client):
    sid = new_session(client)
    chip = attach(client, sid, "notes.md", NOTES.encode())
    first = send(client, sid, "What is item 3?", attachments=[chip["id"]])
    start, done = first[0], first[-1]
    shown = start["user_message"]
    assert shown["content"] == "What is item 3?"  # the page shows the question and a chip, not the file
    assert [(a["id"], a["filename"], a["tokens"]) for a in shown["attachments"]] == [
        (chip["id"], "notes.md", chip["tokens"])
    ]
    exported = client.get(f"/api/sessions/{sid}/export", params={"token_ids": "true"}).json()
    user_ids = exported["messages"][0]["token_ids"]
    prompt = f'<document name="notes.md">\n{NOTES}\n</document>\n\nWhat is item 3?'
    assert user_ids == chat_prompt_ids([{"role": "user", "content": prompt}])
    assert done["usage"]["prompt_tokens"] == len(user_ids)
    for question in ("And item 7?", "Which item has the number 70?"):
        usage = send(client, sid, question)[-1]["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 0.9 * usage["prompt_tokens"], usage
    listed = client.get(f"/api/sessions/{sid}/messages").json()["messages"]
    assert [len(m["attachments"]) for m in listed] == [1, 0, 0, 0, 0, 0]
    assert client.get(f"/api/sessions/{sid}/attachments").json()["attachments"] == []  # sent: none waits
    wait_pool_idle(client)


def test_a_sent_file_stays_with_its_message_through_regenerate_and_edit(client):
    sid = new_session(client)
    chip = attach(client, sid, "data.csv", b"name,score\nada,3\nbob,5\n")
    first = send(client, sid, "Who scored most?", attachments=[chip["id"]])
    user_id = first[0]["user_message"]["id"]
    again = send(client, sid, "", path="regenerate")[-1]
    assert again["usage"]["prompt_tokens"] == first[-1]["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    error = error_of(client.delete(f"/api/sessions/{sid}/attachments/{chip['id']}"), 409)
    assert "goes only with the message" in error["message"]
    reused = client.post(f"/api/sessions/{sid}/messages", json={"content": "x", "attachments": [chip["id"]]})
    assert "already sent" in error_of(reused, 400)["message"]
    edited = send(client, sid, "Who scored least?", path="edit", message_id=user_id)
    copy = edited[0]["user_message"]["attachments"]
    assert [(a["filename"], a["tokens"]) for a in copy] == [("data.csv", chip["tokens"])]
    assert copy[0]["id"] != chip["id"]  # a copy: each version owns its files
    text = client.get(f"/api/sessions/{sid}/attachments/{copy[0]['id']}").json()["text"]
    assert text == "name,score\nada,3\nbob,5\n"
    wait_pool_idle(client)


def test_text_code_csv_and_pdf_files_are_taken(client):
    sid = new_session(client)
    for name, data, media_type, text in [
        ("a.txt", "plain \u00e9t\u00e9\r\nline".encode(), "text/plain", "plain \u00e9t\u00e9\nline"),
        ("main.py", b"\xef\xbb\xbfprint('hi')\n", "text/x-code", "print('hi')\n"),
        ("t.csv", b"a,b\n1,2\n", "text/csv", "a,b\n1,2\n"),
        ("doc.pdf", text_pdf(["Page one here", "Page two"]), "application/pdf", "Page one here\n\nPage two"),
    ]:
        chip = attach(client, sid, name, data)
        assert chip["media_type"] == media_type
        assert client.get(f"/api/sessions/{sid}/attachments/{chip['id']}").json()["text"] == text
        client.delete(f"/api/sessions/{sid}/attachments/{chip['id']}")


@pytest.mark.parametrize(
    ("filename", "data", "status", "words"),
    [
        ("tool.exe", b"MZ\x90\x00", 415, "not a type that can be attached"),
        ("photo.png", b"\x89PNG\r\n\x1a\n", 415, "not a type that can be attached"),
        ("bin.txt", b"abc\x00def", 422, "binary"),
        ("latin.txt", "caf\u00e9".encode("latin-1"), 422, "not valid UTF-8"),
        ("fake.pdf", b"MZ this is no pdf", 422, "is not a PDF"),
        ("broken.pdf", b"%PDF-1.7\n1 0 obj << /Type", 422, "could not be read"),
        ("nested.pdf", nested_pdf(), 422, "could not be read"),
        ("empty.md", b"", 422, "empty"),
        ("", b"text", 400, "name the file"),
    ],
)
def test_files_that_cannot_be_taken_get_a_clear_error_and_nothing_is_stored(
    client, filename, data, status, words
):
    sid = new_session(client)
    assert words in error_of(upload(client, sid, filename, data), status)["message"]
    assert client.get(f"/api/sessions/{sid}/attachments").json()["attachments"] == []
    assert attach(client, sid, "after.md", b"# still up")["filename"] == "after.md"


def test_size_count_and_context_limits(tmp_path):
    with make_client(tmp_path, max_attachment_bytes=1000, max_attachment_chars=600) as small:
        sid = new_session(small)
        error = error_of(upload(small, sid, "big.txt", b"x" * 1001), 413)
        assert "over the limit of 1000 bytes (max_attachment_bytes)" in error["message"]
        error = error_of(upload(small, sid, "long.txt", b"y" * 700), 413)
        assert "700 characters of text, over the limit of 600 (max_attachment_chars)" in error["message"]
        assert small.get(f"/api/sessions/{sid}/attachments").json()["attachments"] == []


def test_no_more_files_than_the_limit_per_message(client):
    sid = new_session(client)
    ids = [attach(client, sid, f"f{i}.txt", b"hello")["id"] for i in range(3)]
    error = error_of(upload(client, sid, "f3.txt", b"hello"), 400)
    assert "max_attachments_per_message 3" in error["message"]
    other = new_session(client)
    foreign = attach(client, other, "other.txt", b"hello")["id"]
    response = client.post(f"/api/sessions/{sid}/messages", json={"content": "q", "attachments": [foreign]})
    assert f"attachment {foreign} is not an attachment of this session" in error_of(response, 400)["message"]
    response = client.post(f"/api/sessions/{sid}/messages", json={"content": "q", "attachments": "1"})
    assert error_of(response, 400)["param"] == "attachments"
    assert client.get(f"/api/sessions/{sid}/messages").json()["messages"] == []  # nothing was sent
    assert len(client.get(f"/api/sessions/{sid}/attachments").json()["attachments"]) == len(ids)


def test_another_owner_gets_404_and_other_sites_403(client):
    sid = new_session(client)
    chip = attach(client, sid, "mine.md", b"secret notes")
    stranger = TestClient(client.app, headers=SAME_ORIGIN)
    stranger.portal = client.portal
    assert upload(stranger, sid, "x.md", b"hi").status_code == 404
    assert stranger.get(f"/api/sessions/{sid}/attachments").status_code == 404
    assert stranger.get(f"/api/sessions/{sid}/attachments/{chip['id']}").status_code == 404
    assert stranger.delete(f"/api/sessions/{sid}/attachments/{chip['id']}").status_code == 404
    theirs = stranger.post("/api/sessions", json={}).json()["id"]
    assert stranger.get(f"/api/sessions/{theirs}/attachments/{chip['id']}").status_code == 404
    for response in (
        upload(client, sid, "x.md", b"hi", headers=EVIL),
        client.delete(f"/api/sessions/{sid}/attachments/{chip['id']}", headers=EVIL),
    ):
        assert error_of(response, 403)["code"] == "cross_origin_request"
    for simple in ("text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded"):
        # what a cross-site form may send without a preflight: refused even from the right origin
        response = upload(client, sid, "x.md", b"hi", headers={"content-type": simple})
        assert error_of(response, 415)["code"] == "unsupported_media_type"
    assert client.get(f"/api/sessions/{sid}/attachments/{chip['id']}").json()["text"] == "secret notes"
    assert len(client.get(f"/api/sessions/{sid}/attachments").json()["attachments"]) == 1


def test_files_count_against_the_owner_quota(tmp_path):
    with make_client(tmp_path, max_bytes_per_owner=2000) as quota:
        sid = new_session(quota)
        attach(quota, sid, "a.txt", b"a" * 1500)
        error = error_of(upload(quota, sid, "b.txt", b"b" * 600), 403)
        assert error["code"] == "quota_exceeded" and "(max_bytes_per_owner)" in error["message"]
        assert len(quota.get(f"/api/sessions/{sid}/attachments").json()["attachments"]) == 1


def test_deleting_the_session_deletes_its_files(client):
    sid = new_session(client)
    chip = attach(client, sid, "gone.md", b"bye")
    assert client.delete(f"/api/sessions/{sid}").status_code == 204
    assert client.get(f"/api/sessions/{sid}/attachments/{chip['id']}").status_code == 404


def test_the_export_holds_the_files(client):
    sid = new_session(client, title="With files")
    chip = attach(client, sid, "notes.md", b"# Notes\n```\ncode\n```\n")
    send(client, sid, "Summarize.", attachments=[chip["id"]])
    exported = client.get(f"/api/sessions/{sid}/export").json()
    files = exported["messages"][0]["attachments"]
    assert [(f["filename"], f["text"], f["tokens"]) for f in files] == [
        ("notes.md", "# Notes\n```\ncode\n```\n", chip["tokens"])
    ]
    markdown = client.get(f"/api/sessions/{sid}/export", params={"format": "md"}).text
    assert f"<details><summary>📎 notes.md · {chip['tokens']} tokens</summary>" in markdown
    assert "````text\n# Notes\n```\ncode\n```\n\n````" in markdown
    wait_pool_idle(client)


def test_the_plan_counts_the_files_named(client):
    sid = new_session(client)
    chip = attach(client, sid, "notes.md", NOTES.encode())
    bare = client.post(f"/api/sessions/{sid}/plan", json={"content": "Q?"}).json()
    planned = client.post(
        f"/api/sessions/{sid}/plan", json={"content": "Q?", "attachments": [chip["id"]]}
    ).json()
    assert abs(planned["prompt_tokens"] - bare["prompt_tokens"] - chip["tokens"]) <= 2, (planned, bare, chip)
    other = attach(client, new_session(client), "x.md", b"x")
    response = client.post(f"/api/sessions/{sid}/plan", json={"content": "Q?", "attachments": [other["id"]]})
    assert "not an attachment of this session" in error_of(response, 400)["message"]


def test_an_exchange_with_a_file_is_kept_when_the_user_chooses_so(client):
    sid = new_session(client)
    chip = attach(client, sid, "notes.md", NOTES.encode())
    send(client, sid, "What is item 3?", attachments=[chip["id"]])
    send(client, sid, "word " * 100)  # an exchange without files, about 110 tokens
    client.patch(f"/api/sessions/{sid}", json={"settings": {"temperature": 0, "max_tokens": 100}})
    refused = client.post(f"/api/sessions/{sid}/messages", json={"content": "And item 9?"})
    error = error_of(refused, 409)
    assert error["code"] == "context_full" and "keep_pinned" in error["context"]["options"]
    kept = send(client, sid, "And item 9?", truncate="keep_pinned")[-1]
    assert kept["message"]["truncated_turns"] == 1  # the plain exchange went, the file stayed
    usage = kept["usage"]
    assert usage["prompt_tokens"] > chip["tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= chip["tokens"] - 16  # still read from the cache
    wait_pool_idle(client)
