"""HF <-> Megatron conversion (Qwen2, Qwen3, Llama, the shipped warm start) and the CPU stand-in's decision.

The round trip is checked bit for bit without megatron-core (the conversion is pure tensor reshuffling). The
layout itself is checked against megatron-core's own forward on 2 gloo processes, at tensor parallel 1 and 2:
the converted model's logits must equal Hugging Face's, and a QKV fused in the wrong order must not.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from megatron_ranks import logit_errors, run_gloo_ranks, tiny_hf_model
from tailflow.engines.train.megatron import cpu_stand_in
from tailflow.engines.train.megatron.convert import hf_to_megatron, megatron_to_hf
from tailflow.engines.train.megatron.shape import ModelShape, UnsupportedForMegatron

torch.set_num_threads(1)

FAMILIES = ("qwen2", "qwen3", "llama")


@pytest.fixture(scope="module")
def warmstart_dir() -> str:
    from importlib import resources

    return str(resources.files("tailflow") / "assets" / "warmstart")  # driver/inputs.shipped_warmstart_dir's


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("family", [*FAMILIES, "warmstart"])
@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_round_trip_is_bit_exact(family, tensor_parallel, warmstart_dir):
    model = (AutoModelForCausalLM.from_pretrained(warmstart_dir, dtype=torch.float32) if family == "warmstart"
             else tiny_hf_model(family))
    shape = ModelShape.from_hf_config(model.config)
    hf_state = model.state_dict()
    shards = [hf_to_megatron(hf_state, shape, tensor_parallel, rank) for rank in range(tensor_parallel)]
    back = megatron_to_hf(shards, shape)
    assert_bit_equal(back, hf_state)
    assert all(tensor.data_ptr() != hf_state[name].data_ptr() for name, tensor in back.items())  # copies


def test_shards_split_heads_groups_and_vocabulary():
    model = tiny_hf_model("qwen2")
    shape = ModelShape.from_hf_config(model.config)
    full, half = hf_to_megatron(model.state_dict(), shape, 1), hf_to_megatron(model.state_dict(), shape, 2, 1)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert full[qkv].shape == (4 * 16 + 2 * 2 * 16, 64) and half[qkv].shape == (full[qkv].shape[0] // 2, 64)
    # rank 1 holds kv group 1: its 2 query heads, then k_1, then v_1
    q, k, v = (model.state_dict()[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(half[qkv], torch.cat([q[32:64], k[16:32], v[16:32]]))
    embedding = half["embedding.word_embeddings.weight"]
    assert embedding.shape == (19, 64) and torch.equal(embedding[-1], torch.zeros(64))  # 37 padded to 38
    assert "output_layer.weight" not in half  # tied
    fc1 = half["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = (model.state_dict()[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up"))
    assert torch.equal(fc1, torch.cat([gate[48:], up[48:]]))


def test_unsupported_models_are_refused_naming_the_field():
    config = tiny_hf_model("llama").config
    config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}
    with pytest.raises(UnsupportedForMegatron, match="rope_type"):
        ModelShape.from_hf_config(config)
    config = tiny_hf_model("llama").config
    config.attention_bias = True
    with pytest.raises(UnsupportedForMegatron, match="attention_bias"):
        ModelShape.from_hf_config(config)
    with pytest.raises(UnsupportedForMegatron, match="model_type"):
        ModelShape.from_hf_config(AutoConfig.for_model("gpt2"))
    shape = ModelShape.from_hf_config(tiny_hf_model("qwen3").config)
    with pytest.raises(UnsupportedForMegatron, match="num_key_value_heads"):
        hf_to_megatron(tiny_hf_model("qwen3").state_dict(), shape, 4)


def test_megatron_forward_equals_hugging_face_and_a_wrong_qkv_split_does_not(warmstart_dir):
    """megatron-core's GPTModel, loaded with converted weights, computes Hugging Face's logits (fp32; the
    attention and rotary arithmetic differ in order only) at tensor parallel 1 and 2; the same weights with
    the QKV fused the naive way (all q, all k, all v) are far off: the check can fail."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    errors = run_gloo_ranks(logit_errors, 2, warmstart_dir)
    assert len(errors) == 2 * 4 * 2
    for (name, tensor_parallel, wrong_qkv), error in errors.items():
        if wrong_qkv:
            assert error > 0.05, (name, tensor_parallel)
        else:
            assert error < 1e-5, (name, tensor_parallel)


def test_cpu_stand_in_applies_only_without_a_gpu(monkeypatch):
    assert cpu_stand_in.applies("cpu", cuda_available=False)
    assert not cpu_stand_in.applies("cuda", cuda_available=True)
    with pytest.raises(RuntimeError, match="GPU"):
        cpu_stand_in.applies("cpu", cuda_available=True)  # CPU weights beside megatron's GPU buffers: refused
    current_device = torch.cuda.current_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with a GPU, as far as it can tell
    assert cpu_stand_in.install_if_needed(torch.device("cuda")) is False
    assert torch.cuda.current_device is current_device and not cpu_stand_in.is_installed()


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_a_value_models_round_trip_keeps_its_head_on_every_rank_and_no_lm_head(family):
    """The critic's layout (value_head): the one-output head is whole on every tensor-parallel rank, a tied
    model's value model gets no lm_head back, and the round trip is bit exact (llama: untied)."""
    from transformers import AutoModelForTokenClassification

    config = tiny_hf_model(family).config
    config.num_labels = 1
    torch.manual_seed(3)
    value_model = AutoModelForTokenClassification.from_config(config).eval()
    hf_state = value_model.state_dict()
    shape = ModelShape.from_hf_config(config)
    shards = [hf_to_megatron(hf_state, shape, 2, rank, value_head=True) for rank in range(2)]
    assert all(torch.equal(shard["output_layer.weight"], hf_state["score.weight"]) for shard in shards)
    assert all(torch.equal(shard["output_layer.bias"], hf_state["score.bias"]) for shard in shards)
    back = megatron_to_hf(shards, shape, value_head=True)
    assert "lm_head.weight" not in back
    assert_bit_equal(back, hf_state)
