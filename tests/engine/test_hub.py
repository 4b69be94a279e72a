"""Hub ids (`org/name`) resolved through huggingface_hub against a hub served on 127.0.0.1 (HF_ENDPOINT): download,
revisions, offline mode and every failure as one line.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE once, at import, so each resolution runs in a fresh
subprocess with its own environment: the real resolution code against real HTTP, nothing patched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import SamplingParams
from engine.loading.hub import choose_files, is_repo_id
from tests.engine.bench_helpers import make_tiny_model_folder
from tests.engine.gguf_factories import write_tiny_chat_gguf
from tests.engine.hub_server import HubRepo, HubServer, commit_sha, repo_from_folder

ROOT = Path(__file__).resolve().parents[2]
TINY = "test-org/tiny-llama"
GGUFS = "test-org/tiny-ggufs"
ONE_GGUF = "test-org/one-gguf"
EXTRA_FILES = {"README.md": b"# tiny\n", "pytorch_model.bin": b"not for us", "onnx/model.onnx": b"nor this"}
RESOLVE = """
import sys
from engine.loading.hub import resolve_hub_model
try:
    print(resolve_hub_model(sys.argv[1], revision=sys.argv[2], gguf_file=sys.argv[3]))
except ValueError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""
PROMPT = "The quick brown fox"
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
GENERATE = f"""
import json, sys
from engine import LLM, SamplingParams
served = {{}}
for model, revision in json.loads(sys.argv[1]):
    llm = LLM(model=model, model_revision=revision, kv_cache_bytes=4 << 20, kv_disk_bytes=0)
    output = llm.generate([{PROMPT!r}], SamplingParams(max_tokens=6, temperature=0.0))[0].outputs[0]
    served[model] = [llm.engine.model_name, output.text]
print(json.dumps(served))
"""
_HF_VARS = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN")


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory) -> dict[str, Path]:
    """Two tiny random Llama folders (seeds 0 and 1) and two tiny GGUF files."""
    root = tmp_path_factory.mktemp("tiny-models")
    ggufs = root / "ggufs"
    ggufs.mkdir()
    return {
        "s0": make_tiny_model_folder(root / "s0", seed=0),
        "s1": make_tiny_model_folder(root / "s1", seed=1),
        "q0": write_tiny_chat_gguf(ggufs / "tiny-q0.gguf", seed=0),
        "q1": write_tiny_chat_gguf(ggufs / "tiny-q1.gguf", seed=1),
    }


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def hub(tiny_folders) -> HubServer:
    """The test hub: the tiny model (main = seed 1, tag v1 = seed 0), GGUF repos, a gated repo, a weightless one."""
    v1, v2 = commit_sha("tiny v1"), commit_sha("tiny v2")
    tiny = HubRepo(
        TINY,
        {
            v1: {**_files(tiny_folders["s0"]), **EXTRA_FILES},
            v2: {**_files(tiny_folders["s1"]), **EXTRA_FILES},
        },
        {"main": v2, "v1": v1},
    )
    q0, q1 = tiny_folders["q0"], tiny_folders["q1"]
    sha = commit_sha("ggufs")
    ggufs = HubRepo(
        GGUFS, {sha: {"README.md": b"#", q0.name: q0.read_bytes(), q1.name: q1.read_bytes()}}, {"main": sha}
    )
    one = HubRepo(ONE_GGUF, {sha: {"README.md": b"#", q0.name: q0.read_bytes()}}, {"main": sha})
    gated = repo_from_folder("test-org/gated", tiny_folders["s0"], gated=True)
    weightless = HubRepo(
        "test-org/weightless", {sha: {"config.json": b"{}", "README.md": b"#"}}, {"main": sha}
    )
    server = HubServer([tiny, ggufs, one, gated, weightless]).start()
    yield server
    server.stop()


