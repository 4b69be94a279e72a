"""The fenced shell blocks of README.md and docs/, with the marker on the line before each (tests/docs/)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
RUNNABLE = "<!-- runnable -->"
NOT_RUNNABLE = re.compile(r"<!-- not-runnable: \S.* -->")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class ShellBlock:
    """One fenced shell block: where it is, the line before it, and its text."""

    path: Path
    line: int  # of the opening fence, from 1
    marker: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.marker == RUNNABLE

    @property
    def marked(self) -> bool:
        return self.runnable or NOT_RUNNABLE.fullmatch(self.marker) is not None


def markdown_files() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def shell_blocks(path: Path) -> list[ShellBlock]:
    """The shell blocks of one Markdown file, fences of any language tracked so that a fence inside one is text."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        indent, fence, language = opened.groups()
        end = next(
            (
                j
                for j in range(i + 1, len(lines))
                if lines[j].strip() == fence and lines[j].startswith(indent)
            ),
            len(lines),
        )
        if language.lower() in SHELL_LANGUAGES:
            marker = lines[i - 1].strip() if i else ""
            body = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end])
            blocks.append(ShellBlock(path, i + 1, marker, body))
        i = end + 1
    return blocks


def all_shell_blocks() -> list[ShellBlock]:
    """Every shell block of README.md and docs/."""
    return [block for path in markdown_files() for block in shell_blocks(path)]
