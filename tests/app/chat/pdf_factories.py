"""PDFs built byte by byte for the attachment tests: plain ones with text on each page, and hostile ones."""

from __future__ import annotations

import zlib


def make_pdf(objects: list[bytes], root: int = 1) -> bytes:
    """A PDF of these objects (object i+1 is objects[i]) with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, root, xref)
    return bytes(out)


def _stream(data: bytes, compress: bool = False) -> bytes:
    if compress:
        data = zlib.compress(data, 9)
        return b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(data) + data + b"\nendstream"
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def text_pdf(pages: list[str]) -> bytes:
    """A PDF whose pages show these lines of text (Helvetica, one line per page)."""
    num_pages = len(pages)
    first_page = 4  # 1 catalog, 2 pages, 3 font, then (page, content) pairs
    kids = b" ".join(b"%d 0 R" % (first_page + 2 * i) for i in range(num_pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, num_pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")
        content = b"BT /F1 12 Tf 72 720 Td (" + escaped + b") Tj ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents %d 0 R >>" % (first_page + 2 * i + 1)
        )
        objects.append(_stream(content))
    return make_pdf(objects)


def bomb_pdf(num_bytes: int = 300 * 1024 * 1024) -> bytes:
    """One page whose content stream inflates to `num_bytes` of spaces from a few hundred kilobytes."""
    packer = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    packed = b"".join(packer.compress(chunk) for _ in range(num_bytes >> 20)) + packer.flush()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream",
    ]
    return make_pdf(objects)


def many_pages_pdf(num_pages: int) -> bytes:
    """A page tree that names one page `num_pages` times (a few bytes a page)."""
    kids = b" ".join([b"3 0 R"] * num_pages)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, num_pages),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        _stream(b"BT ET"),
    ]
    return make_pdf(objects)


def nested_pdf(depth: int = 200_000) -> bytes:
    """A catalog holding an array nested `depth` deep (a parser that recurses per level runs out of stack)."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R /Deep " + b"[" * depth + b"]" * depth + b" >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        _stream(b"BT ET"),
    ]
    return make_pdf(objects)


def looping_pdf() -> bytes:
    """A page tree whose node names itself among its kids."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        _stream(b"BT ET"),
    ]
    return make_pdf(objects)


def slow_pdf(num_ops: int = 10_000_000) -> bytes:
    """One page of `num_ops` tiny text operators, compressed to a few hundred kilobytes: slow to parse."""
    packer = zlib.compressobj(9)
    chunk = b"(A) Tj " * (1 << 17)
    packed = b"".join(packer.compress(chunk) for _ in range(num_ops >> 17)) + packer.flush()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >> "
        b"/Contents 4 0 R >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed) + packed + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return make_pdf(objects)