def hub_env(endpoint: str, hf_home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the hub variables of the test only."""
    env = {k: v for k, v in os.environ.items() if k not in _HF_VARS}
    return {**env, "HF_ENDPOINT": endpoint, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def resolve(
    env: dict[str, str], repo_id: str, revision: str = "", gguf_file: str = ""
) -> subprocess.CompletedProcess:
    """resolve_hub_model in a fresh process (huggingface_hub reads its environment at import)."""
    cmd = [sys.executable, "-c", RESOLVE, repo_id, revision, gguf_file]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The error line a failed resolution printed last (after any progress bar); asserts no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert all(line.startswith("Fetching") for line in lines[:-1]), proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def populated_home(hub, tmp_path_factory) -> Path:
    """An HF_HOME holding the tiny model's main revision, downloaded from the test hub."""
    home = tmp_path_factory.mktemp("hf-home-populated")
    proc = resolve(hub_env(hub.url, home), TINY)
    assert proc.returncode == 0, proc.stderr
    return home


def test_repo_ids_are_org_slash_name():
    assert is_repo_id("HuggingFaceTB/SmolLM2-360M-Instruct") and is_repo_id("org/name.v2_b")
    for name in (
        "smollm2-135m-instruct",
        "a/b/c",
        "./org/name",
        "/abs/path",
        "org/model.gguf",
        "org/..",
        "o/a--b",
    ):
        assert not is_repo_id(name), name


def test_choose_files_fetches_config_tokenizer_and_model_shards_only():
    files = [
        "README.md",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "consolidated.safetensors",  # Mistral's own copy of the weights
        "pytorch_model.bin",
        "onnx/model.safetensors",
        "model-q4.gguf",
    ]
    wanted, gguf = choose_files("o/m", files)
    assert gguf is None
    assert wanted == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert choose_files("o/m", files, gguf_file="model-q4.gguf") == (["model-q4.gguf"], "model-q4.gguf")


def test_choose_files_picks_the_one_gguf_or_names_them_all():
    assert choose_files("o/m", ["README.md", "sub/m-Q8_0.gguf"]) == (["sub/m-Q8_0.gguf"], "sub/m-Q8_0.gguf")
    assert choose_files("o/m", ["sub/m-Q8_0.gguf"], gguf_file="m-Q8_0.gguf")[1] == "sub/m-Q8_0.gguf"
    with pytest.raises(
        ValueError, match=r"has several GGUF files named 'm.gguf' \(give its path\); its GGUF files: a/m"
    ):
        choose_files("o/m", ["a/m.gguf", "b/m.gguf"], gguf_file="m.gguf")
    assert choose_files("o/m", ["a/m.gguf", "b/m.gguf"], gguf_file="b/m.gguf")[1] == "b/m.gguf"
    files = ["m-Q4_0.gguf", "m-Q8_0.gguf", "README.md"]
    with pytest.raises(
        ValueError, match=r"'o/m' holds 2 GGUF files: choose one with --gguf-file .*m-Q4_0\.gguf, m-Q8_0"
    ):
        choose_files("o/m", files)
    with pytest.raises(
        ValueError, match=r"has no GGUF file 'm-Q5_K.gguf'; its GGUF files: m-Q4_0.gguf, m-Q8_0.gguf"
    ):
        choose_files("o/m", files, gguf_file="m-Q5_K.gguf")
    with pytest.raises(
        ValueError, match=r"no weights pagedchat loads .*its files: README.md, pytorch_model.bin"
    ):
        choose_files("o/m", ["README.md", "pytorch_model.bin"])


def test_hub_models_download_what_the_engine_needs_and_generate_as_their_local_copies(
    hub, tmp_path, tiny_folders
):
    from engine import LLM

    cases = [(TINY, "v1", tiny_folders["s0"]), (ONE_GGUF, "", tiny_folders["q0"])]
    before = len(hub.requests)
    models = json.dumps([[repo_id, revision] for repo_id, revision, _ in cases])
    proc = subprocess.run(
        [sys.executable, "-c", GENERATE, models],
        env=hub_env(hub.url, tmp_path / "hf"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    served = json.loads(proc.stdout)
    fetched = [path for method, path in hub.requests[before:] if method == "GET" and "/resolve/" in path]
    for repo_id, _, source in cases:
        # a folder's config, tokenizer and weights (none of the repo's other files), or the one GGUF file
        expected_names = sorted(p.name for p in source.iterdir()) if source.is_dir() else [source.name]
        names = sorted(p.rsplit("/", 1)[-1] for p in fetched if p.startswith(f"/{repo_id}/"))
        assert names == expected_names
        assert f"Fetching {len(expected_names)} files" in proc.stderr  # huggingface_hub's progress bar
        local = LLM(model=str(source), kv_cache_bytes=4 << 20).generate([PROMPT], GREEDY)[0].outputs[0].text
        assert local.strip() and served[repo_id] == [repo_id, local]


def test_a_pinned_revision_is_the_commit_it_names(hub, tmp_path, tiny_folders):
    env = hub_env(hub.url, tmp_path / "hf")
    v1 = commit_sha("tiny v1")
    for revision in ("v1", v1):
        proc = resolve(env, TINY, revision)
        assert proc.returncode == 0, proc.stderr
        folder = Path(proc.stdout.strip())
        assert folder.name == v1 and folder.parent.name == "snapshots"
        assert (folder / "model.safetensors").read_bytes() == (
            tiny_folders["s0"] / "model.safetensors"
        ).read_bytes()
    main = Path(resolve(env, TINY).stdout.strip())
    assert main.name == commit_sha("tiny v2")
    assert (main / "model.safetensors").read_bytes() == (
        tiny_folders["s1"] / "model.safetensors"
    ).read_bytes()
    line = error_line(resolve(env, TINY, "no-such-branch"))
    assert line == f"model repo '{TINY}' on {hub.url} has no revision 'no-such-branch'"


def test_missing_gated_and_weightless_repos_are_one_line(hub, tmp_path):
    env = hub_env(hub.url, tmp_path / "hf")
    assert error_line(resolve(env, "test-org/nope")).startswith(
        f"no model 'test-org/nope': not a local path, and no such repo on {hub.url} (a private repo needs a token"
    )
    assert error_line(resolve(env, "test-org/gated")) == (
        f"model repo 'test-org/gated' is gated: accept its terms at {hub.url}/test-org/gated, then log in with "
        "`hf auth login` or set HF_TOKEN"
    )
    line = error_line(resolve(env, "test-org/weightless"))
    assert line.startswith("model repo 'test-org/weightless' has no weights pagedchat loads")


def test_a_gguf_repo_fetches_the_chosen_file_only(hub, tmp_path, tiny_folders):
    env = hub_env(hub.url, tmp_path / "hf")
    assert "holds 2 GGUF files: choose one with --gguf-file" in error_line(resolve(env, GGUFS))
    before = len(hub.requests)
    proc = resolve(env, GGUFS, gguf_file="tiny-q1.gguf")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.name == "tiny-q1.gguf" and path.read_bytes() == tiny_folders["q1"].read_bytes()
    fetched = [p for m, p in hub.requests[before:] if m == "GET" and "/resolve/" in p]
    assert [p.rsplit("/", 1)[-1] for p in fetched] == ["tiny-q1.gguf"]
    assert Path(resolve(env, ONE_GGUF).stdout.strip()).name == "tiny-q0.gguf"


def test_offline_mode_uses_the_cache_and_says_when_it_is_empty(hub, populated_home, tmp_path):
    before = len(hub.requests)
    proc = resolve(hub_env(hub.url, populated_home, HF_HUB_OFFLINE="1"), TINY)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).name == commit_sha("tiny v2")
    assert "HF_HUB_OFFLINE is set: using the cached copy" in proc.stderr
    assert len(hub.requests) == before  # not one request
    line = error_line(resolve(hub_env(hub.url, tmp_path / "empty", HF_HUB_OFFLINE="1"), TINY))
    assert line == (
        f"HF_HUB_OFFLINE is set, and model '{TINY}' is not in the cache {tmp_path / 'empty' / 'hub'}: download it "
        "once with network access"
    )
    line = error_line(resolve(hub_env(hub.url, populated_home, HF_HUB_OFFLINE="1"), TINY, "v1"))
    assert "model 'test-org/tiny-llama' at revision 'v1' is not in the cache" in line


def test_connection_refused_uses_the_cache_or_says_so(populated_home, tmp_path):
    down = HubServer([]).start()
    down.stop()  # its port now refuses connections
    started = time.monotonic()
    line = error_line(resolve(hub_env(down.url, tmp_path / "empty"), TINY))
    assert time.monotonic() - started < 30
    assert line.startswith(f"cannot reach the hub at {down.url} (")
    assert line.endswith(
        f"and model '{TINY}' is not in the cache {tmp_path / 'empty' / 'hub'}: download it once with network access"
    )
    proc = resolve(hub_env(down.url, populated_home), TINY)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).name == commit_sha("tiny v2")
    assert f"cannot reach the hub at {down.url}" in proc.stderr and "using the cached copy" in proc.stderr


def test_serve_with_an_unknown_hub_id_or_a_misplaced_revision_exits_with_one_line(hub, tmp_path):
    env = hub_env(hub.url, tmp_path / "hf", PAGEDCHAT_CACHE_DIR=str(tmp_path / "cache"))
    expected = {
        "does/not-exist": f"no model 'does/not-exist': not a local path, and no such repo on {hub.url} (a private "
        "repo needs a token: log in with `hf auth login` or set HF_TOKEN)",
        "smollm2-135m-instruct": "--revision (PAGEDCHAT_MODEL_REVISION) applies to hub ids (org/name), not to the "
        "local model 'smollm2-135m-instruct'",
    }
    for model, message in expected.items():
        cmd = [sys.executable, "-m", "pagedchat", "serve", "--model", model, "--port", "1"]
        if model == "smollm2-135m-instruct":
            cmd += ["--revision", "v1"]
        started = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert time.monotonic() - started < 30
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [f"pagedchat serve: {message}"]


def test_hub_options_are_refused_for_local_models(tiny_folders):
    from engine.loading.loader import resolve_model_path

    with pytest.raises(
        ValueError, match=r"^--revision \(PAGEDCHAT_MODEL_REVISION\) applies to hub ids \(org/name\)"
    ):
        resolve_model_path(str(tiny_folders["s0"]), revision="v1")
    with pytest.raises(
        ValueError, match=r"^--gguf-file \(PAGEDCHAT_GGUF_FILE\) applies to hub ids .* 'smollm2"
    ):
        resolve_model_path("smollm2-135m-instruct", gguf_file="x.gguf")  # refused before any provisioning
    with pytest.raises(ValueError, match="nor a hub id"):
        resolve_model_path("./not/a/model")
