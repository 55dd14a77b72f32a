"""Our own forward pass over a Hugging Face Qwen2/Qwen3/Llama model's weights, on CPU or CUDA.

Hugging Face's cache gives every row of a batch the same position, so it cannot
admit a new request next to half-finished ones. This runner reads the same
weights but keeps keys/values in a `SlotKVCache` where each row has its own
position: prefill writes a prompt into a slot, decode runs one token for every
running row in one batched pass (no per-row Python anywhere).

Qwen2 is Llama plus q/k/v biases; both are handled by reading whatever biases
the modules have. Qwen3 is Llama plus an RMSNorm over each head of q and k
(before RoPE). q/k/v and gate/up are fused into one matmul each, so the
fused copies are rebuilt by `refresh_weights()` after the model's weights change.

The runner works in the model's own device and dtype (the engine chooses them:
fp32 on CPU, bf16 on CUDA); norms are computed in fp32 and rounded back, as
Hugging Face's RMSNorm does. On CUDA, decode attention is PyTorch SDPA and the
decode step runs from captured CUDA graphs (`decode_graphs.py`); on CPU it stays
eager with plain matmuls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN

from tailflow.engines.models import SUPPORTED_MODEL_TYPES
from tailflow.engines.rollout.kv_cache import SlotKVCache


LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer; `*_b` are None where the checkpoint has no bias."""

    input_norm: torch.Tensor
    q_norm: torch.Tensor | None  # [head_dim], Qwen3 only
    k_norm: torch.Tensor | None
    qkv_w: torch.Tensor      # [(q_heads + 2 kv_heads) * head_dim, hidden]
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up_w: torch.Tensor  # [2 * intermediate, hidden]
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack the weights (and biases, zeros where one is missing) of linears sharing an input."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    if all(lin.bias is None for lin in linears):
        return weight, None
    weight_like = linears[0].weight
    biases = [lin.bias.detach() if lin.bias is not None
              else torch.zeros(lin.out_features, dtype=weight_like.dtype, device=weight_like.device)
              for lin in linears]
    return weight, torch.cat(biases)


