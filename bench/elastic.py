"""Elastic rollout workers (issue 17): FluidRL's join schedule, compressed, on real Ray actors.

One short round per iteration (tail batching's completion rule, streamed by the
product's rollout pipeline) on a `RolloutGroup` that starts with one worker; every `--join-every` iterations a
worker joins in the middle of the round (a `tailflow workers add` command
through the run's control channel), up to 4; then the oldest leaves with
notice (`remove`), and in the last iteration one worker is SIGKILLed mid-round
(no notice). Every iteration is also run, with the same seeds, on one worker
that nothing happens to: the reference.

This machine has 2 cores, so throughput cannot grow with workers; the bench
reports correctness (every prompt trained once or queued, kept responses'
tokens equal to the reference's, no iteration restarted) and the cost of a
migration: tokens re-prefilled, and the seconds that costs, estimated from a
re-prefill measured in-process on the same model. Tokens/s per worker count
are printed for the record only.

    python bench/elastic.py [--iterations 10] [--join-every 2] [--quick]
Last line: RESULT migrations=<n> lost_prompts=0 iteration_restarts=0
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/research

from tailflow.engines.cluster import ACTOR_FAILURES  # noqa: E402
from tailflow.engines.cluster.membership import ElasticSettings  # noqa: E402
from tailflow.engines.cluster.membership_log import EventKind  # noqa: E402
from tailflow.engines.cluster.rollout_group import RolloutGroup  # noqa: E402
from tailflow.engines.cluster.worker_control import WorkerCommand, WorkerControl, send_worker_command  # noqa: E402
from tailflow.engines.models import write_random_tiny_model  # noqa: E402
from tailflow.engines.data.problem import Problem  # noqa: E402
from tailflow.engines.rollout.native import NativeEngine  # noqa: E402
from tailflow.engines.rollout.protocol import Request, ResponsePrefix, SamplingParams  # noqa: E402
from tailflow.engines.store.local import LocalStore  # noqa: E402
from tailflow.engines.tail.pipeline import RolloutPipeline  # noqa: E402
from tailflow.engines.tail.planner import RoundKind, RoundPlan  # noqa: E402
from tailflow.engines.tail.round import PlannedRound  # noqa: E402
from tailflow.engines.tail.state import TailSettings, TailState  # noqa: E402

MAX_WORKERS = 4
STEPS_PER_POLL = 4


def round_requests(iteration: int, num_prompts: int, per_prompt: int, max_new_tokens: int) -> list[Request]:
    return [Request.for_problem(f"i{iteration}p{p}", k, (5 + (p + iteration) % 9, 12 + k % 3, 13),
                                SamplingParams(max_new_tokens=max_new_tokens, seed=10_000 * iteration + 100 * p + k))
            for p in range(num_prompts) for k in range(per_prompt)]


def planned_change(iteration: int, join_every: int, num_iterations: int, joined: int) -> str | None:
    """FluidRL's schedule, compressed: a join every `join_every` iterations up to MAX_WORKERS, then the oldest
    leaves with notice; the last iteration loses a worker without notice."""
    if iteration == num_iterations - 1:
        return "kill"
    if iteration and iteration % join_every == 0:
        return "add" if joined < MAX_WORKERS else "remove"
    return None


CHANGE_AT_POLL = 5


class ChangeMidRound:
    """The group, with the iteration's membership change made just before its CHANGE_AT_POLL-th poll. A join
    is waited for there (a worker takes ~20 s to start on 2 busy cores, longer than a round), so it lands
    inside the round: a run's other workers would keep stepping meanwhile."""

    def __init__(self, group: RolloutGroup, store: LocalStore, change: str | None) -> None:
        self.group, self.store, self.change, self.num_polls = group, store, change, 0
        self.join_wait_s = 0.0
        """Seconds spent waiting for the joiner (actor start + weight load): not counted as rollout time."""

    def poll(self, max_steps: int):
        self.num_polls += 1
        if self.num_polls == CHANGE_AT_POLL and self.change is not None:
            if self.change == "add":
                started = time.perf_counter()
                send_worker_command(self.store, "bench", WorkerCommand(add=1))
                self.group.apply_control()
                self.group.wait_for_joins()
                self.join_wait_s = time.perf_counter() - started
            elif self.change == "remove":
                send_worker_command(self.store, "bench", WorkerCommand(remove=min(self.group.membership.worker_ids)))
            else:
                os.kill(self.group.worker_pid(len(self.group.membership.workers) - 1), signal.SIGKILL)
        return self.group.poll(max_steps)

    def __getattr__(self, name):
        return getattr(self.group, name)


