"""The native rollout engine against Hugging Face's own forward pass and generate().

Models are tiny and randomly initialised (norms and biases perturbed too, so a
missed bias or norm weight shows up); expected values always come from the HF
model itself, never from hard-coded outputs.
"""
from __future__ import annotations

import pickle

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from tailflow.engines.models import UnsupportedModelError
from tailflow.engines.rollout import (
    Completion,
    FinishReason,
    NativeEngine,
    Request,
    RolloutWorker,
    SamplingParams,
)

VOCAB = 40
EOS = 1


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """Qwen2: q/k/v biases, GQA 4:2, tied embeddings."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=EOS, pad_token_id=0, rms_norm_eps=1e-5)
    model = Qwen2ForCausalLM(config).eval()
    perturb(model, seed)
    return model


def tiny_llama(seed: int = 0, biased: bool = False) -> LlamaForCausalLM:
    """Llama: MQA (1 KV head), head_dim != hidden/heads, untied head, other rope theta; biases optional."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=EOS, pad_token_id=0, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                         attention_bias=biased, mlp_bias=biased)
    model = LlamaForCausalLM(config).eval()
    perturb(model, seed)
    return model


MODELS = {"qwen2": tiny_qwen2, "llama": tiny_llama, "llama_biased": lambda: tiny_llama(biased=True)}


def prompts(lengths: list[int], seed: int = 0) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(2, VOCAB, (n,), generator=generator).tolist()) for n in lengths]


def requests(prompt_list, **params) -> list[Request]:
    return [Request(f"r{i}", p, SamplingParams(**params)) for i, p in enumerate(prompt_list)]


def reference_logprobs(model, completion: Completion) -> torch.Tensor:
    """log_softmax of a full forward at each response position, taken at the response's tokens."""
    ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(completion.prompt_token_ids) - 1
    positions = torch.arange(start, start + len(completion.token_ids))
    return logprobs[positions, torch.tensor(completion.token_ids)]


def greedy_tokens(model, prompt, n: int) -> list[int]:
    engine = NativeEngine(model, num_slots=1, max_seq_len=128, eos_token_ids=())
    return list(engine.generate([Request("g", prompt, SamplingParams(temperature=0, max_new_tokens=n))])[0].token_ids)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "llama_biased"])
def test_logprobs_match_full_forward_under_continuous_batching(kind):
    model = MODELS[kind]()
    engine = NativeEngine(model, num_slots=2, max_seq_len=64, seed=3, eos_token_ids=())
    lengths = [3, 11, 1, 7, 20]
    engine.submit([Request(f"r{i}", p, SamplingParams(temperature=1.0, max_new_tokens=4 + 3 * i))
                   for i, p in enumerate(prompts(lengths))])
    completions, joined_beside_running = [], False
    while engine.has_unfinished():
        before = {seq.request_id for seq in engine.scheduler.running}
        completions += engine.step()
        after = {seq.request_id for seq in engine.scheduler.running}
        joined_beside_running |= bool(after - before) and bool(after & before)
    assert joined_beside_running, "no request was admitted while another was mid-generation"
    assert sorted(c.request_id for c in completions) == [f"r{i}" for i in range(5)]
    for c in completions:
        assert len(c.token_ids) == len(c.logprobs) == 4 + 3 * int(c.request_id[1:])
        torch.testing.assert_close(torch.tensor(c.logprobs), reference_logprobs(model, c), atol=1e-4, rtol=0)
    stats = engine.stats()
    assert stats.tokens_generated == sum(len(c.token_ids) for c in completions)
    assert stats.busy_slot_steps == stats.tokens_generated
    assert stats.steps < stats.tokens_generated  # rows decoded together


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_greedy_matches_hf_generate(kind):
    model = MODELS[kind]()
    prompt_list = prompts([2, 9, 5, 14], seed=1)
    engine = NativeEngine(model, num_slots=3, max_seq_len=64)
    by_id = {c.request_id: c for c in engine.generate(requests(prompt_list, temperature=0, max_new_tokens=12))}
    for i, prompt in enumerate(prompt_list):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=12, eos_token_id=EOS, pad_token_id=0)
        expected = out[0, len(prompt):].tolist()
        if EOS in expected:
            expected = expected[: expected.index(EOS) + 1]
        assert list(by_id[f"r{i}"].token_ids) == expected


