"""Build the documentation site (`make docs`): the generated pages first, then every page checked, then Zensical in
strict mode (a broken link or anchor fails the build) into build/site.

The configuration reference (docs/operators/configuration-reference.md, not in git) is written here from the settings'
own declarations (`option(...)` fields, engine/core/options.py): one table per layer, every flag with its PAGEDCHAT_*
variable, default and help, each row with an anchor named after the flag (`#kv-cache-bytes`). A page that wants a
table of the few settings of its task marks it, and the same rows are generated there, committed with the page:

    <!-- options: max-model-len, kv-cache-bytes -->
    (generated: leave empty, then run --write)
    <!-- /options -->

The build fails when such a block differs from what the declarations give (a default or help changed, an option
renamed), naming the page and the option; `--write` rewrites the blocks. Nothing about a flag is written by hand
anywhere else: prose links to the option's row of the reference (tests/docs/test_option_blocks.py).

    python scripts/build_docs.py            # generate, check, build
    python scripts/build_docs.py --write    # rewrite the pages' options blocks first, then build
    python scripts/build_docs.py --generate # only write the generated pages
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: the repository's packages come from the checkout
    sys.path.insert(0, str(ROOT))

from engine.core.options import ENV_PREFIX, GROUPS, SIZE_EXAMPLES, Option, options, shown_default  # noqa: E402

DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
REFERENCE = DOCS / "operators" / "configuration-reference.md"
# every dataclass that declares option() fields, one table each: (import path, class, the layer's title and the
# line under it); tests/docs/test_configuration_reference.py fails when a class that uses option() is not listed
LAYERS = (
    (
        "app.settings",
        "Settings",
        "The service (`app/settings.py`)",
        "`pagedchat serve` only: where it listens, who may use it, limits, storage.",
    ),
    (
        "engine.core.config",
        "EngineConfig",
        "The engine (`engine/core/config.py`)",
        "`pagedchat serve`, and `pagedchat generate`, `chat` and `bench`, which take the same engine flags.",
    ),
)


def layer_classes() -> list[tuple[type, str, str]]:
    """The config classes of LAYERS, imported, with their titles."""
    import importlib

    return [
        (getattr(importlib.import_module(module), name), title, line) for module, name, title, line in LAYERS
    ]


def _cell(text: str) -> str:
    """Text for one Markdown table cell: lines joined, pipes escaped, and outside `code` the characters Markdown
    would read as HTML or emphasis (`<cache dir>` is text, not a tag)."""
    parts = " ".join(str(text).split()).split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = (
            parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
        )
        parts[i] = parts[i].replace("_", "\\_")
    return "`".join(parts).replace("|", "\\|")


def default_text(opt: Option) -> str:
    """The default as `--help` and the variable take it: on/off, a size with its unit, unset."""
    if opt.kind is tuple:
        default = opt.field.default
        return ", ".join(f"`{v}`" for v in default) if default else "none"
    shown = shown_default(opt)
    if shown is None:
        return "unset"
    return shown if opt.kind is bool else f"`{shown}`"


def flag_text(opt: Option) -> str:
    """The flag as typed: `--x` / `--no-x` for a switch, `--x VALUE` (repeatable) otherwise."""
    if opt.kind is bool:
        return f"`{opt.flag}`, `--no-{opt.flag.removeprefix('--')}`"
    return f"`{opt.flag}`"


def anchor(opt: Option) -> str:
    """The id of the option's row in the reference, and its name in an options block: the flag without its dashes
    (`kv-cache-bytes`; a switch by its positive flag)."""
    return opt.flag.removeprefix("--")


def help_text(opt: Option) -> str:
    """The declared help, with the choices and the value's form that `--help` adds."""
    notes = []
    if opt.choices is not None:
        notes.append("one of " + ", ".join(f"`{c}`" for c in opt.choices))
    if opt.is_size:
        notes.append(f"a size: {', '.join(f'`{form}`' for form in SIZE_EXAMPLES)} or bytes")
    if opt.kind is tuple:
        notes.append("repeat the flag; the variable takes commas")
    return opt.help + (f" ({'; '.join(notes)})" if notes else "")


