"""The documentation site builds offline in strict mode, and its configuration reference lists every setting."""

from __future__ import annotations

import ast
import html
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from filelock import FileLock

from engine.core.options import options
from tests.docs.markdown_blocks import REPO_ROOT

SITE = REPO_ROOT / "build" / "site"


def load_build_docs() -> types.ModuleType:
    """scripts/build_docs.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_docs", REPO_ROOT / "scripts" / "build_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built_site() -> Path:
    """`make docs`: generate, check the nav, build strictly into build/site; once a test run. With `pytest -n 2` (not
    `--dist loadfile`) both workers take tests of this module, and two builds into one folder crashed the site
    builder ("No such file or directory"), or rewrote the site under the other's reads: the first worker builds, the
    second finds its run's stamp."""
    SITE.parent.mkdir(parents=True, exist_ok=True)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run
    stamp = SITE.parent / ".docs-built-by"
    with FileLock(str(SITE.parent / ".docs-build.lock")):
        if run is None or not stamp.exists() or stamp.read_text() != run:
            result = subprocess.run(
                [sys.executable, "scripts/build_docs.py"],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, (
                f"make docs failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            )
            stamp.write_text(run or "")
    return SITE


def page_text(page: Path) -> str:
    """A built page's text: tags dropped, entities read."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_the_site_builds_strictly(built_site):
    for page in (
        "index.html",
        "users/api.html",
        "operators/configuration-reference.html",
        "performance/index.html",
    ):
        assert (built_site / page).is_file(), page


def test_the_reference_lists_every_setting_of_every_layer(built_site):
    text = page_text(built_site / "operators" / "configuration-reference.html")
    build_docs = load_build_docs()
    missing = []
    for cls, title, _ in build_docs.layer_classes():
        assert title.replace("`", "") in text, title
        for opt in options(cls):
            if opt.help and opt.group:
                missing += [
                    f"{cls.__name__}.{opt.name}: {word}"
                    for word in (opt.flag, opt.env_var)
                    if word not in text
                ]
                if " ".join(opt.help.replace("`", "").split()) not in " ".join(text.split()):
                    missing.append(f"{cls.__name__}.{opt.name}: its help")
    assert not missing, "settings missing from the built configuration reference:\n" + "\n".join(missing)


def test_every_setting_has_its_anchor_in_the_built_reference(built_site):
    """Pages link to `configuration-reference.md#kv-cache-bytes`; the strict build checks those links, and this
    that every setting has such an anchor, named as options blocks name it."""
    built = (built_site / "operators" / "configuration-reference.html").read_text()
    ids = set(re.findall(r'\bid="([^"]+)"', built))
    missing = [name for name in load_build_docs().documented_options() if name not in ids]
    assert not missing, f"settings without an anchor in the built reference: {missing}"


def classes_declaring_options() -> set[str]:
    """`module.Class` for every class under app/ and engine/ with a field declared by `option(...)`."""
    found = set()
    for path in [*(REPO_ROOT / "app").rglob("*.py"), *(REPO_ROOT / "engine").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    value = getattr(statement, "value", None)
                    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "option":
                        found.add(f"{module}.{node.name}")
                        break
    return found


def test_every_class_that_declares_options_is_a_layer_of_the_reference():
    layers = {f"{module}.{name}" for module, name, _, _ in load_build_docs().LAYERS}
    declaring = classes_declaring_options()
    assert declaring, "no class declares option() fields: the scan is broken"
    assert declaring <= layers, f"add to LAYERS in scripts/build_docs.py: {sorted(declaring - layers)}"


def test_the_nav_check_finds_a_missing_and_an_unlisted_page(tmp_path, monkeypatch):
    build_docs = load_build_docs()
    docs = tmp_path / "docs"
    (docs / "a").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n")
    (docs / "a" / "left-out.md").write_text("# Left out\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("nav:\n  - Home: index.md\n  - Part:\n      - Gone: a/gone.md\n")
    monkeypatch.setattr(build_docs, "DOCS", docs)
    monkeypatch.setattr(build_docs, "CONFIG", config)
    assert build_docs.check_pages() == [
        "mkdocs.yml names a/gone.md, which is not under docs/",
        "docs/a/left-out.md is not in mkdocs.yml's nav",
    ]


def test_a_default_reads_as_the_flag_takes_it():
    build_docs = load_build_docs()
    from engine.core.config import EngineConfig

    by_name = {opt.name: opt for opt in options(EngineConfig)}
    assert build_docs.default_text(by_name["block_size"]) == "`16`"
    assert build_docs.flag_text(by_name["enable_prefix_caching"]).startswith("`--")