def test_abort_frees_the_slot_at_once():
    engine = NativeEngine(tiny_qwen2(), num_slots=1, max_seq_len=64, eos_token_ids=())
    engine.submit(requests(prompts([4, 6, 3]), max_new_tokens=30))
    engine.step()
    engine.step()
    assert (engine.stats().num_running, engine.stats().num_waiting) == (1, 2)
    aborted = engine.abort(["r0", "r2", "never-submitted"])
    assert [c.request_id for c in aborted] == ["r0", "r2"]
    assert all(c.finish_reason is FinishReason.ABORT for c in aborted)
    assert len(aborted[0].token_ids) == len(aborted[0].logprobs) == 2  # the partial response
    assert aborted[1].token_ids == ()  # was still waiting
    assert (engine.stats().num_running, engine.stats().num_waiting) == (0, 1)
    engine.step()
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.steps, stats.busy_slot_steps) == (1, 0, 3, 3)
    assert [seq.request_id for seq in engine.scheduler.running] == ["r1"]


def test_abort_in_a_full_batch_keeps_the_other_rows_right():
    """Aborting a middle row moves the last row into its slot; its cache must move with it."""
    model = tiny_llama()
    engine = NativeEngine(model, num_slots=4, max_seq_len=64, eos_token_ids=())
    engine.submit(requests(prompts([5, 9, 2, 12]), temperature=1.0, max_new_tokens=10))
    for _ in range(3):
        engine.step()
    engine.abort(["r1"])
    rest = engine.generate([])
    assert sorted(c.request_id for c in rest) == ["r0", "r2", "r3"]
    for c in rest:
        torch.testing.assert_close(torch.tensor(c.logprobs), reference_logprobs(model, c), atol=1e-4, rtol=0)


def test_seeded_runs_are_repeatable_and_seeds_matter():
    model = tiny_qwen2()
    prompt_list = prompts([3, 8, 5, 2, 6], seed=2)

    def run(seed: int) -> list[Completion]:
        engine = NativeEngine(model, num_slots=2, max_seq_len=64, seed=seed, eos_token_ids=())
        reqs = requests(prompt_list, temperature=1.0, top_p=0.9, max_new_tokens=15)
        reqs[0] = Request("own-seed", prompt_list[0], SamplingParams(temperature=0.7, max_new_tokens=15, seed=11))
        return sorted(engine.generate(reqs), key=lambda c: c.request_id)

    first, again, other = run(5), run(5), run(6)
    assert [(c.token_ids, c.logprobs) for c in first] == [(c.token_ids, c.logprobs) for c in again]
    derived = [c.token_ids for c in first if c.request_id != "own-seed"]
    assert derived != [c.token_ids for c in other if c.request_id != "own-seed"]
    # a request with its own seed does not depend on the engine seed
    assert first[0].request_id == "own-seed" and first[0].token_ids == other[0].token_ids


def test_finish_reasons():
    model = tiny_llama()
    prompt = prompts([6], seed=4)[0]
    greedy = greedy_tokens(model, prompt, 12)
    target = greedy[3]
    first = greedy.index(target)

    def finish(eos=(), **params) -> Completion:
        engine = NativeEngine(model, num_slots=1, max_seq_len=64, eos_token_ids=eos)
        return engine.generate([Request("x", prompt, SamplingParams(temperature=0, **params))])[0]

    eos = finish(eos=(target,), max_new_tokens=12)
    assert (eos.finish_reason, list(eos.token_ids)) == (FinishReason.EOS, greedy[: first + 1])
    stop = finish(max_new_tokens=12, stop_token_ids=(target,))
    assert (stop.finish_reason, list(stop.token_ids)) == (FinishReason.STOP, greedy[: first + 1])
    pair = tuple(greedy[4:6])
    end = next(i + 2 for i in range(len(greedy) - 1) if tuple(greedy[i:i + 2]) == pair)
    seq = finish(max_new_tokens=12, stop_sequences=((VOCAB + 5, VOCAB + 6), pair))
    assert (seq.finish_reason, list(seq.token_ids)) == (FinishReason.STOP, greedy[:end])
    length = finish(max_new_tokens=5)
    assert (length.finish_reason, list(length.token_ids)) == (FinishReason.LENGTH, greedy[:5])
    assert NativeEngine(model, num_slots=1, max_seq_len=8).eos_token_ids == {EOS}


