"""Helpers of the Megatron tests (not a test module): random tiny HF models of each family, and gloo ranks.

`run_gloo_ranks` starts `world_size` processes (torch.multiprocessing spawn), joins them in a gloo process group,
runs `target(rank, world_size, *args)` in each and returns rank 0's result: one start per test, because every
process pays megatron-core's import.
"""
from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

FAMILY_CONFIGS = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}


def tiny_hf_model(family: str, seed: int = 1) -> torch.nn.Module:
    """A random 2-layer model of `family`: vocabulary 37 (odd: padded for 2 tensor-parallel ranks), 4 query heads
    over 2 kv heads, Qwen3 with head_dim 24 (not hidden / heads), Llama untied; weights perturbed so no bias or
    norm weight keeps its initial constant (a mixed-up tensor shows)."""
    fields = dict(vocab_size=37, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=family != "llama")
    if family == "qwen3":
        fields["head_dim"] = 24
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILY_CONFIGS[family](**fields)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out: str, target, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = target(rank, world_size, *args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def run_gloo_ranks(target, world_size: int, *args):
    """rank 0's `target(rank, world_size, *args)`; a failure in any rank raises here."""
    with tempfile.TemporaryDirectory() as scratch:
        out = str(Path(scratch) / "rank0.pt")
        mp.spawn(_rank_main, args=(world_size, _free_port(), out, target, args), nprocs=world_size)
        return torch.load(out, weights_only=False)


def megatron_parallel(tensor_parallel: int) -> None:
    """(Re)initialise megatron's model-parallel state for `tensor_parallel` on the running gloo group, with the CPU
    stand-in."""
    from megatron.core import parallel_state

    from tailflow.engines.train.megatron.cpu_stand_in import install_if_needed

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)
    install_if_needed(torch.device("cpu"))


def naive_fuse_qkv(q, k, v, shape):
    """A WRONG fused QKV on purpose (all queries, then all keys, then all values: Megatron wants them per group)."""
    return torch.cat([q, k, v])


