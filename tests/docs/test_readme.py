"""The README fits on a few screens, keeps the two commands, and its links into the docs resolve."""

from __future__ import annotations

import re

from tests.docs.markdown_blocks import REPO_ROOT, shell_blocks

README = REPO_ROOT / "README.md"
MAX_LINES = 200
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(page_text: str) -> set[str]:
    """The anchors the site gives a page's headings (lower case, words joined by '-', punctuation dropped)."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", page_text, flags=re.M):
        text = re.sub(r"[`*_]", "", heading).lower()
        anchors.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text)).strip("-"))
    return anchors


def test_the_readme_is_at_most_200_lines():
    num_lines = len(README.read_text().splitlines())
    assert num_lines <= MAX_LINES, (
        f"README.md has {num_lines} lines; move the detail into docs/ (at most {MAX_LINES})"
    )


def test_the_readme_shows_the_two_commands_and_the_ci_command():
    texts = [block.text for block in shell_blocks(README)]
    assert any("make serve" in text and "make test" in text for text in texts), texts
    assert (REPO_ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")


def test_the_readme_links_resolve():
    broken = []
    links = _LINK.findall(README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert sum(link.startswith("docs/") for link in local) >= 20, local
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO_ROOT / path if path else README
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target.read_text()):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, "README.md links that do not resolve:\n" + "\n".join(broken)


def test_the_anchor_rule_matches_the_sites():
    assert heading_anchors("## GPU: one NVIDIA H200\n### `pagedchat chat` here\n") == {
        "gpu-one-nvidia-h200",
        "pagedchat-chat-here",
    }


def section_table_rows(text: str, heading: str) -> list[str]:
    """The table rows of one `## heading` section."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_the_readme_at_a_glance_is_the_performance_pages():
    """The README's figures are the performance page's, row for row: a new result updates both or the test fails."""
    readme = section_table_rows(README.read_text(), "At a glance")
    performance = section_table_rows(
        (REPO_ROOT / "docs" / "performance" / "index.md").read_text(), "At a glance"
    )
    assert len(readme) >= 10
    assert readme == performance
