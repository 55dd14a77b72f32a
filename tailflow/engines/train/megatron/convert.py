"""Hugging Face <-> Megatron weights, with tensor-parallel sharding, both ways and bit for bit.

Pure tensor reshuffling (views, cat, chunk, copies): no arithmetic touches a
value, so HF -> Megatron -> HF returns the same bits. The layouts:

    HF (per layer)                          Megatron (per layer, rank r of TP ranks)
    q_proj [nq*d, H], k_proj / v_proj       self_attention.linear_qkv [(nq+2nkv)*d/TP, H]: for each of this
      [nkv*d, H] (and their biases, Qwen2)    rank's kv groups g: its nq/nkv query heads, k_g, v_g (and bias)
    q_norm / k_norm [d] (Qwen3)             self_attention.q_layernorm / k_layernorm [d] (every rank)
    o_proj [H, nq*d]                        self_attention.linear_proj [H, nq*d/TP]: columns of this rank's heads
    gate_proj, up_proj [F, H]               mlp.linear_fc1 [2F/TP, H]: this rank's gate rows, then its up rows
    down_proj [H, F]                        mlp.linear_fc2 [H, F/TP]
    input_ / post_attention_layernorm [H]   input_layernorm / pre_mlp_layernorm [H] (every rank)
    embed_tokens, lm_head [V, H]            embedding.word_embeddings, output_layer [V'/TP, H], V' the vocabulary
                                            padded to a multiple of TP with zero rows; no output_layer when tied
    score [1, H] and its bias [1]           output_layer.weight / .bias [1, H], [1] (every rank): the critic's
      (a value model, no lm_head)             value head (`gpt.ValueHead`), whatever the policy's tying

Heads are grouped contiguously in HF's grouped-query attention (query head h
reads kv head h // (nq/nkv)), so the group-major fused QKV cut into TP equal
parts gives rank r its query heads, their kv heads and o_proj's matching
columns. `tests/test_megatron_convert.py` checks the layout against Megatron's
own forward (a QKV fused in the wrong order must fail it), not only the round
trip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from tailflow.engines.train.megatron.shape import ModelShape

HF_TIED_HEAD = "lm_head.weight"
HF_VALUE_HEAD = ("score.weight", "score.bias")
"""A Hugging Face token-classification model's head of one output: the critic's (`models.load_value_model`)."""


@dataclass(frozen=True)
class WeightMap:
    """One Megatron tensor and the Hugging Face tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    kind: str
    """How it is fused and sharded: replicated | row | qkv | gate_up | vocab."""


