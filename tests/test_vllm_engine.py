"""The vLLM engine (`tailflow/engines/rollout/vllm_engine.py`): the contract where vLLM and CUDA exist, its own
logic everywhere.

`TestVllmEngineContract` runs `engine_contract.py` on the real engine; it skips, saying why, without vllm or
without a GPU (so it has never run: no machine that ran these tests had either). The other tests run on a CPU
without vLLM. They drive `VllmEngine` through STAND-INS of vLLM 0.33.0's records and engine, written for these
tests: `StandInLogprob`, `StandInCompletionOutput` and `StandInRequestOutput` carry exactly the fields of
`vllm.logprobs.Logprob`, `vllm.outputs.CompletionOutput` and `vllm.outputs.RequestOutput` that 0.33.0 defines
(the ones this engine reads, plus the rest of CompletionOutput's required ones), and `StandInLLMEngine` has the
methods of `vllm.v1.engine.llm_engine.LLMEngine` the engine calls, with 0.33.0's signatures, over a toy
"model" (next token = a fixed function of the context). They check our bookkeeping, not vLLM.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import pytest
import torch

from engine_contract import EngineCase, EngineContract, one_thread  # noqa: F401 (autouse fixture)
from tailflow.engines.rollout.protocol import FinishReason, Request, ResponsePrefix, SamplingParams
from tailflow.engines.rollout.vllm_engine import (
    VllmCalls,
    VllmEngine,
    continued_seed,
    engine_kwargs,
    finish_reason_of,
    sampled_logprobs,
    sampling_kwargs,
)

MISSING = [what for what, present in (("vllm is not installed (the `vllm` extra)", importlib.util.find_spec("vllm")),
                                     ("torch sees no CUDA device", torch.cuda.is_available())) if not present]


@pytest.mark.skipif(bool(MISSING), reason="; ".join(MISSING))
class TestVllmEngineContract(EngineContract):
    @pytest.fixture
    def engine_case(self) -> EngineCase:
        def make(model_dir, num_slots, max_seq_len, seed=0):
            return VllmEngine.from_pretrained(model_dir, num_slots, max_seq_len, seed=seed, gpu_memory_utilization=0.3)

        return EngineCase(name="vllm-cuda", device="cuda", make=make, dtype=torch.bfloat16, exact=False, head_dim=32)


# ---- stand-ins of vLLM 0.33.0's records (field names and order as in vllm/logprobs.py, vllm/outputs.py) ------

@dataclass
class StandInLogprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class StandInCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, StandInLogprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class StandInRequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    prompt_logprobs: None
    outputs: list[StandInCompletionOutput]
    finished: bool


class StandInModel(torch.nn.Module):
    """What `apply_model` hands the function: vLLM's model, with `load_weights(weights) -> set[str]`."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)
        self.received: list[str] = []

    def load_weights(self, weights):
        names = [name for name, _ in weights]
        self.received += names
        return {"proj.weight", "proj.bias"} & set(names)


@dataclass
class StandInLLMEngine:
    """`LLMEngine`'s methods the engine calls (0.33.0 signatures); one toy token per running request per step,
    at most `max_num_seqs` running, the sampled token's log-prob -token/10 and a second-ranked entry beside it."""

    max_num_seqs: int = 2
    requests: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)
    model: StandInModel = field(default_factory=StandInModel)

    def add_request(self, request_id, prompt, params, arrival_time=None, lora_request=None, tokenization_kwargs=None,
                    trace_headers=None, priority=0, session_id=None, prompt_text=None, kv_hints=None):
        assert prompt["type"] == "token"
        self.requests[request_id] = dict(context=list(prompt["prompt_token_ids"]), params=params, made=0)
        self.calls.append(("add_request", request_id))
        return request_id

    def step(self):
        outputs = []
        for request_id in list(self.requests)[: self.max_num_seqs]:
            state = self.requests[request_id]
            token = (sum(state["context"]) * 7 + 3) % 50 + 2
            state["context"].append(token)
            state["made"] += 1
            params = state["params"]
            reason = ("stop" if token in params["stop_token_ids"] else
                      "length" if state["made"] >= params["max_tokens"] else None)
            positions = [{token: StandInLogprob(-token / 10, 2), 0: StandInLogprob(-0.05, 1)}]
            outputs.append(StandInRequestOutput(request_id, None, None, None, [StandInCompletionOutput(
                0, "", [token], None, positions, reason, token if reason == "stop" else None)], reason is not None))
            if reason is not None:
                del self.requests[request_id]
        return outputs

    def abort_request(self, request_ids, internal=False):
        self.calls.append(("abort_request", list(request_ids)))
        for request_id in request_ids:
            self.requests.pop(request_id, None)

    def apply_model(self, func):
        return [func(self.model)]

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("reset_prefix_cache",))
        return True

    def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))
        return tags is None or "kv_cache" in tags


def toy_next(context: list[int]) -> int:
    return (sum(context) * 7 + 3) % 50 + 2


def toy_response(prompt: list[int], n: int) -> list[int]:
    context, tokens = list(prompt), []
    for _ in range(n):
        tokens.append(toy_next(context))
        context.append(tokens[-1])
    return tokens


