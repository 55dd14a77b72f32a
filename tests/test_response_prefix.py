"""Continuing a response from its prefix: what partial rollout (async) and worker migration (elastic) rest on.

A request stopped after k tokens and resubmitted with those k tokens as its
prefix must sample on exactly as it would have uninterrupted: the same tokens,
the recorded log-probs of the prefix kept, and each token's weight version named.
"""
from __future__ import annotations

import pytest
import torch

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_native_engine import tiny_qwen2
from tailflow.engines.rollout import NativeEngine, Request, SamplingParams
from tailflow.engines.rollout.protocol import FinishReason, ResponsePrefix

PROMPTS = [(3, 4, 5), (6, 7, 8, 9, 10), (11, 12)]


def requests(temperature: float = 1.0, max_new_tokens: int = 24) -> list[Request]:
    return [Request(f"r{i}", prompt, SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                                                    seed=100 + i))
            for i, prompt in enumerate(PROMPTS)]


def engine(model=None, version: int = 0) -> NativeEngine:
    return NativeEngine(model or tiny_qwen2(), num_slots=4, max_seq_len=64, eos_token_ids=(), weight_version=version)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_response_continued_from_its_prefix_equals_the_uninterrupted_one(temperature):
    whole = {c.request_id: c for c in engine().generate(requests(temperature))}

    first = engine()
    first.submit(requests(temperature))
    for _ in range(7):
        first.step()
    partials = first.abort([r.request_id for r in requests(temperature)])
    assert [len(p.token_ids) for p in partials] == [7, 7, 7]

    continued = [Request(r.request_id, r.prompt_token_ids, r.params, prefix=p.as_prefix())
                 for r, p in zip(requests(temperature), partials)]
    for done in engine().generate(continued):
        expected = whole[done.request_id]
        assert done.token_ids == expected.token_ids
        assert done.logprobs[:7] == expected.logprobs[:7]  # the prefix's recorded log-probs, kept as they were
        torch.testing.assert_close(torch.tensor(done.logprobs), torch.tensor(expected.logprobs), atol=1e-5, rtol=0)
        assert done.finish_reason is FinishReason.LENGTH and done.token_weight_versions == ()


def test_tokens_after_a_weight_update_are_named_by_version():
    old = engine(version=3)
    old.submit(requests())
    for _ in range(5):
        old.step()
    partials = old.abort([r.request_id for r in requests()])
    new = engine(tiny_qwen2(seed=1), version=4)
    done = new.generate([Request(r.request_id, r.prompt_token_ids, r.params, prefix=p.as_prefix())
                         for r, p in zip(requests(), partials)])
    for completion in done:
        assert completion.weight_version == 4 and completion.oldest_weight_version == 3
        assert completion.token_weight_versions == (3,) * 5 + (4,) * 19
        assert completion.as_prefix().weight_versions == completion.token_weight_versions


def test_a_prefix_that_is_already_finished_or_malformed_is_refused_naming_the_request():
    params = SamplingParams(max_new_tokens=4, seed=1)
    full = ResponsePrefix((5, 6, 7, 8), (-1.0,) * 4, (0,) * 4)
    with pytest.raises(ValueError, match="request 'done'.*already reaches max_new_tokens"):
        engine().submit([Request("done", (3, 4), params, prefix=full)])
    with pytest.raises(ValueError, match="request 'oob'.*prefix token ids"):
        engine().submit([Request("oob", (3, 4), params, prefix=ResponsePrefix((999,), (-1.0,), (0,)))])
    with pytest.raises(ValueError, match="one log-prob and one weight version per token"):
        ResponsePrefix((5, 6), (-1.0,), (0, 0))
