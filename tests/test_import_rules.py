"""The layers of the tree, checked: each folder imports only the layers below it, and the engine never the web.

A file's layer is its folder (engine/core, engine/worker, app/db, app/http, app/chat, ...; the modules directly
under engine/ or app/ are that package's top layer, except app/settings.py, which everything in the app may read).
The app is shared layers (settings, db, metrics, engine_client, http) and feature folders (chat, openai, accounts,
admin, cluster) on top of them; a feature never imports another. Imports are read from the source (every `import`
and `from` anywhere in the file, relative imports resolved), so a lazy import inside a function is a breach too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("engine", "kernels", "app", "bench", "pagedchat", "tests")
WEB = {
    "asyncio",
    "starlette",
    "sse_starlette",
    "sqlalchemy",
    "alembic",
    "jinja2",
    "uvicorn",
    "websockets",
    "httpx",
}
NUMERIC = {"torch", "triton", "numpy", "transformers", "safetensors", "gguf", "tokenizers"}
HTTP = {"starlette", "sse_starlette", "jinja2", "uvicorn", "websockets", "httpx"}
SQL = {"sqlalchemy", "alembic"}
ENGINE_TOP = "engine"  # llm_engine, llm, output_processor, detokenizer, cli
APP_TOP = "app"  # main (the app factory), cli, pages: where the features are put together
# the app's shared layers, bottom up; every feature folder sits on all of them and never imports another feature
APP_SHARED = {"app.settings", "app.db", "app.metrics", "app.engine_client", "app.http"}
APP_FEATURES = {"app.chat", "app.openai", "app.accounts", "app.admin", "app.cluster"}
APP_LAYERS = APP_SHARED | APP_FEATURES | {APP_TOP}


def feature(name: str, *, web: bool = True) -> tuple[set[str], set[str]]:
    """A feature's rule: itself and the shared layers (no SQL: the store does that; `web=False`: no HTTP either)."""
    return {name, *APP_SHARED, "engine.core"}, (SQL if web else HTTP | SQL)


# layer -> (our layers it may import, third-party top-level packages it must not import)
RULES: dict[str, tuple[set[str], set[str]]] = {
    "engine.core": ({"engine.core"}, WEB | NUMERIC),
    "engine.native": ({"engine.core", "engine.native"}, WEB),
    "engine.attention": ({"engine.core", "engine.native", "engine.attention", "kernels"}, WEB),
    "engine.models": ({"engine.core", "engine.native", "engine.attention", "engine.models"}, WEB),
    # worker and loading allocate the pool's and the weights' memory on huge pages (engine/native/huge_pages.py)
    "engine.worker": (
        {"engine.core", "engine.native", "engine.attention", "engine.models", "engine.worker"},
        WEB,
    ),
    "engine.loading": ({"engine.core", "engine.native", "engine.models", "engine.loading"}, WEB),
    # lower KV tiers: files and threads behind the pool; torch only to stage and fill its blocks
    "engine.tiers": ({"engine.core", "engine.tiers"}, WEB),
    ENGINE_TOP: (
        {
            "engine.core",
            "engine.attention",
            "engine.models",
            "engine.worker",
            "engine.loading",
            "engine.tiers",
            ENGINE_TOP,
        },
        WEB,
    ),
    "kernels": ({"kernels"}, WEB),
    # the app's shared layers: settings, the database, the metrics registry, the engine client (the only door to
    # the engine: no other app module imports engine/'s top layer), and what every HTTP feature shares
    "app.settings": ({"app.settings", "engine.core"}, WEB),
    "app.db": ({"app.db"}, HTTP),
    "app.metrics": ({"app.metrics", "app.settings", "engine.core"}, HTTP | SQL),
    "app.engine_client": (
        {"app.engine_client", "app.metrics", "app.settings", "engine.core", ENGINE_TOP},
        HTTP | SQL,
    ),
    "app.http": (
        {"app.http", "app.engine_client", "app.metrics", "app.db", "app.settings", "engine.core"},
        SQL,
    ),
    # the features: each one folder, on the shared layers only
    "app.chat": feature("app.chat"),
    "app.openai": feature("app.openai"),
    "app.accounts": feature("app.accounts"),
    "app.admin": feature("app.admin"),
    # engine replicas on Ray Serve: another implementation of the engine client, without HTTP
    "app.cluster": feature("app.cluster", web=False),
    APP_TOP: (APP_LAYERS | {"engine.core", ENGINE_TOP}, set()),
    "bench": (
        {"bench", *APP_LAYERS, "engine.core", "engine.native", ENGINE_TOP, "engine.loading", "engine.worker"},
        set(),
    ),
    # one-off measurements run from a checkout: they may also time the kernels and start the tests' PostgreSQL
    "bench.tools": (
        {
            "bench",
            *APP_LAYERS,
            "engine.core",
            "engine.native",
            ENGINE_TOP,
            "engine.loading",
            "kernels",
            "tests",
        },
        set(),
    ),
    "pagedchat": ({"pagedchat", *APP_LAYERS, "bench", ENGINE_TOP}, set()),
}


