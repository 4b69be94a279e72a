"""The engine's one immutable configuration, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.memory import KV_BUDGET_CAP, KV_BUDGET_FLOOR, KV_BUDGET_SEQUENCES, KV_BUDGET_SHARE
from engine.core.options import check_choices, option, size_text

DEFAULT_MODEL = "smollm2-135m-instruct"
QUANTIZATIONS = ("auto", "gguf", "none")
KV_CACHE_DTYPES = ("auto", "model", "float16", "int8")
SPECULATIVE_METHODS = ("off", "ngram", "draft")
MAX_SPECULATIVE_TOKENS = 15


@dataclass(frozen=True)
class EngineConfig:
    """Every engine knob. Built once; engine/core/resolve.py returns a copy with `auto` decided for a model and machine."""

    # One line per knob: the engine flags of every subcommand and the PAGEDCHAT_* variables of `pagedchat serve`
    # are derived from these fields (engine/core/options.py).
    model: str = option(
        DEFAULT_MODEL,
        "a local HF folder, a Llama-family .gguf file, a hub id (org/name, fetched into the Hugging Face cache), "
        "or smollm2-135m-instruct",
        group="model",
    )
    model_revision: str = option(
        "", "hub ids only: the branch, tag or commit to load; unset: main", flag="--revision", group="model"
    )
    gguf_file: str = option(
        "",
        "hub ids only: the .gguf file to load from the repo; unset: the repo's safetensors, else its only .gguf file",
        group="model",
    )
    dtype: str = option(
        "auto",
        "auto: bf16 where the CPU/GPU supports it, else fp32 (fp32 beside quantization gguf, whose kernels take fp32)",
        choices=("auto", "float32", "bfloat16", "float16"),
        group="model",
    )
    device: str = option(
        "auto", "auto: cuda when available, else cpu", choices=("auto", "cpu", "cuda"), group="engine"
    )
    quantization: str = option(
        "auto",
        "gguf: keep a GGUF model's blocks (Q4_0/Q4_1/Q8_0, Q5_0/Q5_1, IQ4_NL/IQ4_XS, Q3_K..Q6_K) and multiply "
        "them as they are (CPU only; see int8_activations, batch_gemm); none: float weights in dtype; auto: gguf for a GGUF model "
        f"({DEFAULT_MODEL} comes from one) on the CPU, else none",
        choices=QUANTIZATIONS,
        group="model",
    )
    int8_activations: bool | None = option(
        None,
        "quantization gguf only: round decode activations to int8 per 32 values, as llama.cpp does (the linears "
        "read the blocks at up to twice the speed on AVX2; logits move slightly: see `pagedchat bench quality`); "
        "off: fp32 activations times the blocks, exact up to summation order; unset: on with quantization gguf",
        group="advanced",
    )
    batch_gemm: str = option(
        "auto",
        "quantization gguf on the CPU: how batches of many rows (prefill, a busy decode step) multiply the blocks: "
        "fp32 (more than 16 rows: dequantized fp32 tiles, exact up to summation order), bf16 (more than 16 rows: a "
        "bf16 copy of the weights, +2 bytes a weight in RAM, torch's bf16 GEMM: several times faster where the CPU "
        "has AVX512-BF16 or AMX, logits move at bf16 rounding) or int8 (more than 16 rows: activations rounded to "
        "int8 per 32 values as llama.cpp does, integer dot products with the blocks themselves: faster on AVX2, "
        "logits move slightly); fewer rows take the GEMV kernel (see int8_activations); auto: bf16 on such a CPU for a model whose copy "
        "is at most 512 MiB (~250M weights: the memory of a bigger model stays its file's), else int8",
        choices=("auto", "fp32", "bf16", "int8"),
        group="advanced",
    )
    weight_layout: str = option(
        "auto",
        "quantization gguf on the CPU: rows8 repacks Q4_K weights at load into groups of 8 interleaved rows (+2.8% "
        "bytes, no float copy; 2 to 16 rows read each block once and share its unpacking: the few-row steps of "
        "busy decoding and speculative verification), file keeps the file's blocks as they are; auto: rows8 "
        "where int8 activations run on the compiled kernels of an AVX512-VNNI CPU, else file",
        choices=("auto", "file", "rows8"),
        group="advanced",
    )
    fused_decode: bool = option(
        True,
        "quantization gguf on the CPU: run a decode step's layers (up to 16 sequences) in one C call instead of "
        "~300 Python calls; the same kernels, bit for bit the same result (off: the module path, to compare)",
        group="advanced",
    )
    step_timing: bool = option(
        False,
        "time every decode-only step's linears and attention inside the engine, per batch size (the rest is "
        "Python, small ops, sampling, detokenization): /api/admin/state and /metrics show the totals; costs "
        "~0.2 µs a linear call outside the fused step",
        group="advanced",
    )
    attention_backend: str = option(
        "auto", "auto: triton on CUDA, torch elsewhere", choices=("auto", "torch", "triton"), group="advanced"
    )
    kv_cache_dtype: str = option(
        "auto",
        "auto: float16 where the CPU kernels run fp32 activations that they already round to int8 "
        "(int8_activations, the default with quantization gguf), else the model's dtype; model: the model's dtype "
        "always; float16: two bytes a value (half an fp32 "
        "model's bytes, read by the CPU's decode kernel at half the bandwidth; the values rounded to fp16); int8: one byte a value with an fp16 scale per "
        "token and KV head (about twice the tokens per byte of bf16, four times fp32; logits move slightly: see "
        "`pagedchat bench quality`)",
        choices=KV_CACHE_DTYPES,
        group="cache",
    )
    block_size: int = option(16, "tokens per KV block", choices=(8, 16, 32, 64, 128), group="advanced")
    memory_utilization: float = option(
        0.9, "GPU only: fraction of total device memory the engine may use", group="engine"
    )
    kv_cache_bytes: int | None = option(
        None,
        f"KV pool budget; unset: on CPU {KV_BUDGET_SHARE:.0%} of the memory available after the weights, within "
        f"{size_text(KV_BUDGET_FLOOR)}..{size_text(KV_BUDGET_CAP)}, then at most {KV_BUDGET_SEQUENCES} and at least "
        "one max_model_len sequence (engine/core/memory.py); on GPU memory_utilization",
        unit="bytes",
        group="cache",
    )
    max_model_len: int | None = option(
        None,
        "longest sequence (prompt + reply), in tokens; unset: the model's own limit (max_position_embeddings, GGUF "
        "context_length), or the longest sequence the KV pool holds where that is less (said at start-up)",
        group="model",
    )
    max_num_seqs: int = option(256, "sequences running at once", group="engine")
    max_num_batched_tokens: int | None = option(
        None, "tokens per step; unset: 512 on CPU, 8192 on GPU", group="engine"
    )
    enable_prefix_caching: bool = option(
        True, "reuse the KV blocks of shared prompt prefixes", flag="--prefix-caching", group="cache"
    )
    copy_partial_blocks: bool = option(
        True,
        "where a prompt parts from a cached block inside it (a regenerated, edited or continued chat turn), copy "
        "that block's KV instead of recomputing the tokens before the fork",
        group="advanced",
    )
    prefix_cache_salt: str = option(
        "", "mixed into every block hash: engines with different salts share no cached prefix", group="cache"
    )
    kv_disk_bytes: int | None = option(
        None,
        "byte cap of the disk tier that keeps full KV blocks across eviction and restarts; unset: 4 GiB or 10% of "
        "the free disk, whichever is smaller; 0: no disk tier",
        unit="bytes",
        group="cache",
    )
    kv_disk_dir: str = option(
        "",
        "the disk tier's directory (one engine process each); one the tier did not make (a shared one, say) is "
        "left as it is and the tier works in its subdirectory pagedchat-kv; unset: <cache dir>/kv",
        group="cache",
    )
    kv_disk_key_file: str = option(
        "",
        "the secret (made 0600 when missing) that keys the disk tier's block MACs: keep it where whoever can write "
        "the tier's directory cannot read (`pagedchat serve` puts it beside its database); unset: "
        "<cache dir>/kv-tier.key",
        group="cache",
    )
    guided_mask_max_s: float = option(
        0.01,
        "structured output: the CPU time, in seconds, one token mask of a request may take (its grammar's first mask, built "
        "when it compiles, has its own 0.25 s limit); a request over it ends with an error: masks are computed "
        "during the step, so a costly grammar slows every request in the batch",
        group="advanced",
    )
    guided_mask_budget_s: float = option(
        1.0,
        "structured output: the CPU time, in seconds, all of a request's token masks may take together (its samples', and "
        "every mask a step needs); a request over it ends with an error",
        group="advanced",
    )
    speculative_method: str = option(
        "ngram",
        "ngram: propose the tokens that followed the latest earlier occurrence of a sequence's last tokens in its "
        "own prompt and reply (prompt lookup), verified several in one weight pass, only in decode steps and only "
        "as far as the measured step times say it pays; greedy output is the same token for token, sampled output "
        "the same distribution; draft: the greedy tokens of a smaller model that shares the tokenizer "
        "(speculative_model), its own KV pool out of the same budget; off: one token a step",
        choices=SPECULATIVE_METHODS,
        group="speculative",
    )
    num_speculative_tokens: int = option(
        8,
        "the most tokens proposed for a sequence in one step (each step picks fewer where they do not pay)",
        group="speculative",
    )
    ngram_min: int = option(
        2, "ngram: the shortest suffix of a sequence that is looked up", group="speculative"
    )
    ngram_max: int = option(
        4, "ngram: the longest suffix of a sequence that is looked up", group="speculative"
    )
    speculative_model: str = option(
        "",
        "draft: the draft model (what --model takes: a .gguf file, a folder, a hub id or the default model's name), "
        "with the target's tokenizer; loaded with this config's dtype, quantization and KV settings",
        group="speculative",
    )
    seed: int = option(0, "random seed of sampling", group="engine")
    num_threads: int | None = option(None, "CPU torch threads; unset: torch's default", group="engine")

    def __post_init__(self) -> None:
        check_choices(self)
        if not 0.0 < self.memory_utilization <= 1.0:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1, got {self.max_num_batched_tokens}")
        if self.kv_disk_bytes is not None and self.kv_disk_bytes < 0:
            raise ValueError(f"kv_disk_bytes must be 0 (off) or positive, got {self.kv_disk_bytes}")
        for name in ("guided_mask_max_s", "guided_mask_budget_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], got {self.num_speculative_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"ngram sizes must satisfy 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}"
            )
        if (self.speculative_method == "draft") != bool(self.speculative_model):
            raise ValueError(
                "speculative_method draft needs speculative_model (the draft model), and speculative_model needs "
                f"speculative_method draft; got {self.speculative_method!r} and {self.speculative_model!r}"
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1, got {self.num_threads}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least block_size ({self.block_size})"
            )
