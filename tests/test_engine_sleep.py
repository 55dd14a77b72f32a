"""The native engine's sleep mode: what it frees, what it refuses, and that waking changes no token.

Every expected output comes from an engine that never slept, run on the same history (same requests in the
same order, so the same arrival indices and seeds), and must match bit for bit. On CPU moving the weights to
host memory is a no-op, so what is checked is that the runner's own tensors (KV cache, fused weights) are
really dropped: a weak reference to them dies.
"""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from engine_contract import one_thread, prompts, random_model, run_all  # noqa: F401 (autouse fixture)
from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.protocol import Request, SamplingParams

ASLEEP = r"engine is asleep: call wake_up\(\) first"
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12)


def make_engine(architecture: str = "qwen2", seed: int = 0, bucketed_decode: bool | None = None,
                device: str = "cpu", weight_version: int = 0) -> NativeEngine:
    return NativeEngine(random_model(architecture, seed), num_slots=2, max_seq_len=64, seed=5, device=device,
                        bucketed_decode=bucketed_decode, weight_version=weight_version)


def batch(tag: str, seed: int) -> list[Request]:
    """Three sampled requests for two slots, so a sleep falls between rounds of continuous batching."""
    return [Request(f"{tag}{i}", p, SAMPLED) for i, p in enumerate(prompts([6, 2, 13], seed=seed))]


def outputs(engine: NativeEngine, requests: list[Request]) -> dict[str, tuple]:
    return {rid: (c.token_ids, c.logprobs, c.weight_version) for rid, c in run_all(engine, requests).items()}


@pytest.mark.parametrize("bucketed_decode", [False, True])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3"])
def test_a_woken_engine_samples_what_one_that_never_slept_does(architecture, bucketed_decode):
    """bucketed_decode=True is the padded decode path CUDA uses (run eagerly here)."""
    awake, slept = (make_engine(architecture, bucketed_decode=bucketed_decode) for _ in range(2))
    assert outputs(slept, batch("a", 1)) == outputs(awake, batch("a", 1))
    slept.sleep()
    slept.wake_up()
    expected = outputs(awake, batch("b", 2))
    assert outputs(slept, batch("b", 2)) == expected
    assert all(len(tokens) >= 1 for tokens, _, _ in expected.values())


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_weights_loaded_asleep_are_the_ones_used_after_waking(architecture):
    """Every engine runs batch w first, so batch x has the same arrival indices (and so seeds) on each."""
    engine, unchanged = make_engine(architecture), make_engine(architecture)
    fresh = make_engine(architecture, seed=11, weight_version=4)
    for each in (engine, unchanged, fresh):
        outputs(each, batch("w", 3))
    engine.sleep()
    engine.load_weights(random_model(architecture, seed=11).state_dict(), version=4)
    assert engine.weight_version == 4 and engine.stats().weight_version == 4
    assert engine.is_asleep and engine.runner.layers == []  # fused at wake, not now
    engine.wake_up()
    after = outputs(engine, batch("x", 4))
    assert after == outputs(fresh, batch("x", 4))
    assert {version for _, _, version in after.values()} == {4}
    assert [out[:2] for out in after.values()] != [out[:2] for out in outputs(unchanged, batch("x", 4)).values()]


def test_sleep_waits_for_requests_in_flight_and_an_asleep_engine_serves_nothing():
    engine = make_engine()
    engine.submit(batch("f", 5))
    engine.step()
    with pytest.raises(RuntimeError, match="sleep refused: 2 running and 1 waiting"):
        engine.sleep()
    assert not engine.is_asleep
    run_all(engine, [])
    engine.sleep()
    (prompt,) = prompts([4], seed=6)
    with pytest.raises(RuntimeError, match=f"submit refused: {ASLEEP}"):
        engine.submit([Request("late", prompt, SAMPLED)])
    with pytest.raises(RuntimeError, match=f"step refused: {ASLEEP}"):
        engine.step()
    with pytest.raises(RuntimeError, match=ASLEEP):
        engine.generate([Request("late", prompt, SAMPLED)])
    with pytest.raises(RuntimeError, match=ASLEEP):
        engine.next_token_logprobs(prompt, [2, 3])
    assert not engine.has_unfinished() and engine.stats().num_waiting == 0
    assert engine.abort(["unknown"]) == []
    engine.wake_up()
    assert len(engine.next_token_logprobs(prompt, [2, 3])) == 2


def test_sleep_drops_the_cache_and_fused_weights_and_both_calls_are_idempotent():
    engine = make_engine("qwen3", bucketed_decode=True)
    runner = engine.runner
    shape = runner.cache.k.shape
    dropped = [weakref.ref(t) for t in (runner.cache.k, runner.cache.v, runner.layers[0].qkv_w,
                                        runner.layers[-1].gate_up_w, runner.cos)]
    runner.graphs.captured[(1, 64)] = object()  # a captured graph stands in (capture needs CUDA)
    for _ in range(2):
        engine.sleep()
        gc.collect()
        assert engine.is_asleep and runner.cache is None and runner.layers == []
        assert runner.embed is None and runner.lm_head is None and runner.cos is None
        assert runner.graphs.captured == {} and runner.graphs.pool is None
        assert [ref() for ref in dropped] == [None] * len(dropped)
    for _ in range(2):
        engine.wake_up()
        assert not engine.is_asleep and runner.cache.k.shape == shape
        assert len(runner.layers) == engine.runner.model.config.num_hidden_layers
    assert outputs(engine, batch("i", 7)) == outputs(make_engine("qwen3", bucketed_decode=True), batch("i", 7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
def test_on_cuda_the_weights_wait_on_the_host_and_come_back_in_bf16():
    """Captured decode graphs included; not run on a CPU-only machine."""
    awake, slept = make_engine(device="cuda"), make_engine(device="cuda")
    assert outputs(slept, batch("c", 8)) == outputs(awake, batch("c", 8))
    slept.sleep()
    assert {p.device.type for p in slept.runner.model.parameters()} == {"cpu"}
    slept.wake_up()
    assert {(p.device.type, p.dtype) for p in slept.runner.model.parameters()} == {("cuda", torch.bfloat16)}
    assert outputs(slept, batch("d", 9)) == outputs(awake, batch("d", 9))