def layer_of_module(module: str) -> str | None:
    """The layer a dotted module name belongs to, or None for third-party modules."""
    parts = module.split(".")
    if parts[0] not in OURS:
        return None
    if parts[0] in ("engine", "app", "bench") and len(parts) >= 2 and f"{parts[0]}.{parts[1]}" in RULES:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str = "", is_package: bool = False) -> set[str]:
    """Every module an import statement names, relative imports resolved against `module`."""
    names = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return {n for n in names if n}


def source_files() -> list:
    params = []
    for top in ("engine", "kernels", "app", "bench", "pagedchat"):
        for path in sorted((ROOT / top).rglob("*.py")):
            params.append(pytest.param(path, id=path.relative_to(ROOT).as_posix()))
    return params


def breaches(path: Path) -> list[str]:
    """The imports of one file that its layer's rule forbids."""
    module = module_of(path)
    layer = layer_of_module(module)
    allowed, forbidden_third_party = RULES[layer]
    found = []
    for name in sorted(imported_modules(path.read_text(), module, path.name == "__init__.py")):
        target = layer_of_module(name)
        if target is None:
            if name.split(".")[0] in forbidden_third_party:
                found.append(name)
        elif target not in allowed:
            found.append(name)
    return found


@pytest.mark.parametrize("path", source_files())
def test_every_file_imports_only_the_layers_below_it(path: Path) -> None:
    assert breaches(path) == [], f"{path.relative_to(ROOT)} ({layer_of_module(module_of(path))}) imports them"


def test_the_core_never_loads_torch() -> None:
    core = sorted(module_of(p) for p in (ROOT / "engine" / "core").glob("*.py"))
    code = (
        "import importlib, json, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


def test_imported_modules_sees_every_import_form() -> None:
    source = (
        "import os.path as p\nfrom app.db import store\nfrom . import sibling\nif True:\n    import asyncio\n"
    )
    assert imported_modules(source, "engine.core.x") == {
        "os.path",
        "app.db",
        "app.db.store",
        "engine.core",
        "engine.core.sibling",
        "asyncio",
    }


def test_a_breach_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = ROOT / "engine" / "core" / "block_manager.py"
    monkeypatch.setattr(
        Path, "read_text", lambda self, *a, **k: "import torch\nfrom engine.worker import sampler\n"
    )
    assert breaches(fake) == ["engine.worker", "engine.worker.sampler", "torch"]


THE_ENGINE = (
    "engine.llm_engine",
    "engine.llm",
)  # the engine object itself (the app reaches it through EngineClient)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "app").rglob("*.py")), ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_only_the_engine_client_imports_the_engine(path: Path) -> None:
    """The app sees the engine as `EngineClient` and `EngineInfo` (app/engine_client/protocol.py): only the engine
    client's own modules build and call an `LLMEngine`."""
    if path.is_relative_to(ROOT / "app" / "engine_client"):
        return
    names = imported_modules(path.read_text(), module_of(path), path.name == "__init__.py")
    assert sorted(n for n in names if n.startswith(THE_ENGINE)) == []


BENCH_EXTRA = {"matplotlib", "tqdm", "openai"}  # pyproject's `bench` extra: `pagedchat serve` runs without it


@pytest.mark.parametrize("top", ["engine", "kernels", "app"])
def test_only_the_benchmarks_import_the_bench_extra(top: str) -> None:
    found = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / top).rglob("*.py")
        for name in imported_modules(path.read_text(), module_of(path), path.name == "__init__.py")
        if name.split(".")[0] in BENCH_EXTRA | {"bench"}
    }
    assert found == set()


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "app/chat/service.py",
            "from app.accounts.service import AccountService\nimport sqlalchemy\nfrom app import main\n",
            ["app", "app.accounts.service", "app.accounts.service.AccountService", "app.main", "sqlalchemy"],
        ),
        (
            "app/db/store.py",
            "from app.http.errors import APIError\nfrom app.settings import Settings\n",
            [
                "app.http.errors",
                "app.http.errors.APIError",
                "app.settings",
                "app.settings.Settings",
            ],
        ),
        (
            "app/chat/ws.py",
            "from sqlalchemy import select\nfrom app.main import create_app\n",
            ["app.main", "app.main.create_app", "sqlalchemy", "sqlalchemy.select"],
        ),
    ],
)
def test_the_app_layers_import_downwards_and_features_never_each_other(
    path: str, source: str, expected: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    assert breaches(ROOT / path) == expected