PLAIN_CALLS = VllmCalls(sampling_params=dict, prompt=lambda ids: {"type": "token", "prompt_token_ids": ids})
"""Plain stand-ins of vLLM's `SamplingParams(**kwargs)` and `vllm.inputs.tokens_input(ids)`."""


def make_engine(eos=(), num_slots=2, seed=0):
    llm = StandInLLMEngine(max_num_seqs=num_slots)
    return VllmEngine(llm, num_slots=num_slots, max_seq_len=64, eos_token_ids=eos, vocab_size=60, seed=seed,
                      calls=PLAIN_CALLS), llm


def run_all(engine):
    done = {}
    while engine.has_unfinished():
        done.update((c.request_id, c) for c in engine.step())
    return done


# ---- translation, by hand ------------------------------------------------------------------------------

def test_sampling_params_translate_to_vllm_keywords():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=30, stop_token_ids=(5, 1), seed=11)
    assert sampling_kwargs(params, 11, eos_token_ids=(1,), num_prefix_tokens=0) == dict(
        n=1, temperature=0.7, top_p=0.9, top_k=20, seed=11, stop_token_ids=[1, 5], ignore_eos=True, max_tokens=30,
        logprobs=0, detokenize=False)
    continued = sampling_kwargs(params, 11, eos_token_ids=(1,), num_prefix_tokens=4)
    assert continued["max_tokens"] == 26  # the prefix counts against max_new_tokens
    assert continued["seed"] == (11 * 1_000_033 + 4 * 104_729 + 7) % (2**63 - 1) == continued_seed(11, 4) != 11


def test_engine_arguments_ask_for_raw_logprobs_and_an_in_process_engine():
    kwargs = engine_kwargs("/m", num_slots=8, max_seq_len=512, seed=3, enable_sleep_mode=True,
                           gpu_memory_utilization=0.4)
    assert kwargs == dict(model="/m", seed=3, dtype="bfloat16", max_model_len=512, max_num_seqs=8,
                          gpu_memory_utilization=0.4, enable_prefix_caching=True, logprobs_mode="raw_logprobs",
                          enable_sleep_mode=True, skip_tokenizer_init=True, async_scheduling=False,
                          disable_log_stats=True)


def test_sampled_logprobs_read_from_a_recorded_output_shape():
    # One dict per token (token id -> Logprob), the sampled token among the top-ranked ones (logprobs=0 adds none).
    positions = [{7: StandInLogprob(-0.5, 2), 3: StandInLogprob(-0.1, 1)}, {3: StandInLogprob(-0.2, 1)}]
    assert sampled_logprobs([7, 3], positions) == [-0.5, -0.2]
    with pytest.raises(RuntimeError, match="2 tokens with no log-prob positions"):
        sampled_logprobs([7, 3], None)


def test_finish_reasons_map_stop_to_eos_or_stop_by_the_last_token():
    eos = frozenset({1})
    assert finish_reason_of(None, [4], eos, "r") is None
    assert finish_reason_of("stop", [4, 1], eos, "r") == FinishReason.EOS
    assert finish_reason_of("stop", [4, 5], eos, "r") == FinishReason.STOP
    assert finish_reason_of("length", [4], eos, "r") == FinishReason.LENGTH
    assert finish_reason_of("abort", [4], eos, "r") == FinishReason.ABORT
    with pytest.raises(RuntimeError, match="'repetition'"):
        finish_reason_of("repetition", [4], eos, "r")


# ---- the engine's bookkeeping over the stand-in ----------------------------------------------------------

def test_completions_carry_tokens_logprobs_and_reasons():
    engine, llm = make_engine(eos=(toy_response([3, 4], 3)[2],))
    engine.submit([Request("eos", (3, 4), SamplingParams(max_new_tokens=10)),
                   Request("len", (9,), SamplingParams(max_new_tokens=2))])
    done = run_all(engine)
    expected = toy_response([3, 4], 3)
    assert done["eos"].token_ids == tuple(expected) and done["eos"].finish_reason == FinishReason.EOS
    assert done["eos"].logprobs == tuple(-t / 10 for t in expected)
    assert done["len"].token_ids == tuple(toy_response([9], 2)) and done["len"].finish_reason == FinishReason.LENGTH
    assert done["eos"].weight_version == 0 and done["eos"].token_weight_versions == ()
    stats = engine.stats()
    assert (stats.steps, stats.busy_slot_steps, stats.tokens_generated) == (3, 5, 5)


def test_a_stop_sequence_finishes_the_request_and_aborts_it_in_vllm():
    tokens = toy_response([5], 6)
    engine, llm = make_engine()
    engine.submit([Request("s", (5,), SamplingParams(max_new_tokens=20, stop_sequences=(tuple(tokens[2:4]),)))])
    (done,) = run_all(engine).values()
    assert done.token_ids == tuple(tokens[:4]) and done.finish_reason == FinishReason.STOP
    assert ("abort_request", ["s"]) in llm.calls and not llm.requests


