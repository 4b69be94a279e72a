"""Where attached files go in a prompt: at a fixed place, before the question of the user turn that carries them.

A user turn's prompt content is each file as a `<document name="…">` block, in the order attached, then the
question. The blocks come first and never change, so every later turn of the chat extends a prompt that starts with
them: their KV blocks are reused from the prefix cache (and from the disk tier after a restart).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class DocumentLike(Protocol):
    """What a document block shows of a file (app.db.AttachmentRecord has it)."""

    @property
    def filename(self) -> str: ...
    @property
    def text(self) -> str: ...


def document_block(filename: str, text: str) -> str:
    """One file as the prompt carries it."""
    name = filename.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<document name="{name}">\n{text}\n</document>\n\n'


def prompt_content(documents: Sequence[DocumentLike], question: str) -> str:
    """A user turn's content as the model reads it: its files' blocks, then the question (the page shows only the
    question, with a chip per file)."""
    return "".join(document_block(d.filename, d.text) for d in documents) + question