def logit_errors(rank: int, world_size: int, warmstart_dir: str) -> dict[tuple[str, int, bool], float]:
    """Max |Megatron logits - HF logits| / max |HF logits| for every family, the shipped warm start, each
    tensor-parallel size 1 .. world_size, and (wrong_qkv True) with the QKV fused in the wrong order."""
    from tailflow.engines.train.megatron import convert, gpt
    from tailflow.engines.train.megatron.shape import ModelShape

    errors = {}
    for tensor_parallel in sorted({1, world_size}):
        megatron_parallel(tensor_parallel)
        tp_rank = rank % tensor_parallel
        for name in ("qwen2", "qwen3", "llama", "warmstart"):
            hf = (AutoModelForCausalLM.from_pretrained(warmstart_dir, dtype=torch.float32).eval()
                  if name == "warmstart" else tiny_hf_model(name))
            shape = ModelShape.from_hf_config(hf.config)
            ids = torch.randint(0, shape.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                expected = hf(input_ids=ids).logits
            for wrong_qkv in (False, True):
                fuse = convert.fuse_qkv
                convert.fuse_qkv = naive_fuse_qkv if wrong_qkv else fuse
                try:
                    state = convert.hf_to_megatron(hf.state_dict(), shape, tensor_parallel, tp_rank)
                finally:
                    convert.fuse_qkv = fuse
                model = gpt.build_gpt(shape, tensor_parallel)
                gpt.load_megatron_state(model, state)
                with torch.no_grad():
                    logits = gpt.gpt_logits(model.eval(), ids, shape.vocab_size)
                error = ((logits - expected).abs().max() / expected.abs().max()).item()
                errors[(name, tensor_parallel, wrong_qkv)] = error
    return errors


def naive_split_qkv(fused, shape):
    """`naive_fuse_qkv` undone (so the wrong layout round-trips and only Megatron's forward can tell)."""
    d = shape.head_dim
    return tuple(fused.split([shape.num_heads * d, shape.num_kv_heads * d, shape.num_kv_heads * d]))


ALIGNMENT_VARIANTS = {"fsdp2": ("fsdp2", 1), "megatron_tp2": ("megatron", 2), "megatron_tp1": ("megatron", 1),
                      "megatron_wrong_qkv": ("megatron", 2)}
"""variant -> (train backend, tensor parallel). On 2 ranks: FSDP2 over 2 ranks, Megatron as one tensor-parallel
group of 2, Megatron as 2 data-parallel replicas of 1, and Megatron TP=2 with its QKV fused wrongly on purpose."""


def aligned_steps(rank: int, world_size: int, model_dir: str, train_fields: dict, batches: list,
                  variants: tuple[str, ...]) -> dict[str, dict]:
    """Every variant trains the same batches from the same weights, one optimizer step each; per variant, the full
    HF weights before the first step ("initial") and per step ("steps"): pg_loss, grad_norm, entropy and the
    weights after it (rank 0). `train_fields`: the `train.*` settings every variant shares."""
    from tailflow.config import TrainConfig
    from tailflow.engines.train.batch import count_response_tokens, shard_across_ranks
    from tailflow.engines.train.megatron import convert
    from tailflow.engines.train.trainer import PolicyTrainer

    runs = {}
    for variant in variants:
        train_backend, tensor_parallel = ALIGNMENT_VARIANTS[variant]
        wrong = variant == "megatron_wrong_qkv"
        layout = (convert.fuse_qkv, convert.split_qkv)
        if wrong:
            convert.fuse_qkv, convert.split_qkv = naive_fuse_qkv, naive_split_qkv
        try:
            train = TrainConfig(backend=train_backend, tensor_parallel=tensor_parallel, num_workers=world_size,
                                **train_fields)
            trainer = PolicyTrainer(model_dir, train, rank=rank, world_size=world_size)
            initial, steps = trainer.full_state_dict(), []
            for samples in batches:
                replicas = world_size // tensor_parallel
                mine = shard_across_ranks(samples, replicas)[rank // tensor_parallel]
                stats = trainer.train_step(mine, count_response_tokens(samples), len(samples))
                steps.append(dict(pg_loss=stats.pg_loss, grad_norm=stats.grad_norm, entropy=stats.entropy,
                                  weights=trainer.full_state_dict()))
        finally:
            convert.fuse_qkv, convert.split_qkv = layout
        runs[variant] = {"initial": initial, "steps": steps}
        del trainer
    return runs


CRITIC_VARIANTS = {"fsdp2": ("fsdp2", 1), "megatron_tp2": ("megatron", 2), "megatron_tp1": ("megatron", 1)}
"""variant -> (train backend, tensor parallel), on 2 ranks, as `ALIGNMENT_VARIANTS`'s."""


def critic_returns(sample) -> tuple[float, ...]:
    """Targets that vary along a response and between responses (the value loss has something to fit)."""
    return tuple(float((len(sample.prompt_token_ids) + i) % 3) - 1.0 for i in range(sample.num_response_tokens))


def aligned_critic_steps(rank: int, world_size: int, model_dir: str, batches: list,
                         variants: tuple[str, ...]) -> dict[str, dict]:
    """Every variant's critic fits the same batches' `critic_returns` from the same weights, one update each.
    Per variant: "initial" (the full HF weights) and per step ("steps") the whole batch's values before the
    update, vf_loss, grad_norm, clip_fraction and the weights after it (rank 0). For each Megatron variant also
    "reloaded": the whole last batch's values from a fresh critic that loaded the trained one's checkpoint, and
    "values_after" the trained one's own."""
    from tailflow.config import TrainConfig
    from tailflow.engines.train.batch import TrainSample, count_response_tokens, shard_across_ranks
    from tailflow.engines.train.critic import CriticTrainer
    from tailflow.engines.train.updates import Update

    runs = {}
    for variant in variants:
        train_backend, tensor_parallel = CRITIC_VARIANTS[variant]
        train = TrainConfig(advantage="gae", backend=train_backend, tensor_parallel=tensor_parallel,
                            num_workers=world_size, lr=1e-3, max_tokens_per_micro_batch=256)
        critic = CriticTrainer(model_dir, train, rank=rank, world_size=world_size, backend="gloo")
        initial, steps = critic.value.full_state_dict(), []
        for samples in batches:
            mine = shard_across_ranks(samples, world_size // tensor_parallel)[rank // tensor_parallel]
            targets = [TrainSample(s.prompt_token_ids, s.response_token_ids, 0.0, values=v,
                                   token_advantages=(0.0,) * s.num_response_tokens, returns=critic_returns(s))
                       for s, v in zip(mine, critic.values(mine))]
            tokens = count_response_tokens(samples)
            values = critic.values(samples)
            stats = critic.train_updates(targets, [Update(tuple(range(len(mine))), tokens, len(samples), tokens)])
            steps.append(dict(values=values, vf_loss=stats.vf_loss, grad_norm=stats.grad_norm,
                              clip_fraction=stats.clip_fraction, weights=critic.value.full_state_dict()))
        runs[variant] = {"initial": initial, "steps": steps}
        if train_backend == "megatron":
            runs[variant]["values_after"] = critic.values(batches[-1])
            state = critic.state_for_checkpoint()
            del critic
            fresh = CriticTrainer(model_dir, train, rank=rank, world_size=world_size, backend="gloo")
            fresh.load_checkpoint(state)
            runs[variant]["reloaded"] = fresh.values(batches[-1])
            del fresh
        else:
            del critic
    return runs
