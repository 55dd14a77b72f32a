"""Rollout workers as real Ray actors: batch generate, streaming, abort, weight sync."""
from __future__ import annotations

import pytest

from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.models import build_tiny_model
from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("rollout-model")
    tokenizer = build_char_tokenizer()
    build_tiny_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=1).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def requests(count: int, max_new_tokens: int = 12) -> list[Request]:
    return [
        Request(f"p{i}#0", (5 + i % 7, 12, 13), SamplingParams(max_new_tokens=max_new_tokens, seed=100 + i))
        for i in range(count)
    ]


def test_one_worker_matches_the_in_process_engine(ray_session, model_dir):
    group = RolloutGroup(str(model_dir), 1, num_slots=4, max_seq_len=32, seed=0, num_threads=1)
    try:
        remote = group.generate(requests(6))
    finally:
        group.shutdown()
    local = {c.request_id: c for c in NativeEngine.from_pretrained(model_dir, 4, 32).generate(requests(6))}
    assert [c.request_id for c in remote] == [f"p{i}#0" for i in range(6)]  # request order
    assert all(c.token_ids == local[c.request_id].token_ids and c.logprobs == local[c.request_id].logprobs
               for c in remote)


def test_streaming_balances_polls_and_aborts(ray_session, model_dir):
    group = RolloutGroup(str(model_dir), 2, num_slots=2, max_seq_len=64, seed=0, num_threads=1)
    try:
        assert not group.has_unfinished()
        group.submit(requests(6, max_new_tokens=40))
        assert group.in_flight_per_worker() == [3, 3]
        assert group.has_unfinished()
        finished = group.poll(max_steps=2)
        aborted = group.abort(["p0#0", "p1#0", "nope#0"])
        assert {c.request_id for c in aborted} <= {"p0#0", "p1#0"}
        assert all(c.finish_reason == FinishReason.ABORT for c in aborted)
        while sum(group.in_flight_per_worker()):
            finished += group.poll(max_steps=8)
        done_ids = {c.request_id for c in finished} | {c.request_id for c in aborted}
        assert done_ids == {f"p{i}#0" for i in range(6)}
        stats = group.stats()
        assert all(s.num_running == 0 and s.num_waiting == 0 for s in stats)
        assert not group.has_unfinished()  # what the round driver asks before calling a round stalled
    finally:
        group.shutdown()


def test_a_sigterm_in_an_iterations_code_stops_a_ray_get_at_once(ray_session):
    """Why the Cancel test left an iteration Running: inside a subflow Prefect's SIGTERM bridge replaces Ray's
    handler, and a `ray.get` (a rollout poll, here) held the bridge's exception until its result came, which,
    Ray's processes stopped by the same signal, it never did; the runner SIGKILLed the driver 30 s later. In an
    iteration's code (`exits_on_sigterm`, driver/cancel.py) the signal raises SystemExit, which `ray.get` passes
    on at once, whatever it waits for."""
    import os
    import signal
    import threading
    import time

    import ray
    from prefect.utilities.engine import capture_sigterm

    from tailflow.tasks.cancellable import exits_on_sigterm

    @ray.remote
    def slow() -> str:
        time.sleep(60)
        return "done"

    ref = slow.remote()
    before = signal.getsignal(signal.SIGTERM)
    try:
        with capture_sigterm(), exits_on_sigterm():  # a subflow's bridge, then an iteration's own code
            threading.Timer(1, os.kill, (os.getpid(), signal.SIGTERM)).start()
            started = time.monotonic()
            with pytest.raises(SystemExit):
                ray.get(ref)
            assert time.monotonic() - started < 30
    finally:
        signal.signal(signal.SIGTERM, before)
        ray.cancel(ref, force=True)
