"""Files attached to a chat: which types are taken, their text (UTF-8 as written; a PDF's through pypdf in a child
process with time, memory and page limits), and the clear error a file that cannot be taken gets.

A file is judged by its name's extension (the browser's media type is only a hint, and often empty); a text file
must be valid UTF-8 without NUL bytes, a PDF must start like one. Errors: 413 past the size limit, 415 for a type
not taken, 422 for a file of a taken type that cannot be read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from app.http.errors import APIError
from app.settings import Settings

logger = logging.getLogger(__name__)

PDF_MEDIA_TYPE = "application/pdf"
# extension -> media type; code is plain text to the model
TEXT_TYPES = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".rst": "text/x-rst",
    ".csv": "text/csv",
    ".tsv": "text/tab-separated-values",
    ".json": "application/json",
    ".jsonl": "application/json",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".toml": "application/toml",
    ".ini": "text/plain",
    ".cfg": "text/plain",
    ".xml": "application/xml",
    ".html": "text/html",
    ".htm": "text/html",
    ".css": "text/css",
    ".tex": "text/x-tex",
}
CODE_EXTENSIONS = [
    ".py",
    ".pyi",
    ".js",
    ".mjs",
    ".cjs",
    ".ts",
    ".tsx",
    ".jsx",
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".hh",
    ".cu",
    ".rs",
    ".go",
    ".java",
    ".kt",
    ".kts",
    ".scala",
    ".rb",
    ".php",
    ".sh",
    ".bash",
    ".zsh",
    ".fish",
    ".ps1",
    ".sql",
    ".swift",
    ".m",
    ".mm",
    ".cs",
    ".fs",
    ".lua",
    ".r",
    ".jl",
    ".pl",
    ".pm",
    ".hs",
    ".ml",
    ".ex",
    ".exs",
    ".erl",
    ".clj",
    ".dart",
    ".vue",
    ".svelte",
    ".proto",
    ".graphql",
    ".tf",
    ".nix",
    ".zig",
    ".v",
    ".sv",
    ".vhd",
    ".asm",
    ".s",
    ".cmake",
    ".mk",
    ".gradle",
    ".bat",
]
TEXT_TYPES |= {ext: "text/x-code" for ext in CODE_EXTENSIONS}
# names without an extension that are text by convention
TEXT_NAMES = {"makefile", "dockerfile", "readme", "license", "changelog", "gemfile", "rakefile", "procfile"}
MAX_FILENAME_CHARS = 255
PDF_HEADER_WINDOW = 1024  # where a PDF's `%PDF-` must appear (readers accept some leading junk)
_PDF_SCRIPT = Path(__file__).with_name("pdf_text.py")


@dataclass(frozen=True)
class ExtractedFile:
    """An uploaded file's name, media type, size and the text a prompt will carry."""

    filename: str
    media_type: str
    num_bytes: int
    text: str


def clean_filename(value: str | None) -> str:
    """The file's own name: the last part of a path, control characters dropped; 400 when none is left."""
    name = (value or "").replace("\\", "/")
    name = PurePosixPath(name).name if name else ""
    name = "".join(c for c in name if unicodedata.category(c)[0] != "C").strip()
    if not name:
        raise APIError(
            400, "name the file: ?filename=NAME (its extension decides its type)", param="filename"
        )
    if len(name) > MAX_FILENAME_CHARS:
        stem, dot, ext = name.rpartition(".")
        name = (stem[: MAX_FILENAME_CHARS - len(ext) - 1] + dot + ext) if dot and len(ext) < 20 else name
        name = name[:MAX_FILENAME_CHARS]
    return name