def reference_markdown() -> str:
    """The whole reference page."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by scripts/build_docs.py from the option() declarations: do not edit -->",
        "",
        "Every setting is a flag of `pagedchat serve` and a `PAGEDCHAT_*` environment variable, both derived from one "
        "field of the classes below (`option(default, help, …)`; `engine/core/options.py`). A flag given wins over "
        "the variable. Switches take `1/0`, `true/false`, `yes/no` or `on/off` in the environment; a setting whose "
        "default is *unset* takes `auto` (or an empty value) to mean unset. `pagedchat serve --help` prints the same "
        "list in these groups:",
        "",
    ]
    out += [f"- **{name}**: {text}" for name, text in GROUPS.items()]
    for cls, title, line in layer_classes():
        found = [opt for opt in options(cls) if opt.help and opt.group]
        out += ["", f"## {title}", "", line, ""]
        out += option_table(
            found, lambda opt: f"`{opt.flag}`{{#{anchor(opt)}}}" + flag_text(opt)[len(opt.flag) + 2 :]
        )
    out += [
        "",
        f"`{ENV_PREFIX}API_KEY` (one key) is read as well as `{ENV_PREFIX}API_KEYS`.",
        "",
    ]
    return "\n".join(out)


def option_table(found: list[Option], flag_cell: Any, group: bool = True) -> list[str]:
    """The table of these options, one row each: flag (as `flag_cell(opt)` writes it), variable, default, the
    `--help` group (group=True: the reference) and help; the reference's tables and the pages' options blocks."""
    columns = ["flag", "variable", "default", *(["group"] if group else []), "what it does"]
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for opt in found:
        cells = [flag_cell(opt), f"`{opt.env_var}`", default_text(opt), *([opt.group] if group else [])]
        out.append("| " + " | ".join([*cells, _cell(help_text(opt))]) + " |")
    return out


def documented_options() -> dict[str, Option]:
    """Every option the reference lists, by its anchor (`kv-cache-bytes`); RuntimeError if two layers share one."""
    found: dict[str, Option] = {}
    for cls, _, _ in layer_classes():
        for opt in options(cls):
            if opt.help and opt.group:
                if anchor(opt) in found:
                    raise RuntimeError(f"two settings take the flag {opt.flag}")
                found[anchor(opt)] = opt
    return found


# an options block of a page: the opening marker names the options, the closing one ends the generated rows
BLOCK_OPEN = re.compile(r"^<!-- options: (?P<names>[^>]*?) -->$")
BLOCK_CLOSE = "<!-- /options -->"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


class OptionsBlock(NamedTuple):
    """One options block of a page: its marker lines (0-based index), the names it lists and the text between."""

    start: int  # the opening marker's line
    end: int  # the closing marker's line
    names: tuple[str, ...]
    body: tuple[str, ...]


def options_blocks(lines: list[str]) -> tuple[list[OptionsBlock], list[str]]:
    """The options blocks of a page's lines (outside fenced code), and the problems of their markers (unclosed,
    nested, names missing)."""
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        if (fence := FENCE.match(lines[i])) is not None:  # a marker in fenced code is an example, not a block
            i = (
                next(
                    (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence[1])), len(lines)
                )
                + 1
            )
            continue
        opened = BLOCK_OPEN.match(lines[i])
        if opened is None:
            if lines[i].strip() == BLOCK_CLOSE:
                problems.append(f"line {i + 1}: {BLOCK_CLOSE} without an opening <!-- options: ... -->")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == BLOCK_CLOSE), None)
        inner = next((j for j in range(i + 1, end or len(lines)) if BLOCK_OPEN.match(lines[j])), None)
        if end is None or inner is not None:
            problems.append(f"line {i + 1}: an options block without its {BLOCK_CLOSE}")
            i += 1
            continue
        names = tuple(name.strip() for name in opened["names"].split(",") if name.strip())
        if not names:
            problems.append(f"line {i + 1}: an options block that names no option")
        blocks.append(OptionsBlock(i, end, names, tuple(lines[i + 1 : end])))
        i = end + 1
    return blocks, problems


def block_body(page: Path, names: tuple[str, ...], known: dict[str, Option]) -> list[str]:
    """The generated text between the markers: a blank line, the options' table with each flag linked to its row of
    the reference, a blank line."""
    target = Path(os.path.relpath(REFERENCE, page.parent)).as_posix()
    rows = option_table(
        [known[name] for name in names],
        lambda opt: f"[{flag_text(opt)}]({target}#{anchor(opt)})",
        group=False,
    )
    return ["", *rows, ""]


def block_pages() -> list[Path]:
    """The pages that may hold options blocks: every page under docs/ but the reference."""
    return [path for path in sorted(DOCS.rglob("*.md")) if path != REFERENCE]


def update_blocks(page: Path, write: bool = False) -> list[str]:
    """Problems with the page's options blocks: an unknown option, a block whose rows differ from what the
    declarations give (named by option). write=True rewrites the stale blocks (the unknown names stay problems)."""
    known = documented_options()
    lines = page.read_text().splitlines()
    blocks, marker_problems = options_blocks(lines)
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    problems = [f"{where}: {problem}" for problem in marker_problems]
    replaced = list(lines)
    for block in reversed(blocks):  # from the end, so that earlier line numbers hold
        unknown = [name for name in block.names if name not in known]
        if unknown:
            problems += [
                f"{where}:{block.start + 1}: no option is called {name!r} (an options block names flags "
                "without their dashes, as the reference's anchors: kv-cache-bytes)"
                for name in unknown
            ]
            continue
        expected = block_body(page, block.names, known)
        if list(block.body) == expected:
            continue
        if write:
            replaced[block.start + 1 : block.end] = expected
            continue
        stale = [known[name].flag for name, row in zip(block.names, expected[3:-1]) if row not in block.body]
        what = (
            f"{', '.join(stale)}: the default, help or flag differ from the declarations"
            if stale
            else "the text between the markers is not the generated table"
        )
        problems.append(
            f"{where}:{block.start + 1}: the options block is stale for {what} "
            "(python scripts/build_docs.py --write rewrites it)"
        )
    if write and replaced != lines:
        page.write_text("\n".join(replaced) + "\n")
    return problems


def check_blocks(write: bool = False) -> list[str]:
    """Every page's options-block problems (write=True: stale blocks rewritten first)."""
    return [problem for page in block_pages() for problem in update_blocks(page, write)]


