"""Elastic rollout workers as real Ray actors (issue 17): a worker SIGKILLed mid-round, one preempted with
notice, one added mid-round, none left; the round completes and every request draws the tokens it would have."""
from __future__ import annotations

import os
import signal
import time

import pytest

from one_round import Watching, take_one_round
from tailflow.engines.cluster.membership import ElasticSettings
from tailflow.engines.cluster.membership_log import EventKind
from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.worker_control import WorkerCommand, WorkerControl, send_worker_command
from tailflow.engines.models import write_random_tiny_model
from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.rollout.worker import PREEMPTION_SIGNAL
from tailflow.engines.store.local import LocalStore
from tailflow.engines.tail.planner import RoundKind


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # No EOS in reach of a random model's first tokens is not guaranteed: lengths vary, which is the point.
    return write_random_tiny_model(tmp_path_factory.mktemp("elastic-model"), seed=1)


def round_requests(num_prompts: int, per_prompt: int, max_new_tokens: int) -> list[Request]:
    return [Request.for_problem(f"q{p}", k, (5 + p % 7, 12 + k % 3, 13),
                                SamplingParams(max_new_tokens=max_new_tokens, seed=1000 * p + k))
            for p in range(num_prompts) for k in range(per_prompt)]


def kill_at_poll(group: RolloutGroup, at: int, rank: int) -> None:
    """SIGKILL worker `rank`'s process (no notice) just before the group's poll number `at` (streamed rounds
    and `generate` both poll)."""
    poll, num_polls = group.poll, [0]

    def killing_poll(max_steps: int):
        num_polls[0] += 1
        if num_polls[0] == at:
            os.kill(group.worker_pid(rank), signal.SIGKILL)
        return poll(max_steps)

    group.poll = killing_poll


def three_workers(model_dir, engine: str):
    group = RolloutGroup(str(model_dir), 3, num_slots=2, max_seq_len=64, seed=0, num_threads=1, num_cpus=0.5,
                         engine=engine)
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def group3(ray_session, model_dir):
    yield from three_workers(model_dir, "native")


@pytest.fixture(scope="module")
def vllm_group3(ray_session, model_dir):
    """Three vLLM engines (vLLM's CPU build), one per Ray actor."""
    yield from three_workers(model_dir, "vllm")


def play(group: RolloutGroup, requests, kind: RoundKind, kill_at: int | None, steps_per_poll: int = 3):
    """One round on three workers (one added back if the last round lost one); with `kill_at`, worker 1 is
    SIGKILLed before that poll. The round's result and the requests migrated in it."""
    group.add_workers(3 - len(group.membership.workers) - len(group.membership.joining), wait=True)
    group.wait_for_joins()  # a replacement for the last round's lost worker
    group.take_membership()
    if kill_at is not None:
        kill_at_poll(group, kill_at, rank=1)
    try:
        # short rounds stream; long rounds run as a batch (`generate`), which polls too
        short = kind is RoundKind.SHORT
        result = take_one_round(group, requests, kind, 2 if short else 3, 3 if short else 6,
                                Watching() if short else None, steps_per_poll).result
    finally:
        group.__dict__.pop("poll", None)
    events = list(group.membership.log.events)
    return result, {rid for e in events if e.kind is EventKind.MIGRATE for rid in e.request_ids}, \
        [e.kind for e in events if e.kind is not EventKind.JOIN]


def kept_tokens(result) -> dict[str, tuple[int, ...]]:
    return {c.request_id: c.token_ids for _, kept in result.completed for c in kept}


VLLM_SLOW = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("engine, kind", [pytest.param("native", "short", marks=pytest.mark.slow), ("native", "long"),
                                          pytest.param("vllm", "short", marks=VLLM_SLOW),
                                          pytest.param("vllm", "long", marks=VLLM_SLOW)])
