"""Every shell block in README.md and docs/ says whether it runs; the runnable ones run against a real test server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.common.servers import stop_server
from tests.app.factories import make_tiny_model_dir
from tests.docs.markdown_blocks import REPO_ROOT, ShellBlock, all_shell_blocks, shell_blocks
from tests.e2e.conftest import Server, server_env, start_server

DOCS_URL = "http://127.0.0.1:8000"
DOCS_MODEL = "smollm2-135m-instruct"
# curl exits non-zero on an HTTP error, so that a block whose request is refused fails here (a block that passes
# -f itself keeps it: curl refuses --fail-with-body beside it)
CURL_CHECKS_STATUS = (
    'curl() { case " $* " in *" -f "*|*" -sf "*|*" --fail "*) command curl --max-time 60 "$@";; '
    '*) command curl --fail-with-body --max-time 60 "$@";; esac; }\n'
)
RUNNABLE = [block for block in all_shell_blocks() if block.runnable]


def test_every_shell_block_is_marked():
    unmarked = [
        f"{block.where} (line before: {block.marker!r})" for block in all_shell_blocks() if not block.marked
    ]
    assert not unmarked, (
        "mark each shell block on the line before it with <!-- runnable --> or <!-- not-runnable: why -->:\n"
        + "\n".join(unmarked)
    )


def test_the_readme_and_the_docs_have_runnable_blocks():
    """The README's curl example runs, and so do some of the docs' own."""
    readme = shell_blocks(REPO_ROOT / "README.md")
    assert any(block.runnable and "/v1/chat/completions" in block.text for block in readme)
    assert len(RUNNABLE) >= 5, [block.where for block in RUNNABLE]


def test_an_unmarked_block_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n```bash\necho hi\n```\n\n<!-- not-runnable: a reason -->\n```sh\nmake serve\n```\n"
    )
    first, second = shell_blocks(page)
    assert (first.marked, second.marked, second.runnable) == (False, True, False)
    assert first.text == "echo hi"


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory) -> Iterator[tuple[Server, str]]:
    """A real `pagedchat serve` on the tiny model, as the end-to-end tests start it, and the id it serves."""
    tmp_path = tmp_path_factory.mktemp("docs-server")
    server = start_server(tmp_path, server_env(tmp_path, str(make_tiny_model_dir())))
    model = httpx.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    yield server, model
    stop_server(server)


def as_run_here(block: ShellBlock, base_url: str, model: str) -> str:
    """The block's text pointed at the test server, its model and this environment's executables."""
    venv_bin = Path(sys.executable).parent
    text = block.text.replace(DOCS_URL, base_url).replace(DOCS_MODEL, model)
    return CURL_CHECKS_STATUS + text.replace(".venv/bin/", f"{venv_bin}/")


@pytest.mark.budget(
    seconds=60, why="the first runnable block starts the test server (its zygote: ~20 s on 2 cores)"
)
@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_runnable_block_runs(block: ShellBlock, docs_server):
    server, model = docs_server
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", as_run_here(block, server.base_url, model)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{block.where} failed ({result.returncode}):\n{block.text}\n---\n{output}"
