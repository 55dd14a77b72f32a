"""Multi-turn prefix reuse on the native engine: a request that `continues` a kept slot prefills only what it
appends, and samples what a one-shot request whose prompt is the whole conversation samples.

Equality under sampling: a turn is a request of its own with its own seed (`SamplingParams.seed`), so a continued
turn with seed s draws the same uniforms as a one-shot request over the same conversation with seed s: the same
tokens, and log-probs equal to 1e-5 (fp32; the conversation's keys were computed by decode steps in one case and
by one prefill in the other, which round differently, never by more than ~1e-6 here).
"""
from __future__ import annotations

import pytest
import torch

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_native_engine import tiny_llama, tiny_qwen2
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.rollout.protocol import Completion

OBSERVATIONS = [(5, 6, 7), (8,), (9, 10, 11, 12, 13)]
PROMPTS = [(3, 4, 5, 6), (7, 8), (11, 12, 13, 14, 15, 16)]


def params(temperature: float, seed: int, max_new_tokens: int = 6) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)


def converse(engine: NativeEngine, temperature: float, num_turns: int = 3) -> list[list[Completion]]:
    """Every conversation turn by turn, interleaved: a finished turn's next one is submitted at once, continuing
    it with an observation appended. Returns each conversation's completions in turn order."""
    turns: list[list[Completion]] = [[] for _ in PROMPTS]

    def request(conv: int, prompt: tuple[int, ...]) -> Request:
        turn = len(turns[conv])
        previous = f"c{conv}t{turn - 1}" if turn else None
        return Request(f"c{conv}t{turn}", prompt, params(temperature, seed=100 * conv + turn),
                       keep_slot=turn + 1 < num_turns, continues=previous)

    engine.submit([request(i, prompt) for i, prompt in enumerate(PROMPTS)])
    while engine.has_unfinished():
        for done in engine.step():
            conv = int(done.request_id[1:].split("t")[0])
            turns[conv].append(done)
            if len(turns[conv]) < num_turns:
                observation = OBSERVATIONS[(conv + len(turns[conv])) % len(OBSERVATIONS)]
                engine.submit([request(conv, done.prompt_token_ids + done.token_ids + observation)])
    return turns


def one_shot(model, completion: Completion, temperature: float, seed: int) -> Completion:
    fresh = NativeEngine(model, num_slots=1, max_seq_len=64, eos_token_ids=())
    (alone,) = fresh.generate([Request("alone", completion.prompt_token_ids, params(temperature, seed))])
    return alone


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bucketed", [False, True])
def test_a_continued_turn_equals_a_one_shot_request_over_the_whole_conversation(temperature, bucketed):
    model = tiny_qwen2()
    engine = NativeEngine(model, num_slots=2, max_seq_len=64, eos_token_ids=(), bucketed_decode=bucketed)
    turns = converse(engine, temperature)
    for conv, completions in enumerate(turns):
        assert len(completions) == 3
        for turn, completion in enumerate(completions):
            expected = one_shot(model, completion, temperature, seed=100 * conv + turn)
            assert completion.token_ids == expected.token_ids, (conv, turn)
            torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(expected.logprobs),
                                       atol=1e-5, rtol=0)
    # Two slots for three conversations: kept slots were given back for waiting ones (those turns prefilled all
    # again), others were reused. Each request's cached positions were prefilled, reused or decoded, once.
    stats = engine.stats()
    cached = sum(len(c.prompt_token_ids) + len(c.token_ids) - 1 for cs in turns for c in cs)
    assert stats.reused_prefix_tokens > 0
    assert stats.prefill_tokens + stats.reused_prefix_tokens + stats.tokens_generated == cached
    assert stats.num_kept == 0  # last turns keep nothing, and every kept slot was continued or given back


def test_a_continued_request_prefills_only_the_appended_tokens():
    engine = NativeEngine(tiny_llama(), num_slots=4, max_seq_len=64, eos_token_ids=())
    (first,) = engine.generate([Request("t0", (3, 4, 5, 6, 7), params(0.0, 1, max_new_tokens=5), keep_slot=True)])
    before = engine.stats()
    assert (before.prefill_tokens, before.num_kept, before.num_running) == (4, 1, 0)
    conversation = first.prompt_token_ids + first.token_ids + (9, 10, 11)
    (second,) = engine.generate([Request("t1", conversation, params(0.0, 2), continues="t0")])
    after = engine.stats()
    # the previous turn's last sampled token was never fed, so it is prefilled with the observation
    assert after.prefill_tokens - before.prefill_tokens == 1 + 3 - 1
    assert after.reused_prefix_tokens == len(first.prompt_token_ids) + len(first.token_ids) - 1
    assert after.num_kept == 0
    assert second.token_ids == one_shot(engine.runner.model, second, 0.0, 2).token_ids


