"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2) over a flattened batch and a paged KV cache."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.rope import RopeInputs, apply_rope, rope_cos_sin, rope_inv_freq
from engine.native.fused_ops import SUPPORTED_DTYPES, CpuOps, load_cpu_ops
from engine.native.onednn import Linear

if TYPE_CHECKING:
    from engine.attention.backend import AttentionBackend, LayerKV
    from engine.attention.metadata import AttentionMetadata

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
__all__ = [
    "Linear",
    "LlamaForCausalLM",
    "ModelArgs",
    "RopeInputs",
    "apply_rope",
    "rope_cos_sin",
    "rope_inv_freq",
]


@dataclass(frozen=True)
class ModelArgs:
    """Shapes and options of one Llama-family model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_seq_len: int  # positions covered by the RoPE table
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()  # sorted items of the HF rope parameters minus theta/type
    rope_type: str = "default"
    rope_freq_factors: tuple[
        float, ...
    ] = ()  # llama.cpp's rope_freqs: a divisor per frequency (GGUF Llama 3)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False

    @property
    def linear_weights(self) -> int:
        """Weights of every matmul of a token: the layers' linears and the LM head (the embedding only where tied)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = (
            self.hidden_size * (q + 2 * kv)
            + q * self.hidden_size
            + 3 * self.hidden_size * self.intermediate_size
        )
        return self.num_layers * layer + self.vocab_size * self.hidden_size

    @classmethod
    def from_hf_config(cls, hf_config: Any, max_model_len: int | None = None) -> ModelArgs:
        """Read a transformers config (4.x `rope_scaling` or 5.x `rope_parameters`)."""
        model_type = getattr(hf_config, "model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        max_seq_len = hf_config.max_position_embeddings
        if max_model_len is not None:
            max_seq_len = min(max_seq_len, max_model_len)
        window = getattr(hf_config, "sliding_window", None)
        if getattr(hf_config, "use_sliding_window", True) and window is not None and window < max_seq_len:
            # a window at least as long as every sequence equals full attention, so it is ignored then
            raise ValueError(
                f"sliding_window ({window}) is shorter than max_model_len ({max_seq_len}); sliding-window "
                f"attention is not implemented: set max_model_len <= {window}"
            )
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        rope.update(getattr(hf_config, "rope_scaling", None) or {})  # 4.x configs keep scaling here
        rope_type = rope.pop("rope_type", rope.pop("type", "default")) or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
        theta = rope.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        freq_factors = tuple(float(f) for f in getattr(hf_config, "rope_freq_factors", None) or ())
        if freq_factors and len(freq_factors) != head_dim // 2:
            raise ValueError(
                f"rope_freq_factors has {len(freq_factors)} values; head_dim {head_dim} needs {head_dim // 2}"
            )
        attention_bias = bool(getattr(hf_config, "attention_bias", False))
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            max_seq_len=max_seq_len,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=tuple(sorted(rope.items())),
            rope_type=rope_type,
            rope_freq_factors=freq_factors,
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm; torch's fused kernel (in bf16 it rounds once where HF rounds twice)."""

    ops: CpuOps | None = None  # fused CPU ops, set by LlamaForCausalLM.use_cpu_fast_paths

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(self, residual: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """residual += delta in place (skipped for None), then the norm of residual as a new tensor."""
        if self.ops is not None and self.ops.supports(residual):
            return self.ops.add_rms_norm_(residual, delta, self.weight, self.eps)
        if delta is not None:
            residual.add_(delta)
        return self(residual)


class Attention(nn.Module):
    """Fused-QKV self-attention; the backend stores K/V in the paged cache and attends."""

    ops: CpuOps | None = None

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.qkv_proj = Linear(args.hidden_size, q_size + 2 * kv_size, bias=args.qkv_bias)
        self.o_proj = Linear(q_size, args.hidden_size, bias=args.o_bias)
        self.scale = args.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        rope: RopeInputs,
        kv_cache: LayerKV | tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens, hq, hkv, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [T, (Hq + 2 Hkv) D]
        qk = rope.rotate(qkv[:, : (hq + hkv) * d].view(num_tokens, hq + hkv, d), self.ops)
        q, k = qk[:, :hq], qk[:, hq:]  # [T, Hq, D], [T, Hkv, D]
        v = qkv[:, (hq + hkv) * d :].view(num_tokens, hkv, d)
        # [T, Hq, D]; an int8 pool's layer also carries its scales
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, *kv_cache[2:])
        return self.o_proj(out.reshape(num_tokens, hq * d))


class MLP(nn.Module):
    """SwiGLU feed-forward with a fused gate/up projection."""

    ops: CpuOps | None = None

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_up_proj = Linear(args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.ops is not None and self.ops.supports(gate_up):
            return self.down_proj(self.ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; each residual add is fused with the norm that follows it."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, h, residual, rope, kv_cache, meta, backend, next_norm: RMSNorm) -> torch.Tensor:
        """h = input_layernorm(residual) in; residual updated in place; next_norm(residual) out."""
        h = self.post_attention_layernorm.add_and_norm(
            residual, self.self_attn(h, rope, kv_cache, meta, backend)
        )
        return next_norm.add_and_norm(residual, self.mlp(h))


class LlamaForCausalLM(nn.Module):
    """A decoder-only Llama-family model over a flattened batch of tokens."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        # the loaders build on the meta device (then `materialize`); there nn.Embedding's own init (normal_) and the
        # RoPE table would go through torch's reference ops, whose first call imports torch._dynamo (~2.5 s at
        # every model load): both are skipped on meta
        on_meta = torch.empty(0).is_meta
        weight = torch.empty(args.vocab_size, args.hidden_size)
        if not on_meta:
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # cast along with the weights: HF also rounds cos/sin to the activation dtype
        rope = torch.empty(args.max_seq_len, 2, args.head_dim) if on_meta else rope_cos_sin(args)
        self.register_buffer("rope_cache", rope, persistent=False)

    def materialize(self, device: torch.device) -> LlamaForCausalLM:
        """The model built on the meta device, given uninitialized storage on `device` (for the loader to fill),
        its LM head re-tied and its RoPE table computed. What `to_empty` does, but each tensor made by a plain
        factory call: to_empty's empty_like on meta tensors runs torch's reference ops, whose first use imports
        torch.fx's symbolic shapes (~1 s at every model load)."""
        for module in self.modules():
            for name, param in list(module._parameters.items()):
                if param is not None and param.is_meta:
                    storage = torch.empty(param.shape, dtype=param.dtype, device=device)
                    module._parameters[name] = nn.Parameter(storage, requires_grad=param.requires_grad)
            for name, buffer in list(module._buffers.items()):
                if buffer is not None and buffer.is_meta:
                    module._buffers[name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
        self.retie_and_rebuild_rope()
        return self

    def retie_and_rebuild_rope(self) -> None:
        """Re-tie lm_head and recompute the RoPE table from `args` (after `materialize`, or a change of args)."""
        # materialize replaces each module's parameter separately; a head in GGUF blocks has no float weight to tie, and
        # an embedding in blocks (QuantEmbedding) shares its blocks with a tied head already
        if (
            self.args.tie_word_embeddings
            and isinstance(self.lm_head, nn.Linear)
            and isinstance(self.embed_tokens, nn.Embedding)
        ):
            self.lm_head.weight = self.embed_tokens.weight
        self.rope_cache = rope_cos_sin(self.args).to(self.rope_cache.device, self.rope_cache.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[LayerKV] | list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, hidden] of every token in the flattened batch."""
        rope = RopeInputs.gather(self.rope_cache, positions)
        residual = self.embed_tokens(input_ids)  # [T, hidden], the residual stream, updated in place
        norms = [layer.input_layernorm for layer in self.layers] + [self.norm]
        h = norms[0].add_and_norm(residual, None)
        for layer, kv_cache, next_norm in zip(self.layers, kv_caches, norms[1:], strict=True):
            h = layer(h, residual, rope, kv_cache, meta, backend, next_norm)
        return h

    def use_cpu_fast_paths(self) -> tuple[int, bool]:
        """Prepack bf16 linear weights and attach the fused CPU ops (call once the weights are final).

        Returns (linears packed, fused ops attached). fp32 linears are not packed (oneDNN's fp32 GEMM is torch's
        own); the fused ops serve bf16 and fp32 activations alike.
        """
        num_packed = sum(m.pack() for m in self.modules() if isinstance(m, Linear))
        ops = load_cpu_ops() if self.norm.weight.dtype in SUPPORTED_DTYPES else None  # the model's dtype
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.ops = ops
        return num_packed, ops is not None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in fp32 for the selected hidden rows [N, hidden]."""
        return self.lm_head(hidden).float()

    def weight_slot(self, hf_name: str) -> tuple[str, int, int | None] | None:
        """Where an HF-named checkpoint tensor goes: (parameter name, first row, rows or None for all of it), with
        q/k/v and gate/up fused; None for a tensor the model does not keep (a tied head, rotary tables). The name
        need not be a parameter of this model (the caller checks)."""
        name = hf_name.removeprefix("model.")
        if "rotary_emb." in name or (name == "lm_head.weight" and self.args.tie_word_embeddings):
            return None
        args = self.args
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        shards = {
            "q_proj": ("qkv_proj", 0, q_size),
            "k_proj": ("qkv_proj", q_size, kv_size),
            "v_proj": ("qkv_proj", q_size + kv_size, kv_size),
            "gate_proj": ("gate_up_proj", 0, args.intermediate_size),
            "up_proj": ("gate_up_proj", args.intermediate_size, args.intermediate_size),
        }
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in shards:
            fused, offset, rows = shards[parts[-2]]
            return ".".join([*parts[:-2], fused, parts[-1]]), offset, rows
        return name, 0, None

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up; every parameter must be covered."""
        params = dict(self.named_parameters())
        loaded: dict[str, int] = {}  # parameter name -> rows filled
        for hf_name, tensor in named_tensors:
            slot = self.weight_slot(hf_name)
            if slot is None:
                continue
            name, offset, rows = slot
            if name not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in this model")
            target = params[name] if rows is None else params[name][offset : offset + rows]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{hf_name}: checkpoint shape {tuple(tensor.shape)} != {tuple(target.shape)}"
                )
            target.copy_(tensor)
            loaded[name] = loaded.get(name, 0) + tensor.shape[0]
        missing = [n for n, p in params.items() if loaded.get(n, 0) != p.shape[0]]
        if missing:
            raise ValueError(f"checkpoint does not cover parameters: {missing[:8]} ({len(missing)} in all)")
