"""Nothing about a flag is written by hand in two places: a page's table of settings is an options block that the
build generates from the declarations (and fails on when stale), and prose links to the reference instead of
restating a default (issue 42, item 3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.core.options import Option, size_text
from tests.docs.markdown_blocks import REPO_ROOT, markdown_files
from tests.docs.test_site import load_build_docs

build_docs = load_build_docs()
KNOWN = build_docs.documented_options()


def page_with_block(tmp_path: Path, names: str, body: str = "") -> Path:
    """docs/operators/page.md under tmp_path, holding one options block naming `names`."""
    page = tmp_path / "docs" / "operators" / "page.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        f"# Page\n\nSome prose.\n\n<!-- options: {names} -->\n{body}<!-- /options -->\n\nMore prose.\n"
    )
    return page


@pytest.fixture
def tmp_docs(tmp_path, monkeypatch):
    """build_docs pointed at an empty docs/ under tmp_path."""
    monkeypatch.setattr(build_docs, "ROOT", tmp_path)
    monkeypatch.setattr(build_docs, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(
        build_docs, "REFERENCE", tmp_path / "docs" / "operators" / "configuration-reference.md"
    )
    return tmp_path


# --- options blocks ---------------------------------------------------------------------------------------------


def test_the_committed_blocks_are_current():
    assert build_docs.check_blocks() == [], "run: python scripts/build_docs.py --write"


def test_the_pages_use_options_blocks():
    """The task pages that used to restate defaults in hand-written tables hold generated ones."""
    pages = [page for page in build_docs.block_pages() if "<!-- options: " in page.read_text()]
    assert len(pages) >= 4, pages


def test_write_fills_a_block_and_links_each_flag_to_its_reference_row(tmp_docs):
    page = page_with_block(tmp_docs, "max-num-seqs, prefix-caching")
    assert build_docs.update_blocks(page, write=True) == []
    text = page.read_text()
    assert (
        "[`--max-num-seqs`](configuration-reference.md#max-num-seqs) | `PAGEDCHAT_MAX_NUM_SEQS` | `256` |"
        in text
    )
    assert "[`--prefix-caching`, `--no-prefix-caching`](configuration-reference.md#prefix-caching)" in text
    assert text.startswith("# Page\n\nSome prose.\n\n<!-- options: ") and text.endswith("More prose.\n")
    assert build_docs.update_blocks(page) == []  # written: current


def test_a_stale_block_fails_naming_the_page_and_the_option(tmp_docs):
    page = page_with_block(tmp_docs, "max-num-seqs, block-size")
    build_docs.update_blocks(page, write=True)
    page.write_text(page.read_text().replace("| `256` |", "| `128` |"))  # a default changed since
    problems = build_docs.update_blocks(page)
    assert len(problems) == 1, problems
    assert problems[0].startswith("docs/operators/page.md:5: ")
    assert "--max-num-seqs" in problems[0] and "--block-size" not in problems[0]
    assert "--write" in problems[0]
    assert build_docs.update_blocks(page, write=True) == []
    assert "| `256` |" in page.read_text()


def test_an_empty_block_is_stale(tmp_docs):
    page = page_with_block(tmp_docs, "seed")
    assert "--seed" in " ".join(build_docs.update_blocks(page))


def test_text_added_inside_a_block_is_stale(tmp_docs):
    page = page_with_block(tmp_docs, "seed")
    build_docs.update_blocks(page, write=True)
    page.write_text(page.read_text().replace("<!-- /options -->", "hand-written\n<!-- /options -->"))
    assert "not the generated table" in " ".join(build_docs.update_blocks(page))


def test_an_unknown_option_fails(tmp_docs):
    page = page_with_block(tmp_docs, "max-num-seqs, no-such-option")
    problems = build_docs.update_blocks(page, write=True)
    assert problems == [
        "docs/operators/page.md:5: no option is called 'no-such-option' (an options block names flags without "
        "their dashes, as the reference's anchors: kv-cache-bytes)"
    ]
    assert "no-such-option -->\n<!-- /options -->" in page.read_text()  # left as it was


@pytest.mark.parametrize("name", ["--max-num-seqs", "PAGEDCHAT_MAX_NUM_SEQS", "max_num_seqs"])
def test_an_option_is_named_by_its_flag_without_dashes(tmp_docs, name):
    assert "no option is called" in " ".join(build_docs.update_blocks(page_with_block(tmp_docs, name)))


def test_a_marker_in_fenced_code_is_an_example(tmp_docs):
    page = tmp_docs / "docs" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Page\n\n```text\n<!-- options: seed -->\n<!-- /options -->\n```\n")
    assert build_docs.update_blocks(page, write=True) == []
    assert page.read_text().endswith("```text\n<!-- options: seed -->\n<!-- /options -->\n```\n")


def test_an_unclosed_block_fails(tmp_docs):
    page = tmp_docs / "docs" / "page.md"
    page.parent.mkdir(parents=True)
    page.write_text("# Page\n\n<!-- options: seed -->\n\ntext\n")
    assert build_docs.update_blocks(page, write=True) == [
        "docs/page.md: line 3: an options block without its <!-- /options -->"
    ]


def test_the_build_fails_on_a_stale_block_before_zensical_runs(tmp_docs, monkeypatch):
    page_with_block(tmp_docs, "seed", body="\n| stale |\n\n")
    monkeypatch.setattr(build_docs, "check_pages", lambda: [])
    monkeypatch.setattr(build_docs.subprocess, "run", lambda *a, **k: pytest.fail("zensical ran"))
    with pytest.raises(SystemExit) as failed:
        build_docs.build()
    assert "docs/operators/page.md:5: the options block is stale for --seed" in str(failed.value)


def test_reference_anchors_are_the_block_names():
    reference = build_docs.reference_markdown()
    for name, opt in KNOWN.items():
        assert f"`{opt.flag}`{{#{name}}}" in reference, name


def test_every_link_to_the_reference_names_an_option():
    bad = []
    for page in markdown_files():
        for anchor in re.findall(r"configuration-reference\.md#([\w-]+)", page.read_text()):
            if anchor not in KNOWN:
                bad.append(f"{page.relative_to(REPO_ROOT)}: #{anchor}")
    assert not bad, bad


# --- defaults restated by hand ----------------------------------------------------------------------------------

_CODE = re.compile(r"`([^`]+)`")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
# what may follow a value in a cell or a parenthesis: its unit, then the end of the statement
_UNIT = (
    r"(?:\s*(?:s|ms|seconds?|MiB|GiB|KiB|MB|GB|minutes?|hours?|days?|characters[\w ]*|sequences|requests))?"
)


def default_forms(opt: Option) -> list[str]:
    """How a page would write the option's default: `256`, `1,000`, `600 s`, `1 GiB`, `on`; none for a default
    that is unset or empty (its meaning is in the help, not a value)."""
    default = opt.field.default
    if default in (None, "", ()):
        return []
    if isinstance(default, bool):
        return ["on" if default else "off"]
    forms = {str(default)}
    if opt.is_size:
        text = size_text(default)
        forms |= {text, re.sub(r"(\d)([KMGT]i?B)$", r"\1 \2", text)}
    elif isinstance(default, float) and default == int(default):
        forms.add(str(int(default)))
    elif isinstance(default, int) and not isinstance(default, bool) and default >= 1000:
        forms.add(f"{default:,}")
    return sorted(forms, key=len, reverse=True)


def _by_name() -> dict[str, Option]:
    names = {}
    for opt in KNOWN.values():
        names[opt.flag] = names[opt.env_var] = opt
        if opt.kind is bool:
            names["--no-" + opt.flag.removeprefix("--")] = opt
    return names


NAMES = _by_name()


def mentions(text: str) -> list[tuple[Option, int, str | None]]:
    """The options a piece of text names in a code span: (option, where the span ends, the value written with it:
    `--auth none`, `PAGEDCHAT_AUTH=none`; None for the name alone)."""
    found = []
    for span in _CODE.finditer(text):
        inner = span[1].strip()
        if inner in NAMES:
            found.append((NAMES[inner], span.end(), None))
        elif (parts := re.fullmatch(r"(--[\w-]+) (\S+)|(PAGEDCHAT_\w+)=(\S+)", inner)) is not None:
            name, value = (parts[1], parts[2]) if parts[1] else (parts[3], parts[4])
            if name in NAMES:
                found.append((NAMES[name], span.end(), value))
    return found


def _value(form: str) -> str:
    """A regex for the default written as a value: in code or not, not the start of a longer number or word."""
    return rf"`?{re.escape(form)}`?(?![\w]|[.,]\d)"


def restatements(text: str) -> list[str]:
    """`--flag=default` for each option that `text` (one table row, or one paragraph) names and whose default it
    states right beside the name: `PAGEDCHAT_X` (8), `--x`, 600 s), (default 256), `--auth none`, the default; in a
    table row, a cell (or a part of one between slashes, or a parenthesis) that is the default."""
    found = []
    row = text.lstrip().startswith("|")
    for opt, end, value in mentions(text):
        for form in default_forms(opt):
            boolean = isinstance(opt.field.default, bool)
            after = r"\s*\)" if boolean else _UNIT + r"\s*(?:[);,:/|]|$|\s(?:by default|beyond|\())"
            value_re = _value(form) + after
            patterns = [
                # right after the name: `X` (8), `X` (600 s), (`X`, 10 s), `X` (default 256)
                r"^\s*[(,]\s*(?:(?:the\s+)?default(?:\s+is|:)?\s+)?" + value_re,
            ]
            hits = any(re.search(p, text[end:]) for p in patterns)
            # in the same sentence: "the default is 512", "512 (the default)", "on by default", `--auth none`, the default
            sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`\[])", text)
            for part in sentence:
                if not any(m[0] is opt for m in mentions(part)):
                    continue
                word = re.escape(form)
                if re.search(
                    rf"\bdefaults?(?:\s+is|\s+to|:)?\s+`?{word}`?(?![\w]|[.,]\d)", part
                ) or re.search(rf"(?<![\w.]){word}`?{_UNIT}\s*[(,]\s*(?:the\s+)?default\b", part):
                    hits = True
                if re.search(rf"(?<![\w.]){word}`?{_UNIT} by default", part):
                    hits = True
            if value is not None and value == form:
                rest = text[end:]
                hits = hits or re.match(r"\s*[(,]\s*(?:the\s+)?default\b", rest) is not None
            if row and not hits:
                cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", text)[1:-1]]
                for cell in cells:
                    if any(m[0] is opt for m in mentions(cell)):
                        continue  # the name's own cell: `--x` / `PAGEDCHAT_X`
                    starts = [part.strip() for part in cell.split(" / ")]
                    if boolean:
                        if any(re.match(rf"`?{form}`?\s*(?:$|[:;,(])", part) for part in starts):
                            hits = True
                    elif any(re.match(value_re, part) for part in starts) or re.search(
                        r"\(\s*" + value_re, cell
                    ):
                        hits = True
            if hits:
                found.append(f"{opt.flag}={form}")
                break
    return list(dict.fromkeys(found))  # a row may name the option twice: its flag and its variable


def prose_units(page: Path) -> list[tuple[int, str]]:
    """The page's table rows and paragraphs (lines joined), each with its first line's number, leaving out fenced
    code, options blocks and HTML comments."""
    units: list[tuple[int, str]] = []
    paragraph: list[str] = []
    start = 0
    fence = None
    in_block = False

    def close() -> None:
        if paragraph:
            units.append((start, " ".join(paragraph)))
            paragraph.clear()

    for number, line in enumerate(page.read_text().splitlines(), 1):
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        if (opened := _FENCE.match(line)) is not None:
            close()
            fence = opened[1]
            continue
        if build_docs.BLOCK_OPEN.match(line):
            close()
            in_block = True
            continue
        if line.strip() == build_docs.BLOCK_CLOSE:
            in_block = False
            continue
        if in_block:
            continue
        if not line.strip() or line.lstrip().startswith("<!--"):
            close()
        elif line.lstrip().startswith("|"):
            close()
            units.append((number, line))
        else:
            if not paragraph:
                start = number
            paragraph.append(line.strip())
    close()
    return units


def hand_pages() -> list[Path]:
    """README.md and every docs page but the generated reference."""
    return [page for page in markdown_files() if page != build_docs.REFERENCE]


def test_no_page_restates_a_default_beside_its_flag():
    found = [
        f"{page.relative_to(REPO_ROOT)}:{number}: {', '.join(hits)}"
        for page in hand_pages()
        for number, text in prose_units(page)
        if (hits := restatements(text))
    ]
    assert not found, (
        "a setting's default written by hand beside its name: link to its row of the reference "
        "([`--x`](…/configuration-reference.md#x)) or use an options block instead\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("At most `PAGEDCHAT_MAX_QUEUED_PASSWORD_CHECKS` (8) checks wait.", "--max-queued-password-checks=8"),
        ("For `PAGEDCHAT_REQUEST_TIMEOUT_S` (600 s): the request was aborted.", "--request-timeout-s=600"),
        ("is lost (`--flush-interval-s`, 0.5 s).", "--flush-interval-s=0.5"),
        ("`--max-num-seqs` (default 256) sequences", "--max-num-seqs=256"),
        ("`PAGEDCHAT_MAX_SESSIONS_PER_OWNER` (1,000), and more", "--max-sessions-per-owner=1,000"),
        ("past `PAGEDCHAT_PDF_MEMORY_BYTES` (1 GiB), or", "--pdf-memory-bytes=1 GiB"),
        ("Isolation (`PAGEDCHAT_PREFIX_CACHE_ISOLATION`, on by default).", "--prefix-cache-isolation=on"),
        ("`PAGEDCHAT_LOG_LEVEL=warning` drops the access log; the default is `info`.", "--log-level=info"),
        ("Without accounts (`--auth none`, the default) that cookie is the user.", "--auth=none"),
        (
            "| `--max-num-seqs` / `PAGEDCHAT_MAX_NUM_SEQS` | 256 | sequences running at once |",
            "--max-num-seqs=256",
        ),
        (
            "| `--invite-hours` / `PAGEDCHAT_INVITE_HOURS` | how long an invite link works (72) |",
            "--invite-hours=72",
        ),
        ("| prefix caching | `--no-prefix-caching` | on |", "--prefix-caching=on"),
        (
            "| `--kv-cache-dtype` | `auto` (`float16` with the GGUF kernels) | the dtype |",
            "--kv-cache-dtype=auto",
        ),
        (
            "| a, b | `PAGEDCHAT_MAX_MESSAGES`, `PAGEDCHAT_MAX_MESSAGE_CHARS` | 512 / 200,000 | 400 |",
            "--max-messages=512",
        ),
        (
            "| `PAGEDCHAT_MAX_DATABASE_BYTES` | 2 GiB (default), more for a busy team | why |",
            "--max-database-bytes=2 GiB",
        ),
    ],
)
def test_a_restated_default_is_found(text, expected):
    assert expected in restatements(text)


@pytest.mark.parametrize(
    "text",
    [
        "Raise `PAGEDCHAT_MAX_NUM_SEQS` to 512 when the pool holds them.",  # a suggestion, not the default
        "`.venv/bin/pagedchat serve --replicas 2 --threads-per-replica 1`",  # a command line
        "With `--max-num-seqs` at 16, the step takes 20 ms.",
        "| `PAGEDCHAT_CLIENT_REQUESTS_PER_MINUTE` | 60 and 4 | a public deployment should set them |",
        "| `--client-max-connections` | counted per TCP peer, which is the proxy: raise it, or 0 |",
        "[`PAGEDCHAT_MAX_QUEUED_PASSWORD_CHECKS`](configuration-reference.md#max-queued-password-checks) checks wait",
        "`--cookie-secure` marks the cookie Secure; on a public name, turn it on.",
        "`--quantization auto` picks `gguf` for a GGUF file.",
    ],
)
def test_a_mention_without_its_default_is_not_a_restatement(text):
    assert restatements(text) == []
