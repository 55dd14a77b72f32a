"""Bucket selection and padding of the decode step (`decode_graphs.py`), checked on CPU.

Graph capture itself needs CUDA (the contract suite covers it there); what is
checked here is everything around it: which bucket a step takes, and that a
padded step gives the real rows exactly the logits and cache writes of an
unpadded one, leaving every row's cache but the scratch position untouched.
"""
from __future__ import annotations

import pytest
import torch

from engine_contract import random_model
from tailflow.engines.rollout.decode_graphs import DecodeGraphs, batch_buckets, bucket_for, key_bucket
from tailflow.engines.rollout.model_runner import ModelRunner


def test_batch_buckets_end_at_the_slot_count():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert batch_buckets(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert batch_buckets(300) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)


def test_bucket_for_takes_the_smallest_that_fits():
    buckets = batch_buckets(48)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [1, 2, 4, 8, 16, 32, 48, 48]
    with pytest.raises(ValueError):
        bucket_for(49, buckets)
    with pytest.raises(ValueError):
        bucket_for(0, buckets)


def test_key_bucket_is_a_power_of_two_from_256_capped_at_the_cache():
    assert [key_bucket(n, 8192) for n in (1, 256, 257, 1000, 4097, 8192)] == [256, 256, 512, 1024, 8192, 8192]
    assert key_bucket(90, 96) == 96
    assert key_bucket(300, 600) == 512 and key_bucket(513, 600) == 600
    with pytest.raises(ValueError):
        key_bucket(601, 600)


def test_capture_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA"):
        DecodeGraphs(runner=None, capture=True)


@pytest.mark.parametrize("architecture", ["qwen2", "qwen3"])
def test_padded_decode_equals_unpadded(architecture):
    """5 rows at positions up to 300 (key bucket 512 of 600, batch bucket 8 of 8 slots)."""
    torch.manual_seed(0)
    model = random_model(architecture)
    eager = ModelRunner(model, num_slots=8, max_seq_len=600, bucketed_decode=False)
    padded = ModelRunner(model, num_slots=8, max_seq_len=600, bucketed_decode=True)
    for runner in (eager, padded):
        runner.cache.k.normal_(generator=torch.Generator().manual_seed(1))
        runner.cache.v.normal_(generator=torch.Generator().manual_seed(2))
    before = padded.cache.k.clone()
    tokens = torch.tensor([3, 9, 4, 60, 7])
    positions = torch.tensor([0, 299, 17, 120, 5])
    expected = eager.decode(tokens, positions, 300)
    got = padded.decode(tokens, positions, 300)
    assert got.shape == expected.shape == (5, model.config.vocab_size)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.cache.k[:, :5], eager.cache.k[:, :5])
    changed = (padded.cache.k != before).any(dim=(0, 2, 4))  # [slot, position]
    assert changed[:5].sum(dim=1).tolist() == [1] * 5      # each real row: its own position only
    assert changed[5:, :599].sum() == 0                     # padded rows: the scratch position only
    assert changed[5:, 599].all()