def test_a_worker_sigkilled_mid_round_is_migrated_not_restarted(request, engine, kind):
    """On either engine: the requests of a worker killed without notice continue on the others from the tokens
    it had reported, drawing what they would have drawn (the vLLM engine's sampler takes the prefix's draws).
    Costs ~33 s (native, short round) and ~9 s (native, long) here; the vLLM cases ~100 s and ~30 s, most of it
    the module's three vLLM engines starting (`vllm_group3`), so those two are marked slow, and so is the native
    short round (its kill lands while the round streams: ~24-51 s): the fast subset keeps the native long round,
    the whole suite runs all four. Each kill needs its worker in a process of its own."""
    group3 = request.getfixturevalue("group3" if engine == "native" else "vllm_group3")
    requests = round_requests(num_prompts=6, per_prompt=3, max_new_tokens=30)
    round_kind = RoundKind.SHORT if kind == "short" else RoundKind.LONG
    # A long round runs as `generate`, polling every 64 steps: each worker has 3 x 30 steps to run.
    kill_at = 3 if kind == "short" else 2
    reference, _, reference_events = play(group3, requests, round_kind, kill_at=None)
    result, migrated, events = play(group3, requests, round_kind, kill_at=kill_at)

    assert reference_events == [] and events[:2] == [EventKind.LOST, EventKind.MIGRATE]
    assert migrated, "the killed worker held requests in flight"
    prompts = {r.problem_id for r in requests}
    completed = [pid for pid, _ in result.completed]
    assert len(completed) == len(set(completed))  # trained once
    assert set(completed) | set(result.deferred_problem_ids) == prompts  # ... or queued
    assert not set(completed) & set(result.deferred_problem_ids)
    assert all(len(kept) == result.completed[0][1].__len__() for _, kept in result.completed)
    if kind == "long":
        assert sorted(completed) == sorted(prompts)
    ours, theirs = kept_tokens(result), kept_tokens(reference)
    both = set(ours) & set(theirs)
    assert both - migrated, "some requests kept in both runs were never migrated"
    assert all(ours[rid] == theirs[rid] for rid in both - migrated)
    assert all(ours[rid] == theirs[rid] for rid in both & migrated)  # continued exactly from their tokens
    assert all(c.finish_reason != FinishReason.ABORT for _, kept in result.completed for c in kept)


@pytest.mark.slow
def test_a_resumed_group_keeps_the_workers_added_or_removed_at_runtime(group3):
    """`keep_added(k)`: what a resumed or restarted run does with the committed `rollout_workers_added`.

    Costs ~27-29 s here: two workers started one after another (each a process with its engine); a resume path,
    in the whole suite, not the fast subset."""
    group3.wait_for_joins()  # a replacement for a worker an earlier test killed
    group3.take_membership()
    assert (len(group3.membership.workers), group3.workers_added()) == (3, 0)
    group3.keep_added(1)
    assert group3.membership.joining == []  # started at the next poll or wait: after the run's trainer is placed
    group3.wait_for_joins()
    assert (len(group3.membership.workers), group3.workers_added()) == (4, 1)
    before = sorted(group3.membership.worker_ids)
    group3.keep_added(-1)  # two fewer: the two newest go
    assert group3.membership.worker_ids == before[:2] and group3.workers_added() == -1
    group3.keep_added(-10)  # never fewer than none
    assert group3.membership.workers == [] and group3.workers_added() == -3
    group3.keep_added(0)
    group3.wait_for_joins()
    assert (len(group3.membership.workers), group3.workers_added()) == (3, 0)
    leaves = [e for e in group3.membership.log.events if e.kind is EventKind.LEAVE]
    assert [e.worker_id for e in leaves] == sorted(before, reverse=True)  # the newest first, each once


def poll_until(group: RolloutGroup, done, finished: list, limit_s: float = 60) -> None:
    """Poll until `done()` (joins happen between polls, once a started worker holds the weights)."""
    deadline, members = time.monotonic() + limit_s, group.membership
    while not done():
        assert time.monotonic() < deadline, (members.worker_ids, members.joining,
                                             [e.line() for e in members.log.events])
        got = group.poll(2)
        finished += got
        if not got:
            time.sleep(0.05)


