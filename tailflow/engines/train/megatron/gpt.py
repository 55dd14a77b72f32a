"""Megatron-core's GPTModel for a Qwen2 / Qwen3 / Llama shape: build, fill with converted weights, run to logits.

The local layer spec (megatron-core's own modules, no TransformerEngine), every
fusion off and every dropout 0: the model computes what the Hugging Face one
does, in fp32 like the FSDP2 trainer. The logits are gathered over the
tensor-parallel ranks (`parallel_output=False`), so every rank holds the full
[B, T, V] logits and the trainer's one loss code runs on them unchanged; the
gather's backward hands each rank the gradient of its vocabulary slice.

The critic's value model (`value_head`) is the same GPTModel with its output
layer replaced by `ValueHead`, a one-output linear layer held whole on every
rank.

Attention gets an explicit causal mask: megatron-core's default mask is
allocated on "cuda" by name. The batches are right-padded, so the causal mask
alone gives every real token exactly the keys Hugging Face's padding mask does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tailflow.engines.train.megatron.shape import ModelShape


def transformer_config(shape: ModelShape, tensor_parallel: int, dtype: torch.dtype = torch.float32):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_heads, num_query_groups=shape.num_kv_heads, kv_channels=shape.head_dim,
        normalization="RMSNorm", layernorm_epsilon=shape.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=shape.qkv_bias, qk_layernorm=shape.qk_norm,
        hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tensor_parallel,
        use_cpu_initialization=True, perform_initialization=False, params_dtype=dtype,
        bias_dropout_fusion=False, apply_rope_fusion=False, masked_softmax_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
    )


def use_no_op_rng_tracker() -> None:
    """megatron-core forks its CUDA random-number tracker around the attention dropout, and its default tracker
    refuses to fork ("cuda rng state model-parallel-rng is not added") until `model_parallel_cuda_manual_seed`
    has seeded it, which nothing here calls: on a GPU the first forward would fail (found by reading
    megatron-core 0.16.1, `dot_product_attention.py`; not yet run on a GPU). Every dropout here is 0, so no
    random number is ever drawn inside the fork: megatron's own no-op tracker (the one it builds for inference)
    serves on every device. The CPU stand-in installs the same one."""
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)


class ValueHead(torch.nn.Module):
    """GPTModel's output layer for a value model: one value per position, from a [1, H] weight and a bias that
    every tensor-parallel rank holds whole (one output is nothing to split; like the norms, each rank computes
    the same values and gets the same gradient, which the grad norm counts once). It is called as GPTModel calls
    its output layer and ignores the embedding weight GPTModel passes for tied models. Zeros until weights are
    loaded, as Hugging Face's value head starts (`models.load_value_model`)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, hidden_states: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: bool | None = None) -> tuple[torch.Tensor, None]:
        return F.linear(hidden_states, self.weight, self.bias), None


def build_gpt(shape: ModelShape, tensor_parallel: int, dtype: torch.dtype = torch.float32, value_head: bool = False):
    """This rank's GPTModel, uninitialised (the caller loads weights); needs megatron's parallel state.
    `value_head`: the critic's, its output layer a `ValueHead` (built tied, so no vocabulary-sized output weight
    is allocated only to be replaced)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    shape.check_tensor_parallel(tensor_parallel)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=shape.qk_norm)
    model = GPTModel(
        transformer_config(shape, tensor_parallel, dtype), spec,
        vocab_size=shape.padded_vocab_size(tensor_parallel), max_sequence_length=shape.max_position_embeddings,
        parallel_output=False, share_embeddings_and_output_weights=shape.tied_embeddings or value_head,
        position_embedding_type="rope", rotary_base=shape.rope_theta,
    )
    if value_head:
        model.output_layer = ValueHead(shape.hidden_size, dtype)
    mark_sharded_weights(model)
    return model


def mark_sharded_weights(model: torch.nn.Module) -> None:
    """Mark each tensor-parallel weight as megatron-core does (`tensor_model_parallel`, `partition_dim`).

    megatron-core 0.16.1 sets these marks only where it initialises the weight itself; with
    `perform_initialization=False` (the weights are loaded) they are missing, so every rank's shard looks like a
    replicated tensor and a grad norm that counts replicated tensors on one rank only loses the other ranks'
    shards (found by tests/test_megatron_alignment.py: the TP=2 grad norm was about half of FSDP2's)."""
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        set_tensor_model_parallel_attributes,
    )

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is None:
            continue
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=0, stride=1)
        elif isinstance(module, RowParallelLinear):
            set_tensor_model_parallel_attributes(weight, is_parallel=True, dim=1, stride=1)


@torch.no_grad()
def load_megatron_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` (this rank's shard, `convert.hf_to_megatron`) into the parameters; the names must match."""
    parameters = dict(model.named_parameters())
    if sorted(parameters) != sorted(state):
        missing, extra = sorted(set(parameters) - set(state)), sorted(set(state) - set(parameters))
        raise KeyError(f"Megatron weights do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    for name, parameter in parameters.items():
        if parameter.shape != state[name].shape:
            raise ValueError(f"{name}: the model's shard is {tuple(parameter.shape)}, the weights "
                             f"{tuple(state[name].shape)} (another tensor-parallel size?)")
        parameter.copy_(state[name])


def gpt_logits(model: torch.nn.Module, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, T] token ids -> [B, T, vocab_size] logits (the padded vocabulary's extra columns cut off; a value model's
    [B, T, 1] values with vocab_size 1)."""
    width = input_ids.shape[1]
    positions = torch.arange(width, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
    causal = torch.triu(torch.ones(width, width, dtype=torch.bool, device=input_ids.device), diagonal=1)
    logits = model(input_ids, positions, causal[None, None])
    return logits[..., :vocab_size]