def test_load_weights_refused_in_flight_then_changes_outputs():
    model = tiny_qwen2(seed=0)
    engine = NativeEngine(model, num_slots=2, max_seq_len=64, eos_token_ids=())
    prompt_list = prompts([4, 7], seed=5)
    before = engine.generate(requests(prompt_list, temperature=0, max_new_tokens=10))
    assert {c.weight_version for c in before} == {0}

    new_weights = {k: v for k, v in tiny_qwen2(seed=1).state_dict().items() if k != "lm_head.weight"}  # tied
    engine.submit(requests(prompt_list[:1], max_new_tokens=5))
    with pytest.raises(RuntimeError, match="in flight|running"):
        engine.load_weights(new_weights, version=3)
    engine.generate([])
    with pytest.raises(KeyError, match="model.norm.weight"):
        engine.load_weights({k: v for k, v in new_weights.items() if k != "model.norm.weight"}, version=3)
    assert engine.weight_version == 0

    engine.load_weights(new_weights, version=3)
    after = engine.generate(requests(prompt_list, temperature=0, max_new_tokens=10))
    assert {c.weight_version for c in after} == {3} and engine.stats().weight_version == 3
    assert sorted(c.token_ids for c in after) != sorted(c.token_ids for c in before)
    reference = tiny_qwen2(seed=1)
    for c in after:
        torch.testing.assert_close(torch.tensor(c.logprobs), reference_logprobs(reference, c), atol=1e-4, rtol=0)


def test_top_k_one_and_tiny_top_p_equal_greedy():
    model = tiny_llama()
    prompt_list = prompts([3, 10, 6], seed=6)

    def tokens(**params) -> list[tuple[int, ...]]:
        engine = NativeEngine(model, num_slots=3, max_seq_len=64, seed=9, eos_token_ids=())
        return [c.token_ids for c in sorted(engine.generate(requests(prompt_list, max_new_tokens=12, **params)),
                                            key=lambda c: c.request_id)]

    greedy = tokens(temperature=0)
    assert tokens(temperature=1.0, top_k=1) == greedy
    assert tokens(temperature=1.5, top_p=1e-6) == greedy
    assert tokens(temperature=1.0) != greedy


def test_top_k_and_top_p_only_sample_inside_the_filter():
    model = tiny_qwen2()
    prompt_list = prompts([4, 9], seed=7)
    engine = NativeEngine(model, num_slots=2, max_seq_len=96, seed=1, eos_token_ids=())
    for params in ({"top_k": 3}, {"top_p": 0.5}):
        for c in engine.generate(requests(prompt_list, temperature=1.0, max_new_tokens=40, **params)):
            ids = torch.tensor([c.prompt_token_ids + c.token_ids])
            with torch.no_grad():
                probs = torch.softmax(model(ids).logits[0], dim=-1)
            start = len(c.prompt_token_ids) - 1
            for offset, token in enumerate(c.token_ids):
                row = probs[start + offset]
                rank = int((row > row[token]).sum())
                if "top_k" in params:
                    assert rank < 3
                else:
                    assert float(row[row > row[token]].sum()) < 0.5 + 1e-5