def generate() -> list[Path]:
    """Write the generated pages (each whole, by a rename: a build running meanwhile reads the old page or the new);
    the paths written."""
    staging = REFERENCE.with_name(f".{REFERENCE.name}.{os.getpid()}")
    staging.write_text(reference_markdown())
    staging.replace(REFERENCE)
    return [REFERENCE]


def nav_pages(nav: Any) -> list[str]:
    """Every page the nav of mkdocs.yml names, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    if isinstance(nav, list):
        return [page for item in nav for page in nav_pages(item)]
    return []


def check_pages() -> list[str]:
    """Problems with the nav: a page it names that does not exist, a page under docs/ that it leaves out."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    listed = nav_pages(config["nav"])
    problems = [
        f"mkdocs.yml names {page}, which is not under docs/" for page in listed if not (DOCS / page).is_file()
    ]
    on_disk = {str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md")}
    problems += [f"docs/{page} is not in mkdocs.yml's nav" for page in sorted(on_disk - set(listed))]
    return problems


def build(write: bool = False) -> None:
    """Generate, check, then build the site offline in strict mode; SystemExit with the reasons on failure.
    write=True: the pages' stale options blocks are rewritten first."""
    generate()
    if problems := check_blocks(write) + check_pages():
        raise SystemExit("docs: " + "\n".join(problems))
    zensical = shutil.which("zensical", path=str(Path(sys.executable).parent)) or shutil.which("zensical")
    if zensical is None:
        raise SystemExit("docs: zensical is not installed (pip install -e '.[docs]')")
    command = [zensical, "build", "--strict", "--clean", "-f", str(CONFIG)]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"docs: the strict build failed:\n{result.stdout}\n{result.stderr}")
    print(f"docs: built into {ROOT / 'build' / 'site'} in {time.monotonic() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", action="store_true", help="only write the generated pages")
    parser.add_argument(
        "--write",
        action="store_true",
        help="rewrite the pages' options blocks from the declarations, then build",
    )
    args = parser.parse_args()
    if args.generate:
        for path in generate():
            print(f"docs: wrote {path.relative_to(ROOT)}")
    else:
        build(write=args.write)


if __name__ == "__main__":
    main()