def weight_maps(shape: ModelShape, value_head: bool = False) -> list[WeightMap]:
    """`value_head`: the critic's layout, the backbone and a replicated one-output head instead of the vocabulary's."""
    maps = [WeightMap("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in range(shape.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        attention = hf + "self_attn."
        maps += [
            WeightMap(mg + "input_layernorm.weight", (hf + "input_layernorm.weight",), "replicated"),
            WeightMap(mg + "self_attention.linear_qkv.weight",
                      tuple(f"{attention}{p}_proj.weight" for p in "qkv"), "qkv"),
            WeightMap(mg + "self_attention.linear_proj.weight", (attention + "o_proj.weight",), "row"),
            WeightMap(mg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), "replicated"),
            WeightMap(mg + "mlp.linear_fc1.weight", (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
                      "gate_up"),
            WeightMap(mg + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), "row"),
        ]
        if shape.qkv_bias:
            maps.append(WeightMap(mg + "self_attention.linear_qkv.bias",
                                  tuple(f"{attention}{p}_proj.bias" for p in "qkv"), "qkv"))
        if shape.qk_norm:
            maps += [WeightMap(mg + f"self_attention.{p}_layernorm.weight", (f"{attention}{p}_norm.weight",),
                               "replicated") for p in "qk"]
    maps.append(WeightMap("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
    if value_head:
        maps += [WeightMap(f"output_layer.{part}", (hf,), "replicated")
                 for part, hf in zip(("weight", "bias"), HF_VALUE_HEAD)]
    elif not shape.tied_embeddings:
        maps.append(WeightMap("output_layer.weight", (HF_TIED_HEAD,), "vocab"))
    return maps


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """[nq*d, ...], [nkv*d, ...], [nkv*d, ...] -> [(nq+2nkv)*d, ...], group-major: (q heads of g, k_g, v_g) per g."""
    groups, d, rest = shape.num_kv_heads, shape.head_dim, q.shape[1:]
    parts = (q.reshape(groups, shape.heads_per_group * d, *rest), k.reshape(groups, d, *rest),
             v.reshape(groups, d, *rest))
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(fused: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fuse_qkv` undone."""
    groups, d, rest = shape.num_kv_heads, shape.head_dim, fused.shape[1:]
    grouped = fused.reshape(groups, (shape.heads_per_group + 2) * d, *rest)
    q, k, v = grouped.split([shape.heads_per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def to_megatron_shards(kind: str, tensors: Sequence[torch.Tensor], shape: ModelShape,
                       tensor_parallel: int) -> list[torch.Tensor]:
    """The TP ranks' shards of one Megatron tensor made from its HF tensors."""
    if kind == "replicated":
        return [tensors[0]] * tensor_parallel
    if kind == "row":
        return list(tensors[0].chunk(tensor_parallel, dim=1))
    if kind == "qkv":
        return list(fuse_qkv(*tensors, shape).chunk(tensor_parallel, dim=0))
    if kind == "gate_up":
        gates, ups = (t.chunk(tensor_parallel, dim=0) for t in tensors)
        return [torch.cat(pair, dim=0) for pair in zip(gates, ups)]
    if kind == "vocab":
        weight = tensors[0]
        padding = weight.new_zeros(shape.padded_vocab_size(tensor_parallel) - weight.shape[0], *weight.shape[1:])
        return list(torch.cat([weight, padding]).chunk(tensor_parallel, dim=0))
    raise ValueError(f"unknown weight kind {kind!r}")


def from_megatron_shards(kind: str, shards: Sequence[torch.Tensor], shape: ModelShape) -> list[torch.Tensor]:
    """`to_megatron_shards` undone: the HF tensors, in `WeightMap.hf`'s order."""
    if kind == "replicated":
        return [shards[0]]
    if kind == "row":
        return [torch.cat(list(shards), dim=1)]
    if kind == "qkv":
        return list(split_qkv(torch.cat(list(shards), dim=0), shape))
    if kind == "gate_up":
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return [torch.cat([half[0] for half in halves]), torch.cat([half[1] for half in halves])]
    if kind == "vocab":
        return [torch.cat(list(shards), dim=0)[:shape.vocab_size]]
    raise ValueError(f"unknown weight kind {kind!r}")


def hf_to_megatron(hf_state: dict[str, torch.Tensor], shape: ModelShape, tensor_parallel: int = 1,
                   rank: int = 0, value_head: bool = False) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank `rank`'s Megatron state dict (fresh contiguous copies) from a full HF state dict
    (`value_head`: a value model's)."""
    shape.check_tensor_parallel(tensor_parallel)
    maps = weight_maps(shape, value_head)
    missing = [name for mapping in maps for name in mapping.hf if name not in hf_state]
    if missing:
        raise KeyError(f"the {shape.family} state dict lacks {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    return {mapping.megatron: to_megatron_shards(mapping.kind, [hf_state[n] for n in mapping.hf], shape,
                                                 tensor_parallel)[rank].contiguous().clone()
            for mapping in maps}


def megatron_to_hf(shards: Sequence[dict[str, torch.Tensor]], shape: ModelShape,
                   value_head: bool = False) -> dict[str, torch.Tensor]:
    """The full HF state dict (fresh copies) from every tensor-parallel rank's Megatron state dict, in rank order.
    Tied embeddings: `lm_head.weight` is the embedding tensor itself, as a tied HF model's state dict has it (a
    value model has no lm_head)."""
    hf_state = {}
    for mapping in weight_maps(shape, value_head):
        tensors = from_megatron_shards(mapping.kind, [shard[mapping.megatron] for shard in shards], shape)
        hf_state.update((name, tensor.contiguous().clone()) for name, tensor in zip(mapping.hf, tensors))
    if shape.tied_embeddings and not value_head:
        hf_state[HF_TIED_HEAD] = hf_state["model.embed_tokens.weight"]
    return hf_state
