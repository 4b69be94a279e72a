"""Child process: the text of a PDF read from stdin, as JSON on stdout, under the limits its arguments give.

Run by app/chat/attachments.py as `python -I pdf_text.py MEMORY_BYTES CPU_SECONDS MAX_PAGES MAX_CHARS`; it sets its
own address-space and CPU limits before pypdf reads a byte, so a hostile file (a decompression bomb, deep nesting,
a page tree that loops) can take this process down, never the server. Self-contained: imports nothing of pagedchat.
Output: {"text": str, "pages": int} or {"error": str}.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import sys


def _limit(memory_bytes: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def extract(data: bytes, max_pages: int, max_chars: int) -> dict[str, object]:
    """The text of the PDF `data`, or an error naming the limit it passed."""
    from pypdf import PdfReader  # imported under the limits: its own import is part of what they cover

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        return {"error": "the PDF is encrypted: attach a copy without a password"}
    num_pages = len(reader.pages)
    if num_pages > max_pages:
        return {"error": f"the PDF has {num_pages} pages, over the limit of {max_pages} (pdf_max_pages)"}
    parts: list[str] = []
    num_chars = 0
    for number, page in enumerate(reader.pages, start=1):
        text = page.extract_text() or ""
        num_chars += len(text) + 2
        if num_chars > max_chars:
            return {
                "error": f"the PDF's text passes the limit of {max_chars} characters (max_attachment_chars) "
                f"by page {number}"
            }
        parts.append(text)
    return {"text": "\n\n".join(parts), "pages": num_pages}


def main(argv: list[str]) -> int:
    memory_bytes, cpu_s, max_pages, max_chars = (int(a) for a in argv[1:5])
    _limit(memory_bytes, cpu_s)
    logging.disable(logging.CRITICAL)  # pypdf warns about every broken object: the answer is the JSON alone
    data = sys.stdin.buffer.read()
    try:
        result = extract(data, max_pages, max_chars)
    except MemoryError:
        result = {"error": "reading the PDF took more memory than allowed (pdf_memory_bytes)"}
    except RecursionError:
        result = {"error": "the PDF is nested too deeply to read"}
    except Exception as exc:  # noqa: BLE001 - any parser failure is a file pagedchat cannot read
        result = {"error": f"the PDF could not be read ({type(exc).__name__}: {str(exc)[:200]})"}
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