def play_round(rollout, iteration: int, requests: list[Request], args):
    """Iteration `iteration`'s short round (keep per_prompt - 1 responses of half the prompts) on the product's
    pipeline at alpha 0, planned as given rather than from data; the rule's result."""
    problems = [Problem(pid, "", "") for pid in dict.fromkeys(r.problem_id for r in requests)]
    plan = RoundPlan(RoundKind.SHORT, iteration, len(problems), (), args.per_prompt, args.per_prompt - 1,
                     args.prompts // 2)
    planned = PlannedRound(plan, problems, TailState())
    settings = TailSettings(args.prompts // 2, args.per_prompt - 1, steps_per_poll=STEPS_PER_POLL)
    pipeline = RolloutPipeline(rollout, settings, 0.0, False, problems, lambda _: requests,
                               plan=lambda tail, j, live: planned)
    pipeline.start(TailState(), iteration)
    return pipeline.take(iteration).result


def reprefill_seconds_per_token(model_dir: Path, length: int) -> float:
    """Seconds one re-prefilled response token costs: a request continued from a `length`-token prefix, minus
    the same request from scratch, for its first step (prefill + one decode), in-process, best of 9."""
    engine = NativeEngine.from_pretrained(model_dir, 1, length + 64)
    prefix = ResponsePrefix(tuple([14] * length), tuple([0.0] * length), tuple([0] * length))

    def first_step(with_prefix: bool) -> float:
        best = float("inf")
        for attempt in range(9):
            request = Request(f"r{with_prefix}{attempt}#0", (5, 12, 13), SamplingParams(max_new_tokens=length + 8),
                              prefix if with_prefix else None)
            engine.submit([request])
            started = time.perf_counter()
            engine.step()
            best = min(best, time.perf_counter() - started)
            engine.abort([request.request_id])
        return best

    return max(0.0, first_step(True) - first_step(False)) / length


def simulator_prediction(schedule: list[int]) -> str:
    """The simulator's predicted numbers (`bench/research/spot_workers.py`) for FluidRL's setting (qwen2.5-7b,
    8 x H100 per worker, 8k cap), priced by the simulator's rollout model: tokens/s per worker count this bench's
    schedule visited, the seconds one migration's re-prefill costs there (an upper bound: a full KV cache), and
    tokens per dollar of those worker counts a quarter hour each at FluidRL's prices, on demand and on spot
    (0.1 preemptions a worker-hour; `bench/sim_spot.py` varies all of it). Measured numbers above are this CPU's;
    these are the cluster's, predicted, never measured here."""
    from research.spot import (FLUIDRL_ON_DEMAND_PER_HOUR, FLUIDRL_SPOT_PER_HOUR, Interval, SpotTerms,
                               schedule_cost)
    from research.spot_workers import simulated_workers

    model = simulated_workers("qwen2.5-7b", max(schedule), min_rounds=2, max_new_tokens=8192)
    counts = sorted(set(schedule))
    rates = "  ".join(f"{k} workers: {model.throughput[k]:,.0f} tokens/s" for k in counts)
    cost = schedule_cost([Interval(0.25, k) for k in counts], model,
                         SpotTerms(FLUIDRL_ON_DEMAND_PER_HOUR, FLUIDRL_SPOT_PER_HOUR, preemptions_per_hour=0.1))
    return (f"sim (predicted, {model.source}): {rates}; re-prefill per migration <= {model.reprefill_s:.1f} s; "
            f"{', '.join(map(str, counts))} workers a quarter hour each: {cost.tokens_per_dollar_on_demand:,.0f} "
            f"tokens/$ on demand, {cost.tokens_per_dollar_spot:,.0f} on spot (0.1 preemptions/h)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--join-every", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--per-prompt", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--quick", action="store_true", help="5 iterations, a join every iteration (smoke)")
    args = parser.parse_args()
    if args.quick:
        args.iterations, args.join_every, args.prompts, args.max_new_tokens = 6, 1, 4, 24

    import ray

    ray.init(num_cpus=8, include_dashboard=False, configure_logging=False, log_to_driver=False)
    work = Path(tempfile.mkdtemp(prefix="tailflow-elastic-"))
    model_dir = write_random_tiny_model(work / "model")
    store = LocalStore(work / "store")
    spawn = dict(num_slots=4, max_seq_len=128, seed=0, num_threads=1, num_cpus=0.5)
    group = RolloutGroup(str(model_dir), 1, **spawn, elastic=ElasticSettings(
        control=WorkerControl(store, "bench", interval_s=0), say=lambda line: print(line, flush=True)))
    members = group.membership
    reference = RolloutGroup(str(model_dir), 1, **spawn)
    tokens_at, seconds_at = defaultdict(int), defaultdict(float)
    lost_prompts = restarts = mismatched = compared = 0
    migrations, moved_tokens, notice_moves, lost_moves = 0, 0, 0, 0
    schedule = []
    try:
        for iteration in range(args.iterations):
            requests = round_requests(iteration, args.prompts, args.per_prompt, args.max_new_tokens)
            change = planned_change(iteration, args.join_every, args.iterations,
                                    len(members.workers) + len(members.joining))
            group.wait_for_joins()  # the replacement of a worker lost in the last round
            workers_before = len(members.workers)
            before = sum(s.tokens_generated for s in group.stats())
            started = time.perf_counter()
            rollout = ChangeMidRound(group, store, change)
            try:
                result = play_round(rollout, iteration, requests, args)
            except ACTOR_FAILURES:  # what the flow would turn into an iteration restart
                restarts += 1
                continue
            seconds = time.perf_counter() - started - rollout.join_wait_s
            tokens = sum(s.tokens_generated for s in group.stats()) - before
            expected = play_round(reference, iteration, requests, args)
            changes = group.take_membership()
            launched = {r.problem_id for r in requests}
            completed = [pid for pid, _ in result.completed]
            trained_or_queued = set(completed) | set(result.deferred_problem_ids)
            lost_prompts += len(launched - trained_or_queued) + len(completed) - len(set(completed))
            ours = {c.request_id: c.token_ids for _, kept in result.completed for c in kept}
            theirs = {c.request_id: c.token_ids for _, kept in expected.completed for c in kept}
            both = set(ours) & set(theirs)
            compared += len(both)
            mismatched += sum(ours[rid] != theirs[rid] for rid in both)
            moves = [e for e in changes.events if e.kind is EventKind.MIGRATE]
            migrations += sum(e.num_requests for e in moves)
            moved_tokens += sum(e.num_tokens for e in moves)
            left_with_notice = {e.worker_id for e in changes.events if e.kind is EventKind.LEAVE}
            notice_moves += sum(e.num_requests for e in moves if e.worker_id in left_with_notice)
            lost_moves += sum(e.num_requests for e in moves if e.worker_id not in left_with_notice)
            count = max(workers_before, len(members.workers))
            schedule.append(count)
            tokens_at[count] += tokens
            seconds_at[count] += seconds
            rates = " ".join(f"w{wid}={rate:.0f}" for wid, rate in changes.tokens_per_s.items())
            print(f"iter {iteration:2d}  change={change or '-':6s} workers {workers_before}->{len(members.workers)}  "
                  f"{tokens:5d} tokens in {seconds:5.2f}s  migrated {sum(e.num_requests for e in moves):2d} requests "
                  f"/{sum(e.num_tokens for e in moves):4d} tokens  tokens/s per worker: {rates}"
                  + (f"  (join waited {rollout.join_wait_s:.1f}s, not counted)" if rollout.join_wait_s else ""),
                  flush=True)
    finally:
        group.shutdown()
        reference.shutdown()
        ray.shutdown()

    per_token_s = reprefill_seconds_per_token(model_dir, 128)
    print("\nworkers  tokens/s  (2 shared cores: more workers cannot mean more throughput here)")
    for count in sorted(tokens_at):
        print(f"{count:7d}  {tokens_at[count] / seconds_at[count]:8.1f}")
    print(f"\nmigrations: {migrations} requests ({notice_moves} handed over with notice, {lost_moves} recovered "
          f"from streamed tokens after a SIGKILL), {moved_tokens} tokens re-prefilled")
    if migrations:
        mean_tokens = moved_tokens / migrations
        print(f"cost per migration: {mean_tokens:.1f} tokens re-prefilled ~ {mean_tokens * per_token_s * 1e3:.2f} ms "
              f"(re-prefill measured in-process: {per_token_s * 1e6:.1f} us/token); without notice, also at most "
              f"{STEPS_PER_POLL} decode steps regenerated per request (the tokens since the last poll)")
    print(f"correctness: {compared} kept responses compared with the undisturbed run, {mismatched} differ; "
          f"{lost_prompts} prompts neither trained nor queued; {restarts} rounds would have restarted")
    print(simulator_prediction(schedule))
    print(f"RESULT migrations={migrations} lost_prompts={lost_prompts} iteration_restarts={restarts}")
    return 0 if lost_prompts == 0 and restarts == 0 and mismatched == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