def media_type_of(filename: str) -> str:
    """The media type a file is taken as, by its name; 415 for a type pagedchat does not read."""
    lower = filename.lower()
    suffix = PurePosixPath(lower).suffix
    if suffix == ".pdf":
        return PDF_MEDIA_TYPE
    if suffix in TEXT_TYPES:
        return TEXT_TYPES[suffix]
    if not suffix and lower in TEXT_NAMES:
        return "text/plain"
    raise APIError(
        415,
        f"{filename!r} is not a type that can be attached: attach text, Markdown, code, CSV or PDF files "
        "(.txt, .md, .csv, .py, .js, .json, .pdf, ...)",
        param="filename",
        code="unsupported_media_type",
    )


def decode_text(filename: str, data: bytes) -> str:
    """A text file's content: UTF-8 (a BOM dropped, line ends made \\n); 422 for binary or other encodings."""
    if b"\x00" in data:
        raise _unreadable(f"{filename!r} holds NUL bytes: it looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _unreadable(
            f"{filename!r} is not valid UTF-8 (byte {exc.start}): save it as UTF-8 text and attach it again"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _unreadable(message: str) -> APIError:
    return APIError(422, message, param="file", code="unreadable_file")


class AttachmentReader:
    """Turns uploaded bytes into text under the settings' limits; at most `max_pdf_workers` PDFs read at once."""

    def __init__(self, settings: Settings, max_pdf_workers: int = 2) -> None:
        self.settings = settings
        self._pdf_slots = asyncio.Semaphore(max_pdf_workers)

    def check_size(self, num_bytes: int) -> None:
        """413 past max_attachment_bytes."""
        limit = self.settings.max_attachment_bytes
        if num_bytes > limit:
            raise APIError(
                413,
                f"the file is {num_bytes} bytes, over the limit of {limit} bytes (max_attachment_bytes)",
                code="request_too_large",
            )

    async def read(self, filename: str, data: bytes) -> ExtractedFile:
        """The file's text; 413/415/422 with a message saying why it cannot be attached."""
        filename = clean_filename(filename)
        media_type = media_type_of(filename)
        self.check_size(len(data))
        if not data:
            raise _unreadable(f"{filename!r} is empty")
        text = (
            await self._pdf_text(filename, data)
            if media_type == PDF_MEDIA_TYPE
            else decode_text(filename, data)
        )
        text = text.replace("\x00", "")
        limit = self.settings.max_attachment_chars
        if len(text) > limit:
            raise APIError(
                413,
                f"{filename!r} holds {len(text)} characters of text, over the limit of {limit} "
                "(max_attachment_chars)",
                code="request_too_large",
            )
        if not text.strip():
            raise _unreadable(
                f"{filename!r} holds no text" + (" (a scanned PDF?)" if media_type == PDF_MEDIA_TYPE else "")
            )
        return ExtractedFile(filename, media_type, len(data), text)

    async def _pdf_text(self, filename: str, data: bytes) -> str:
        if b"%PDF-" not in data[:PDF_HEADER_WINDOW]:
            raise _unreadable(f"{filename!r} is not a PDF: it does not start with %PDF-")
        s = self.settings
        timeout = s.pdf_timeout_s
        args = [
            str(s.pdf_memory_bytes),
            str(int(timeout) + 1),
            str(s.pdf_max_pages),
            str(s.max_attachment_chars),
        ]
        async with self._pdf_slots:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(_PDF_SCRIPT),
                *args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(data), timeout)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
                logger.warning("reading PDF %r took over %.1f s: its process was killed", filename, timeout)
                raise _unreadable(
                    f"reading {filename!r} took longer than {timeout:g} s (pdf_timeout_s): it was stopped"
                ) from None
            finally:
                if proc.returncode is None:  # the request was cancelled: the child goes too
                    proc.kill()
                    await proc.wait()
        try:
            result = json.loads(out)
        except ValueError:
            logger.warning(
                "the PDF reader for %r ended with status %s and no answer", filename, proc.returncode
            )
            raise _unreadable(
                f"reading {filename!r} went past the PDF reader's limits (memory or time) and was stopped"
            ) from None
        if "error" in result:
            raise _unreadable(f"{filename!r}: {result['error']}")
        return str(result["text"])