@pytest.mark.slow  # three workers start one after another: ~25 s on 2 cores
def test_join_notice_remove_and_zero_workers(ray_session, model_dir, tmp_path):
    """Costs ~30 s here (on the session's Ray, four rollout workers started one after another, each loading the
    model, plus a reference engine): join, preemption notice, removal to zero and a new join are each a worker
    process starting or leaving, which is what it checks."""
    first, second = round_requests(3, 2, max_new_tokens=40), round_requests(5, 2, max_new_tokens=40)[6:]
    engine = NativeEngine.from_pretrained(model_dir, 4, 64)
    engine.load_weights(engine.runner.model.state_dict(), 3)
    expected = {c.request_id: c.token_ids for c in engine.generate(first + second)}

    store = LocalStore(tmp_path)
    said = []
    group = RolloutGroup(str(model_dir), 1, num_slots=2, max_seq_len=64, seed=0, num_threads=1, num_cpus=0.5,
                         elastic=ElasticSettings(control=WorkerControl(store, "run", interval_s=0), say=said.append))
    members, finished = group.membership, []
    try:
        group.load_weights(engine.runner.model.state_dict(), 3)
        group.submit(first)
        finished += group.poll(2)
        send_worker_command(store, "run", WorkerCommand(add=1))
        poll_until(group, lambda: members.worker_ids == [0, 1], finished)  # joins between polls, once it has v3
        import ray

        assert ray.get(members.workers[1].weight_version.remote()) == 3
        join = members.log.events[0]
        assert (join.kind, join.worker_id, join.weight_version) == (EventKind.JOIN, 1, 3)

        os.kill(group.worker_pid(0), PREEMPTION_SIGNAL)  # preemption notice: steps no more, hands over whole
        poll_until(group, lambda: 0 not in members.worker_ids, finished)
        leave = next(e for e in members.log.events if e.kind is EventKind.LEAVE)
        assert leave.worker_id == 0 and leave.detail == "preemption notice"
        assert [j.worker_id for j in members.joining] + members.worker_ids[1:] == [2]  # its replacement

        send_worker_command(store, "run", WorkerCommand(remove=1))
        send_worker_command(store, "run", WorkerCommand(remove=2))
        group.submit(second)
        assert group.poll(2) == [] and members.workers == [] and members.joining == []
        assert group.has_unfinished() and group.poll(2) == []  # paused, not failed
        assert any("rollout paused" in line for line in said)
        send_worker_command(store, "run", WorkerCommand(add=1))
        poll_until(group, lambda: len(finished) == len(expected), finished)
        assert members.worker_ids == [3] and not group.has_unfinished()
    finally:
        group.shutdown()
    assert sorted(c.request_id for c in finished) == sorted(expected)
    assert all(c.token_ids == expected[c.request_id] for c in finished)
    assert all(c.oldest_weight_version == 3 == c.weight_version for c in finished)
    kinds = [e.kind for e in members.log.events]
    assert kinds.count(EventKind.PAUSE) == 1 and EventKind.RESUME in kinds
    changes = group.take_membership()
    assert changes.metrics()["rollout/migrated_requests"] == sum(e.num_requests for e in changes.events
                                                                 if e.kind is EventKind.MIGRATE)


