"""How admitted prompts are grouped into prefill forwards (`scheduler.prefill_chunks`)."""
from __future__ import annotations

from tailflow.engines.rollout.scheduler import prefill_chunks


def test_similar_lengths_share_a_forward_and_far_ones_do_not():
    assert prefill_chunks([3, 4, 5, 5]) == [(0, 4)]
    assert prefill_chunks([2, 3, 100, 101]) == [(0, 2), (2, 4)]
    assert prefill_chunks([]) == []


def test_no_forward_holds_more_than_max_tokens_padded_tokens():
    lengths = [8192] * 5 + [9000]
    chunks = prefill_chunks(lengths, max_tokens=16384)
    assert chunks == [(0, 2), (2, 4), (4, 5), (5, 6)]
    for start, end in chunks:
        assert (end - start) * max(lengths[start:end]) <= 16384 or end - start == 1
    assert prefill_chunks([20000]) == [(0, 1)]  # a lone long prompt is still prefilled