def optional(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.detach()


def extract_layer(layer: nn.Module) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    qkv_w, qkv_b = fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up_w, gate_up_b = fuse_linears([mlp.gate_proj, mlp.up_proj])
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    return LayerWeights(
        input_norm=layer.input_layernorm.weight.detach(),
        q_norm=None if q_norm is None else q_norm.weight.detach(),
        k_norm=None if k_norm is None else k_norm.weight.detach(),
        qkv_w=qkv_w, qkv_b=qkv_b,
        o_w=attn.o_proj.weight.detach(), o_b=optional(attn.o_proj.bias),
        post_norm=layer.post_attention_layernorm.weight.detach(),
        gate_up_w=gate_up_w, gate_up_b=gate_up_b,
        down_w=mlp.down_proj.weight.detach(), down_b=optional(mlp.down_proj.bias),
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32, round to x's dtype, then scale: Hugging Face's RMSNorm, op for op."""
    return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in Hugging Face's rotate-half layout."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def sdpa_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          bias: torch.Tensor) -> torch.Tensor:
    """The CUDA decode attention: PyTorch SDPA with the additive mask, GQA inside the kernel call."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, enable_gqa=True)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """One query per row: q [B, heads, 1, D], keys/values [B, kv_heads, L, D] -> [B, heads, 1, D].

    The query heads sharing a KV head are one [groups, D] matrix, so GQA needs
    no repeated keys. Plain matmuls beat CPU SDPA here (its flash kernel is
    tuned for long queries, and was ~5x slower for one-token decode).
    """
    batch, num_heads, _, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(head_dim ** -0.5).add_(bias)
    return torch.matmul(torch.softmax(scores, dim=-1), values).view(batch, num_heads, 1, head_dim)


def place_model(model: PreTrainedModel, device: torch.device | str, dtype: torch.dtype) -> None:
    """Move `model` to `device` in place, its parameters to `dtype`, its buffers keeping theirs.

    `model.to(dtype=bf16)` would round the rotary module's `inv_freq` too, which Hugging Face keeps in fp32
    in a bf16 model: rounded, a position's angle is off by its position times bf16's error, and the cos
    table differed from Hugging Face's by up to 2.0 at position 8191 (found after the H200 run)."""
    model.to(device=device)
    for parameter in model.parameters():
        parameter.data = parameter.data.to(dtype)


def check_architecture(model: PreTrainedModel) -> None:
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"the native engine runs {'/'.join(SUPPORTED_MODEL_TYPES)} models, not '{config.model_type}'")
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        raise ValueError(f"the native engine has no sliding-window attention (layer_types={config.layer_types})")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type in LENGTH_DEPENDENT_ROPE:
        # One cos/sin table for all positions cannot follow a rope that rescales with the current length.
        raise ValueError(f"the native engine has no length-dependent rope (rope_type={rope_type!r})")


class ModelRunner:
    """Prefill and decode over a `SlotKVCache`, with weights read from `model` (already on its device/dtype).

    Position `max_seq_len - 1` of every slot is scratch: no request ever feeds a token there (a request
    holds at most `max_seq_len` tokens and its last one is never fed back), so padded decode rows and
    CUDA-graph warm-ups write there and nowhere else.
    """

    def __init__(self, model: PreTrainedModel, num_slots: int, max_seq_len: int, cuda_graphs: bool = True,
                 bucketed_decode: bool | None = None) -> None:
        """`bucketed_decode` (default: on CUDA) pads decode to bucket shapes (`decode_graphs.py`); with
        `cuda_graphs` and a CUDA device those shapes are captured as graphs, elsewhere they run eagerly."""
        from tailflow.engines.rollout.decode_graphs import DecodeGraphs

        check_architecture(model)
        config = model.config
        self.model = model.eval()
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.is_cuda = self.device.type == "cuda"
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.act = F.silu if config.hidden_act == "silu" else ACT2FN[config.hidden_act]
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.attention = sdpa_decode_attention if self.is_cuda else decode_attention
        bucketed = self.is_cuda if bucketed_decode is None else bucketed_decode
        self.graphs = DecodeGraphs(self, capture=cuda_graphs and self.is_cuda) if bucketed else None
        self.cache: SlotKVCache | None = None
        self.restore_memory()

    @property
    def is_released(self) -> bool:
        """True between `release_memory()` and `restore_memory()`."""
        return self.cache is None

    def release_memory(self) -> None:
        """Drop the KV cache, fused weights, rope tables and captured graphs; move the model to host memory.

        Every device tensor the runner made is unreferenced first, so moving the model really frees the
        weights' device memory (the fused copies' views would keep it). Idempotent."""
        if self.is_released:
            return
        self.cache = None
        self.embed = self.final_norm = self.lm_head = None
        self.layers = []
        self.positions = self.rows = self.cos = self.sin = None
        if self.graphs is not None:
            self.graphs.clear()
        self.model.to("cpu")
        if self.is_cuda:
            torch.cuda.empty_cache()

    def restore_memory(self) -> None:
        """Undo `release_memory()`: the model back on the runner's device and dtype, a fresh (zeroed) KV cache
        of the same shape, rope tables and fused weights rebuilt from the model as it is now. Idempotent."""
        if not self.is_released:
            return
        config = self.model.config
        place_model(self.model, self.device, self.dtype)
        self.positions = torch.arange(self.max_seq_len, device=self.device)
        self.rows = torch.arange(self.num_slots, device=self.device)
        self.cos, self.sin = self._rope_table()
        self.cache = SlotKVCache(config.num_hidden_layers, self.num_slots, self.num_kv_heads, self.max_seq_len,
                                 self.head_dim, dtype=self.dtype, device=self.device)
        self.refresh_weights()

    def _rope_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [max_seq_len, head_dim] from the model's own rotary module (any rope_type it supports),
        computed in fp32 and rounded to the model's dtype, as Hugging Face applies them."""
        with torch.inference_mode():
            probe = torch.zeros(1, dtype=torch.float32, device=self.device)
            cos, sin = self.model.model.rotary_emb(probe, self.positions[None])
        return cos[0].to(self.dtype).clone(), sin[0].to(self.dtype).clone()

    def refresh_weights(self) -> None:
        """Re-read (and re-fuse) the weights; call after the model's parameters change.

        Captured graphs read the old fused tensors, so they are dropped and captured again on use."""
        inner = self.model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.lm_head = self.model.lm_head.weight.detach()
        self.layers = [extract_layer(layer) for layer in inner.layers]
        if self.graphs is not None:
            self.graphs.clear()

    @torch.inference_mode()
    def prefill(self, token_ids: torch.Tensor, first_row: int) -> None:
        """Write keys/values of right-padded prompts [n, T] into rows first_row..first_row+n-1.

        Padding sits after each prompt, so the causal mask alone keeps real
        positions from seeing it; padded positions are overwritten by decode.
        """
        token_ids = token_ids.to(self.device)
        n, length = token_ids.shape

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_prefill(layer, first_row, k, v)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        self._layers(F.embedding(token_ids, self.embed), self.cos[:length], self.sin[:length], attend)

    @torch.inference_mode()
    def extend(self, token_ids: torch.Tensor, row: int, start: int) -> None:
        """Write keys/values of `token_ids` [T] at positions start..start+T-1 of `row`, attending to the
        positions 0..start-1 already cached there: a continued request's appended tokens (multi-turn), so the
        conversation before them is never computed again. One row per call (rows' starts differ)."""
        token_ids = token_ids.to(self.device)[None]
        length = token_ids.shape[1]
        end = start + length
        # query i (position start + i) sees keys 0..start + i
        visible = self.positions[:end][None] <= self.positions[start:end][:, None]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.k[layer, row, :, start:end] = k[0]
            self.cache.v[layer, row, :, start:end] = v[0]
            keys, values = self.cache.k[layer, row:row + 1, :, :end], self.cache.v[layer, row:row + 1, :, :end]
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, enable_gqa=True)

        self._layers(F.embedding(token_ids, self.embed), self.cos[start:end], self.sin[start:end], attend)

    @torch.inference_mode()
    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        """Logits [B, vocab] (fp32) for one token per running row 0..B-1, each at its own position.

        `max_len` is the longest row's length after this token: keys are trimmed to it (eager), or to its
        length bucket (bucketed, where rows are padded to a batch bucket too).
        """
        token_ids, positions = token_ids.to(self.device), positions.to(self.device)
        if self.graphs is not None:
            return self.graphs.run(token_ids, positions, max_len).float()
        return self.decode_rows(token_ids, positions, max_len).float()

    def decode_rows(self, token_ids: torch.Tensor, positions: torch.Tensor, key_len: int) -> torch.Tensor:
        """The decode step itself for rows 0..B-1 (B = len(token_ids)), keys read up to `key_len`: static
        shapes for fixed (B, key_len), so this is what a CUDA graph captures."""
        num_rows = token_ids.shape[0]
        index = self.cache.decode_index(self.rows[:num_rows], positions)
        bias = self._decode_bias(positions, key_len)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.cache.write_decode(layer, index, k, v)
            keys, values = self.cache.view(layer, num_rows, key_len)
            return self.attention(q, keys, values, bias)

        x = F.embedding(token_ids[:, None], self.embed)
        hidden = self._layers(x, self.cos[positions][:, None], self.sin[positions][:, None], attend)
        return F.linear(hidden[:, 0], self.lm_head)

    def _decode_bias(self, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        """Additive mask [B, 1, 1, max_len]: -inf on keys past each row's own position (fp32 on CPU, where
        scores are fp32; the model dtype on CUDA, as SDPA wants)."""
        is_future = self.positions[:max_len] > positions[:, None, None, None]
        dtype = self.dtype if self.is_cuda else torch.float32
        return torch.zeros(is_future.shape, dtype=dtype, device=self.device).masked_fill_(is_future, float("-inf"))

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend) -> torch.Tensor:
        """x [N, T, hidden], cos/sin broadcastable to [N, 1, T, head_dim] -> final-normed hidden [N, T, hidden]."""
        n, length, _ = x.shape
        num_qk = self.num_heads + self.num_kv_heads
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
        for index, w in enumerate(self.layers):
            h = rms_norm(x, w.input_norm, self.eps)
            qkv = F.linear(h, w.qkv_w, w.qkv_b).view(n, length, -1, self.head_dim).transpose(1, 2)
            qk = qkv[:, :num_qk]
            if w.q_norm is not None:
                qk = torch.cat([rms_norm(qk[:, :self.num_heads], w.q_norm, self.eps),
                                rms_norm(qk[:, self.num_heads:], w.k_norm, self.eps)], dim=1)
            qk = rotate(qk, cos, sin)
            out = attend(index, qk[:, :self.num_heads], qk[:, self.num_heads:], qkv[:, num_qk:])
            x = x + F.linear(out.transpose(1, 2).reshape(n, length, -1), w.o_w, w.o_b)
            h = rms_norm(x, w.post_norm, self.eps)
            gate, up = F.linear(h, w.gate_up_w, w.gate_up_b).chunk(2, dim=-1)
            x = x + F.linear(self.act(gate) * up, w.down_w, w.down_b)
        return rms_norm(x, self.final_norm, self.eps)