def test_submit_validation():
    engine = NativeEngine(tiny_qwen2(), num_slots=2, max_seq_len=20)
    with pytest.raises(ValueError, match="'too-long'.*exceeds.*20"):
        engine.submit([Request("too-long", (3,) * 10, SamplingParams(max_new_tokens=11))])
    engine.submit([Request("a", (3,) * 10, SamplingParams(max_new_tokens=10))])
    with pytest.raises(ValueError, match="'a'.*duplicate"):
        engine.submit([Request(rid, (4,), SamplingParams(max_new_tokens=2)) for rid in ("b", "a")])
    with pytest.raises(ValueError, match="'c'.*duplicate"):
        engine.submit([Request("c", (4,), SamplingParams(max_new_tokens=2))] * 2)
    with pytest.raises(ValueError, match="'d'.*token ids"):
        engine.submit([Request("d", (VOCAB,), SamplingParams(max_new_tokens=2))])
    assert engine.stats().num_waiting == 1  # nothing of a refused call was queued


def test_from_pretrained_and_worker(tmp_path):
    model = tiny_qwen2()
    model.save_pretrained(tmp_path / "qwen2")
    prompt_list = prompts([5, 3], seed=8)
    in_memory = NativeEngine(model, num_slots=2, max_seq_len=40, seed=4)
    loaded = NativeEngine.from_pretrained(tmp_path / "qwen2", num_slots=2, max_seq_len=40, seed=4)
    expected = in_memory.generate(requests(prompt_list, max_new_tokens=8))
    assert loaded.generate(requests(prompt_list, max_new_tokens=8)) == expected

    worker = RolloutWorker(str(tmp_path / "qwen2"), num_slots=2, max_seq_len=40, seed=4, num_threads=1)
    worker.submit(requests(prompt_list, max_new_tokens=8))
    got = worker.step_many(3)
    got += worker.step_many(100)
    assert got == expected and not worker.has_unfinished()
    assert pickle.loads(pickle.dumps(got)) == got
    worker.load_weights(tiny_qwen2(seed=2).state_dict(), version=7)
    assert worker.weight_version() == 7 and worker.stats().weight_version == 7
    worker.submit(requests(prompt_list[:1], max_new_tokens=8))
    assert [c.finish_reason for c in worker.abort(["r0"])] == [FinishReason.ABORT]
    assert {c.weight_version for c in worker.generate(requests(prompt_list, max_new_tokens=3))} == {7}


def test_from_pretrained_refuses_other_architectures(tmp_path):
    GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(
        tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        NativeEngine.from_pretrained(tmp_path / "gpt2", num_slots=1, max_seq_len=16)


def test_worker_runs_as_a_ray_actor(tmp_path, ray_session):
    import ray

    tiny_llama().save_pretrained(tmp_path / "llama")
    prompt_list = prompts([4, 2, 7], seed=9)
    local = NativeEngine.from_pretrained(tmp_path / "llama", num_slots=2, max_seq_len=32, seed=1)
    expected = local.generate(requests(prompt_list, max_new_tokens=6))
    actor = ray.remote(num_cpus=1)(RolloutWorker).remote(str(tmp_path / "llama"), 2, 32, 1, 1)
    assert ray.get(actor.generate.remote(requests(prompt_list, max_new_tokens=6))) == expected
    stats = ray.get(actor.stats.remote())
    assert stats.tokens_generated == sum(len(c.token_ids) for c in expected)
    ray.kill(actor)


def test_a_bf16_engine_keeps_hugging_faces_fp32_rope_table_also_after_a_sleep():
    """bf16 is what CUDA runs; a bf16 engine on the CPU checks its rope table. Hugging Face keeps `inv_freq` in
    fp32 in a bf16 model; rounded to bf16 it put the cos table up to 2.0 off at position 2047."""
    model = tiny_qwen2()
    positions = torch.arange(2048)[None]
    cos, sin = model.model.rotary_emb(torch.zeros(1), positions)  # fp32 model: Hugging Face's own table
    engine = NativeEngine(model, num_slots=2, max_seq_len=2048, dtype=torch.bfloat16)
    assert {p.dtype for p in engine.runner.model.parameters()} == {torch.bfloat16}
    for _ in range(2):
        assert torch.equal(engine.runner.cos, cos[0].to(torch.bfloat16))
        assert torch.equal(engine.runner.sin, sin[0].to(torch.bfloat16))
        engine.sleep()
        engine.wake_up()