def test_kept_slots_are_occupied_bounded_released_and_given_back_when_room_is_needed():
    engine = NativeEngine(tiny_qwen2(), num_slots=3, max_seq_len=64, eos_token_ids=(), max_kept_slots=2)
    engine.generate([Request(f"k{i}", (3 + i, 4, 5), params(0.0, i, 3), keep_slot=True) for i in range(3)])
    assert engine.stats().num_kept == 2  # the bound: the oldest was given back
    assert "k0" not in engine.kept and {"k1", "k2"} <= set(engine.kept.slots)
    engine.submit([Request("x", (7, 8, 9), params(0.0, 9, 20))])
    engine.step()
    assert (engine.stats().num_running, engine.stats().num_kept) == (1, 2)  # 3 slots: 1 running + 2 kept
    engine.submit([Request("y", (7, 8), params(0.0, 9, 20))])
    engine.step()
    assert (engine.stats().num_running, engine.stats().num_kept) == (2, 1)  # the oldest kept made room
    assert "k2" in engine.kept
    engine.release_kept(["k2", "unknown"])
    assert engine.stats().num_kept == 0
    engine.generate([])


def test_a_kept_slot_from_older_weights_is_prefilled_again_with_the_new_ones():
    model = tiny_qwen2()
    engine = NativeEngine(model, num_slots=2, max_seq_len=64, eos_token_ids=())
    (first,) = engine.generate([Request("t0", (3, 4, 5), params(0.0, 1, 4), keep_slot=True)])
    new_weights = {name: tensor + 0.05 for name, tensor in tiny_qwen2(seed=1).state_dict().items()}
    engine.load_weights(new_weights, version=1)
    assert engine.stats().num_kept == 0
    conversation = first.prompt_token_ids + first.token_ids + (9, 10)
    prefilled = engine.stats().prefill_tokens
    (second,) = engine.generate([Request("t1", conversation, params(0.0, 2), continues="t0")])
    assert engine.stats().prefill_tokens - prefilled == len(conversation) - 1
    assert engine.stats().reused_prefix_tokens == 0
    assert second.weight_version == 1
    assert second.token_ids == one_shot(engine.runner.model, second, 0.0, 2).token_ids


def test_sleep_gives_kept_slots_back_and_a_mismatched_continuation_is_refused():
    engine = NativeEngine(tiny_qwen2(), num_slots=2, max_seq_len=64, eos_token_ids=())
    (first,) = engine.generate([Request("t0", (3, 4, 5), params(0.0, 1, 4), keep_slot=True)])
    with pytest.raises(ValueError, match="does not start with"):
        engine.submit([Request("t1", (3, 4, 6, 7), params(0.0, 2), continues="t0")])
    engine.sleep()
    assert engine.stats().num_kept == 0
    engine.wake_up()
    (second,) = engine.generate([Request("t1", first.prompt_token_ids + first.token_ids + (9,), params(0.0, 2),
                                         continues="t0")])
    assert engine.stats().reused_prefix_tokens == 0 and len(second.token_ids) == 6


def test_kept_slots_continued_out_of_order_keep_their_own_keys_and_values():
    """Continuing the oldest kept slot first moves the youngest into its row; the moved one, continued after,
    must still sample what the one-shot request does."""
    model = tiny_llama()
    engine = NativeEngine(model, num_slots=4, max_seq_len=64, eos_token_ids=())
    firsts = engine.generate([Request(f"k{i}", (3 + i, 4 + 2 * i, 5, 6 + i), params(0.0, i, 2 + i), keep_slot=True)
                              for i in range(3)])
    assert engine.stats().num_kept == 3
    for first in sorted(firsts, key=lambda c: c.request_id)[::2] + [firsts[1]]:
        conversation = first.prompt_token_ids + first.token_ids + (9, 10)
        (second,) = engine.generate([Request(f"{first.request_id}+", conversation, params(0.0, 7),
                                             continues=first.request_id)])
        expected = one_shot(model, second, 0.0, 7)
        assert second.token_ids == expected.token_ids, first.request_id
        torch.testing.assert_close(torch.tensor(second.logprobs), torch.tensor(expected.logprobs), atol=1e-5, rtol=0)
    assert engine.stats().reused_prefix_tokens == sum(len(c.prompt_token_ids) + len(c.token_ids) - 1 for c in firsts)