@pytest.mark.slow  # its own Ray, five workers started: ~1-2 min on 2 cores
@pytest.mark.long
def test_the_elastic_bench_smoke():
    """Costs ~60 s here (bench/elastic.py --quick as its own process: its own Ray, 5 iterations with a join every
    iteration, five workers started): a migration needs real worker processes joining under load, and --quick is
    already the smallest run the bench has."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(root / "bench" / "elastic.py"), "--quick"], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    last = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert last.startswith("RESULT migrations=") and last.endswith(" lost_prompts=0 iteration_restarts=0")
    assert int(last.split()[1].split("=")[1]) > 0


def test_workers_cli_queues_commands_a_run_takes_once(tmp_path, capsys):
    from tailflow.cli import main

    store = LocalStore(tmp_path)
    store.write_text("r1/config.yaml", "{}\n")
    at = [f"--set=storage.uri={tmp_path}"]
    assert main(["workers", "add", "r1", "2", *at]) == 0
    assert main(["workers", "remove", "r1", "3", *at]) == 0
    assert main(["workers", "add", "r1", "0", *at]) == 2  # refused, nothing queued
    assert main(["workers", "add", "nope", "1", *at]) == 2
    control = WorkerControl(store, "r1", interval_s=0)
    taken = control.take()
    assert [(c.add, c.remove) for c in taken] == [(2, None), (0, 3)] and all(c.issued_by for c in taken)
    assert control.take() == [] and main(["workers", "pending", "r1", *at]) == 0


def test_a_run_builds_its_rollout_groups_elastic_settings_from_its_config(tmp_path, capsys):
    """What a run's rollout group is built with at start, resume and iteration restart (`workers.elastic_settings`)."""
    from tailflow.config import load_config
    from tailflow.driver.run_log import say
    from tailflow.driver.workers import elastic_settings

    store = LocalStore(tmp_path)
    fixed = elastic_settings(load_config(None, ["rollout.elastic=false"]), store, "r1", workers_added=2)
    assert (fixed.is_elastic, fixed.control, fixed.keep_added, fixed.say) == (False, None, 0, say)
    assert "keeping" not in capsys.readouterr().out
    grown = elastic_settings(load_config(None, ["rollout.num_workers=2"]), store, "r1", workers_added=-1)
    assert grown.is_elastic and grown.keep_added == -1 and grown.say is say
    assert "keeping the rollout workers added at runtime: 2 (rollout.num_workers) -1" in capsys.readouterr().out
    send_worker_command(store, "r1", WorkerCommand(add=1))
    assert [command.add for command in grown.control.take()] == [1]  # the run's own control channel


def test_a_gone_workers_seat_goes_to_the_next_worker_unless_its_node_leaves():
    from tailflow.engines.cluster.membership import Seats

    seats, seat_a, seat_b = Seats(), {"scheduling_strategy": "bundle 0"}, {"scheduling_strategy": "bundle 1"}
    assert seats.take(0, seat_a) == seat_a and seats.take(1, seat_b) == seat_b
    on_node = {"resources": {"spot": 1}}
    assert seats.take(2, on_node) == on_node  # a node's resource is not a seat: nothing to give back
    seats.release(2)
    seats.release(0)
    assert seats.take(3, {}) == seat_a  # the next worker started sits where worker 0 sat
    assert seats.take(4, {}) == {}  # none free: the resources every added worker asks for
    seats.release(1, reusable=False)  # its node is leaving
    seats.release(3)
    assert seats.take(5, {}) == seat_a and seats.free == []


def test_in_flight_keeps_a_valid_prefix_through_lost_reports():
    from tailflow.engines.cluster.in_flight import InFlight
    from tailflow.engines.rollout.protocol import ResponsePrefix
    from tailflow.engines.rollout.worker import TokenDelta

    ledger = InFlight()
    ledger.add([Request("a#0", (1, 2), SamplingParams(max_new_tokens=9, seed=1),
                        ResponsePrefix((7,), (-0.5,), (2,)))])
    ledger.extend(TokenDelta("a#0", 1, (8, 9), (-1.0, -2.0), (3, 3)))
    ledger.extend(TokenDelta("a#0", 5, (4,), (-1.0,), (3,)))  # a streamed step was lost: the gap is not bridged
    ledger.extend(TokenDelta("a#0", 2, (9, 5), (-2.0, -3.0), (3, 3)))  # a repeated streamed step overlaps
    (continued,) = ledger.continued(["a#0"])
    assert continued.prefix == ResponsePrefix((7, 8, 9, 5), (-0.5, -1.0, -2.0, -3.0), (2, 3, 3, 3))
    partial = ledger.partial("a#0", 3)
    assert partial.finish_reason is FinishReason.ABORT and partial.token_weight_versions == (2, 3, 3, 3)
    ledger.forget("a#0")
    assert "a#0" not in ledger
