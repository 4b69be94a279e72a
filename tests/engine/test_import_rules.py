"""The engine's layering: pure-Python core modules never load torch; nothing under engine/ imports the web stack."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine"
TORCH_FREE = [
    "engine.block_manager",
    "engine.scheduler",
    "engine.config",
    "engine.sequence",
    "engine.outputs",
]
TORCH_FREE += ["engine.stats"]
FORBIDDEN = {"asyncio", "starlette", "sqlalchemy", "jinja2", "uvicorn", "websockets", "app"}


def engine_files() -> list:
    params = []
    for path in sorted(ENGINE_DIR.rglob("*.py")):
        name = path.relative_to(ENGINE_DIR).as_posix()
        params.append(pytest.param(path, id=name))
    return params


def imported_modules(source: str) -> set[str]:
    """Every absolute module an import statement names, with its top-level packages (relative imports skipped)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names | {name.split(".")[0] for name in names}


def test_core_modules_do_not_load_torch() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ENGINE_DIR.parent, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) == []


@pytest.mark.parametrize("path", engine_files())
def test_engine_never_imports_the_web_stack(path: Path) -> None:
    forbidden = imported_modules(path.read_text()) & FORBIDDEN
    assert not forbidden, f"{path.relative_to(ENGINE_DIR.parent)} imports {sorted(forbidden)}"


def test_imported_modules_sees_every_import_form() -> None:
    source = (
        "import os.path as p\nfrom app.db import store\nfrom . import sibling\nif True:\n    import asyncio\n"
    )
    assert imported_modules(source) == {"os.path", "os", "app.db", "app", "asyncio"}
