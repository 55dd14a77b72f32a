"""What Megatron needs to know about a Hugging Face causal LM, read once from its config.

Qwen2, Qwen3 and Llama are one architecture to Megatron (pre-norm RMSNorm,
rotary embeddings, grouped-query attention, SwiGLU MLP); they differ in three
switches: a bias on q/k/v (Qwen2), an RMSNorm on each head's queries and keys
(Qwen3), and tied input and output embeddings (any of them). Anything else
Megatron's GPTModel would compute differently from the Hugging Face model is
refused here, naming the config field, rather than trained wrongly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAMILIES = ("qwen2", "qwen3", "llama")


class UnsupportedForMegatron(ValueError):
    """A model the Megatron backend would not compute like its Hugging Face original."""


@dataclass(frozen=True)
class ModelShape:
    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    qkv_bias: bool
    """Qwen2: q, k and v projections carry a bias (o_proj does not)."""
    qk_norm: bool
    """Qwen3: RMSNorm over each head's query and key (a [head_dim] weight each) before the rotary embedding."""
    tied_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        """Megatron splits the vocabulary evenly over the tensor-parallel ranks: the vocabulary rounded up to a
        multiple of them. The extra rows are zeros and their logits are cut off before any softmax."""
        return -(-self.vocab_size // tensor_parallel) * tensor_parallel

    def check_tensor_parallel(self, tensor_parallel: int) -> None:
        """Each rank must hold whole key/value groups (with their query heads) and an equal MLP slice."""
        for name, count in (("num_key_value_heads", self.num_kv_heads), ("intermediate_size", self.ffn_hidden_size)):
            if count % tensor_parallel:
                raise UnsupportedForMegatron(f"tensor parallel size {tensor_parallel} does not divide the model's "
                                             f"{name} ({count})")

    @classmethod
    def from_hf_config(cls, config: Any) -> "ModelShape":
        family = config.model_type
        if family not in FAMILIES:
            raise UnsupportedForMegatron(f"model_type {family!r}: the Megatron backend converts {', '.join(FAMILIES)}")
        refuse_unsupported(config)
        num_heads = config.num_attention_heads
        return cls(
            family=family,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            ffn_hidden_size=config.intermediate_size,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            vocab_size=config.vocab_size,
            qkv_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            tied_embeddings=bool(config.tie_word_embeddings),
            rms_norm_eps=float(config.rms_norm_eps),
            rope_theta=float(rope_parameters(config).get("rope_theta", 10000.0)),
            max_position_embeddings=config.max_position_embeddings,
        )


def rope_parameters(config: Any) -> dict:
    """transformers 5 keeps theta and the scaling type in `rope_parameters`; older configs in `rope_theta` /
    `rope_scaling`."""
    found = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if "rope_theta" not in found and getattr(config, "rope_theta", None) is not None:
        found["rope_theta"] = config.rope_theta
    return found


def refuse_unsupported(config: Any) -> None:
    """The features Megatron's GPTModel (local layer spec) would compute differently, each named."""
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedForMegatron(f"hidden_act {config.hidden_act!r}: only silu (SwiGLU) is converted")
    rope_type = rope_parameters(config).get("rope_type", "default")
    if rope_type != "default":
        raise UnsupportedForMegatron(f"rope_parameters.rope_type {rope_type!r}: only unscaled rotary embeddings "
                                     "are converted")
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedForMegatron("use_sliding_window true: Megatron's local attention is full causal attention")
    if config.model_type != "qwen2" and getattr(config, "attention_bias", False):
        raise UnsupportedForMegatron("attention_bias true: o_proj's bias has no place in Megatron's layout here")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedForMegatron("mlp_bias true: the MLP biases are not converted")
