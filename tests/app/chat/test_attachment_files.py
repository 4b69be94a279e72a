"""Reading attached files: the types taken, their text, and hostile PDFs that the limited child process turns into
clear errors in bounded time (a decompression bomb, deep nesting, a looping or huge page tree, a parse that runs
past its time, one that runs out of memory)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from app.chat.attachments import AttachmentReader, clean_filename, media_type_of
from app.chat.documents import document_block, prompt_content
from app.http.errors import APIError
from app.settings import Settings
from tests.app.chat.pdf_factories import (
    bomb_pdf,
    looping_pdf,
    many_pages_pdf,
    nested_pdf,
    slow_pdf,
    text_pdf,
)

SETTINGS = Settings(pdf_timeout_s=10.0, pdf_max_pages=50)


def read(filename: str, data: bytes, **overrides):
    reader = AttachmentReader(dataclasses.replace(SETTINGS, **overrides))
    return asyncio.run(reader.read(filename, data))


def refused(filename: str, data: bytes, **overrides) -> APIError:
    with pytest.raises(APIError) as caught:
        read(filename, data, **overrides)
    return caught.value


def test_a_pdf_gives_the_text_of_its_pages():
    extracted = read("report.pdf", text_pdf(["Quarterly report", "Revenue grew (a lot)"]))
    assert (extracted.media_type, extracted.text) == (
        "application/pdf",
        "Quarterly report\n\nRevenue grew (a lot)",
    )


def test_names_decide_the_type_and_lose_their_path():
    assert clean_filename("C:\\Users\\me\\notes.md") == "notes.md"
    assert clean_filename("../../etc/passwd\n") == "passwd"
    assert [media_type_of(n) for n in ("a.MD", "Makefile", "x.tsx", "t.csv")] == [
        "text/markdown",
        "text/plain",
        "text/x-code",
        "text/csv",
    ]
    assert refused("archive.zip", b"PK\x03\x04").status == 415


def test_the_blocks_come_first_in_the_order_given_with_the_name_escaped():
    @dataclasses.dataclass
    class Doc:
        filename: str
        text: str

    docs = [Doc('a "b".md', "one"), Doc("c<d>.txt", "two")]
    assert prompt_content(docs, "Why?") == (
        '<document name="a &quot;b&quot;.md">\none\n</document>\n\n'
        '<document name="c&lt;d&gt;.txt">\ntwo\n</document>\n\nWhy?'
    )
    assert prompt_content([], "Why?") == "Why?" and document_block("x", "y").endswith("</document>\n\n")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: nested_pdf(), "could not be read"),
        (lambda: looping_pdf(), "cyclic"),
        (lambda: many_pages_pdf(20_000), "20000 pages, over the limit of 50 (pdf_max_pages)"),
        (lambda: b"%PDF-1.7\n" + bytes(range(256)) * 40, "could not be read"),
        (lambda: b"GIF89a not a pdf", "is not a PDF"),
    ],
)
def test_hostile_pdfs_get_a_clear_error(make, words):
    error = refused("hostile.pdf", make())
    assert (error.status, error.code) == (422, "unreadable_file")
    assert words in error.message


def test_a_decompression_bomb_is_stopped_by_the_parser_limit():
    started = time.monotonic()
    error = refused("bomb.pdf", bomb_pdf(100 * 1024 * 1024))  # 100 MiB of spaces from ~100 kB
    assert error.status == 422 and "holds no text" in error.message
    assert time.monotonic() - started < 5


def test_a_parse_past_its_time_is_killed():
    started = time.monotonic()
    error = refused("slow.pdf", slow_pdf(), pdf_timeout_s=1.0, max_attachment_chars=10**9)
    assert "took longer than 1 s (pdf_timeout_s): it was stopped" in error.message
    assert time.monotonic() - started < 3


def test_a_parse_past_its_memory_is_stopped():
    error = refused("big.pdf", slow_pdf(), pdf_memory_bytes=200 * 1024 * 1024, max_attachment_chars=10**9)
    assert error.status == 422 and "pdf_memory_bytes" in error.message


def test_text_past_the_character_limit_is_refused():
    error = refused("long.pdf", text_pdf(["x" * 80, "y" * 80]), max_attachment_chars=100)
    assert error.status == 422 and "limit of 100 characters (max_attachment_chars) by page 2" in error.message