def test_abort_returns_partial_completions_and_the_counts_say_who_ran():
    engine, llm = make_engine(num_slots=1)
    engine.submit([Request("a", (2, 3), SamplingParams(max_new_tokens=30)),
                   Request("b", (4,), SamplingParams(max_new_tokens=3))])
    engine.step()
    assert (engine.stats().num_running, engine.stats().num_waiting) == (1, 1)
    (aborted,) = engine.abort(["a", "unknown"])
    assert aborted.finish_reason == FinishReason.ABORT and aborted.token_ids == tuple(toy_response([2, 3], 1))
    assert ("abort_request", ["a"]) in llm.calls
    assert (engine.stats().num_running, engine.stats().num_waiting) == (0, 1)
    assert list(run_all(engine)) == ["b"] and engine.abort(["b"]) == []


def test_a_continued_request_sends_prompt_and_prefix_and_keeps_each_tokens_version():
    engine, llm = make_engine()
    engine.weight_version = 3
    prefix = ResponsePrefix(token_ids=(8, 9), logprobs=(-0.8, -0.9), weight_versions=(2, 2))
    engine.submit([Request("c", (5, 6), SamplingParams(max_new_tokens=4, seed=7), prefix=prefix)])
    sent = llm.requests["c"]
    assert sent["context"] == [5, 6, 8, 9] and sent["params"]["max_tokens"] == 2
    assert sent["params"]["seed"] == continued_seed(7, 2)
    (done,) = run_all(engine).values()
    new = toy_response([5, 6, 8, 9], 2)
    assert done.prompt_token_ids == (5, 6) and done.token_ids == (8, 9, *new)
    assert done.logprobs == (-0.8, -0.9, *(-t / 10 for t in new))
    assert done.token_weight_versions == (2, 2, 3, 3) and done.oldest_weight_version == 2


def test_requests_are_validated_before_any_reaches_vllm():
    engine, llm = make_engine()
    with pytest.raises(ValueError, match="duplicate request id"):
        engine.submit([Request("x", (1,), SamplingParams(max_new_tokens=5)),
                       Request("x", (2,), SamplingParams(max_new_tokens=5))])
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 60\)"):
        engine.submit([Request("ok", (1,), SamplingParams(max_new_tokens=5)),
                       Request("v", (1,), SamplingParams(max_new_tokens=5),
                               prefix=ResponsePrefix((60,), (-1.0,), (0,)))])
    with pytest.raises(ValueError, match="exceeds the engine's max_seq_len 64"):
        engine.submit([Request("y", (1,) * 10, SamplingParams(max_new_tokens=60))])
    assert llm.requests == {} and not engine.has_unfinished()


def test_weights_load_by_version_between_requests_and_empty_the_prefix_cache():
    engine, llm = make_engine()
    engine.submit([Request("busy", (1,), SamplingParams(max_new_tokens=5))])
    state = {"proj.weight": torch.zeros(2, 2), "proj.bias": torch.zeros(2)}
    with pytest.raises(RuntimeError, match="1 requests in flight"):
        engine.load_weights(state, version=1)
    run_all(engine)
    engine.load_weights(state, version=1)
    assert llm.model.received == ["proj.weight", "proj.bias"] and llm.calls[-1] == ("reset_prefix_cache",)
    assert engine.stats().weight_version == 1
    with pytest.raises(KeyError, match=r"got no weight: \['proj.bias'\]"):
        engine.load_weights({"proj.weight": torch.zeros(2, 2)}, version=2)


def test_sleep_discards_weights_and_wake_up_waits_for_new_ones():
    engine, llm = make_engine()
    engine.sleep()
    assert llm.calls[-1] == ("sleep", 2)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.submit([Request("z", (1,))])
    with pytest.raises(RuntimeError, match="load_weights"):
        engine.wake_up()
    engine.load_weights({"proj.weight": torch.zeros(2, 2), "proj.bias": torch.zeros(2)}, version=4)
    engine.wake_up()
    assert [c for c in llm.calls if c[0] in ("sleep", "wake_up")] == [("sleep", 2), ("wake_up", ["weights"]),
                                                                       ("wake_up", ["kv_cache"])]
    engine.wake_up()  # awake: nothing to do
    assert run_all_one(engine).weight_version == 4


def run_all_one(engine):
    engine.submit([Request("after", (3,), SamplingParams(max_new_tokens=2))])
    (done,) = run_all(engine).values()
    return done


def test_the_worker_builds_the_engine_rollout_engine_names(tmp_path):
    from engine_contract import write_model
    from tailflow.engines.rollout.native import NativeEngine
    from tailflow.engines.rollout.worker import build_engine

    model_dir = write_model(tmp_path / "m", "qwen2")
    assert isinstance(build_engine("native", str(model_dir), 2, 32, seed=0, device="cpu"), NativeEngine)
    with pytest.raises(ValueError, match="runs on a GPU only, got device 'cpu'"):
        build_engine("vllm", str(model_dir), 2, 32, seed=0, device="cpu")  # refused before vLLM is imported
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        build_engine("sglang", str(model_dir), 2, 32, seed=0, device="cpu")
