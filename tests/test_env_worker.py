"""Environment workers on real Ray (engines/env/worker.py, engines/cluster/env_group.py): failures cost one
trajectory, placement is sticky and least-loaded, the step cap holds, counters count, nothing outlives a worker."""
import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from env_cases import logged_steps, max_overlap
from tailflow.config import EnvConfig
from tailflow.engines.env.trajectory import StopReason
from test_env_host import is_gone

TESTS = Path(__file__).parent
ids = (f"t{n}" for n in itertools.count())


@pytest.fixture(scope="module")
def ray_with_test_envs():
    """One local Ray for the module; its workers (and so their environment processes) can import env_cases."""
    import ray

    from tailflow.engines.cluster.runtime import NO_IDLE_WORKERS

    path = os.pathsep.join([str(TESTS.parent), str(TESTS)])
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, _system_config=NO_IDLE_WORKERS,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def config(log_dir, **fields) -> EnvConfig:
    values = dict(class_path="env_cases:Scripted", settings={"log_dir": str(log_dir)}, num_workers=2,
                  max_concurrent_steps=2, step_timeout_s=1.0, reset_timeout_s=10.0, reset_retries=0,
                  observation_max_tokens=8, invalid_action_reward=-0.5)
    return EnvConfig(**{**values, **fields})


@pytest.fixture(scope="module")
def group(ray_with_test_envs, tmp_path_factory):
    from tailflow.engines.cluster.env_group import EnvGroup

    log_dir = tmp_path_factory.mktemp("env-logs")
    env_group = EnvGroup(config(log_dir))
    env_group.log_dir = log_dir
    yield env_group
    env_group.shutdown()


def reset(group, count: int, seed: int = 0):
    outcomes = group.reset_many([(next(ids), seed) for _ in range(count)])
    assert all(outcome.failure is None for outcome in outcomes)
    return outcomes


def test_a_failing_environment_costs_one_trajectory_and_the_worker_goes_on(group):
    before = group.counters().failures.get("env_error", 0)
    broken, healthy = reset(group, 2)
    failed, fine = group.step_many([(broken.trajectory_id, "boom"), (healthy.trajectory_id, "x")])
    assert failed.failure.reason == StopReason.ENV_ERROR and "the environment broke" in failed.failure.message
    assert (fine.failure, fine.observation) == (None, "x.")
    assert group.counters().failures["env_error"] == before + 1
    assert is_gone(broken.env_pid) and broken.trajectory_id not in group.placement
    group.close([healthy.trajectory_id])


def test_a_hanging_step_times_out_and_its_process_is_killed(group):
    before = group.counters().failures.get("timeout", 0)
    [hung] = reset(group, 1)
    [outcome] = group.step_many([(hung.trajectory_id, "hang")])
    assert outcome.failure.reason == StopReason.TIMEOUT and 1.0 <= outcome.seconds < 3.0
    assert is_gone(hung.env_pid)
    assert group.counters().failures["timeout"] == before + 1


def test_a_sigkilled_environment_is_an_env_error_and_counted(group):
    before = group.counters().failures.get("env_error", 0)
    [victim] = reset(group, 1)
    assert group.step_many([(victim.trajectory_id, "a")])[0].observation == "a."
    os.kill(victim.env_pid, signal.SIGKILL)
    [outcome] = group.step_many([(victim.trajectory_id, "b")])
    assert outcome.failure.reason == StopReason.ENV_ERROR and outcome.failure.message.endswith("died")
    assert group.counters().failures["env_error"] == before + 1


def test_an_invalid_action_is_penalised_and_the_trajectory_goes_on(group):
    before = group.counters().invalid_actions
    [player] = reset(group, 1)
    [invalid] = group.step_many([(player.trajectory_id, "bad")])
    assert (invalid.failure, invalid.invalid_action, invalid.reward, invalid.observation) == (None, True, -0.5, "?\n")
    [then] = group.step_many([(player.trajectory_id, "done")])
    assert (then.done, then.reward) == (True, 1.0)
    assert group.counters().invalid_actions == before + 1
    assert player.trajectory_id not in group.placement and is_gone(player.env_pid)  # done closes it


def test_a_long_observation_is_cut_and_counted(group):
    before = group.counters().cut_observations
    [talker] = reset(group, 1)
    [outcome] = group.step_many([(talker.trajectory_id, "long")])
    assert (outcome.observation, outcome.observation_cut) == ("7" * 8, True)
    assert group.counters().cut_observations == before + 1
    group.close([talker.trajectory_id])


def test_trajectories_go_to_the_least_loaded_worker_and_stay_there(group):
    assert group.live_trajectories() == [0, 0]
    first = reset(group, 4, seed=3)
    assert [group.worker_of(o.trajectory_id) for o in first] == [0, 1, 0, 1]
    assert len({o.worker_pid for o in first}) == 2 and {o.observation for o in first} == {"3\n"}
    for turn in range(3):  # a step sent to another worker would raise there (it holds no such environment)
        outcomes = group.step_many([(o.trajectory_id, f"{turn}") for o in first])
        assert [o.observation for o in outcomes] == [f"{turn}."] * 4
    assert [group.worker_of(o.trajectory_id) for o in first] == [0, 1, 0, 1]
    group.close([first[0].trajectory_id, first[2].trajectory_id])  # worker 0 now holds none
    [late] = reset(group, 1)
    assert group.worker_of(late.trajectory_id) == 0
    group.close([o.trajectory_id for o in first[1::2]] + [late.trajectory_id])


def test_no_worker_runs_more_steps_at_once_than_its_cap(group):
    """8 steps of 0.4 s over 2 workers capped at 2 each: each worker runs 2 at a time (counted from the
    environments' own logs), both workers at once, so about 0.8 s in all."""
    trajectories = reset(group, 8)
    worker_of_pid = {o.env_pid: group.worker_of(o.trajectory_id) for o in trajectories}
    started = time.monotonic()
    outcomes = group.step_many([(o.trajectory_id, "slow:0.4") for o in trajectories])
    elapsed = time.monotonic() - started
    assert all(o.failure is None for o in outcomes)
    per_worker = {0: [], 1: []}
    for pid, start, end in logged_steps(group.log_dir):
        per_worker[worker_of_pid[pid]].append((start, end))
    assert [len(intervals) for intervals in per_worker.values()] == [4, 4]
    assert [max_overlap(intervals) for intervals in per_worker.values()] == [2, 2]
    assert max_overlap(per_worker[0] + per_worker[1]) >= 3  # the two workers overlapped
    assert 0.8 <= elapsed < 3.0
    assert group.counters().peak_concurrent_calls == 2
    group.close([o.trajectory_id for o in trajectories])


def test_close_all_ends_every_environment(group):
    trajectories = reset(group, 3)
    assert group.close_all() == 3
    assert all(is_gone(o.env_pid) for o in trajectories)
    assert group.counters().active_environments == 0 and group.placement == {}


def test_a_killed_worker_takes_its_environments_with_it(ray_with_test_envs, tmp_path):
    import ray

    from tailflow.engines.cluster.env_group import EnvGroup

    doomed = EnvGroup(config(tmp_path, num_workers=1))
    trajectories = doomed.reset_many([(next(ids), 0), (next(ids), 1)])
    assert all(not is_gone(o.env_pid, within_s=0) for o in trajectories)
    ray.kill(doomed.workers[0])
    assert all(is_gone(o.env_pid) for o in trajectories)


# ---- the worker in this process (the same class the actors run) ---------------------------------------------

def test_a_killed_launcher_takes_its_environments_and_the_worker_starts_another(tmp_path):
    from tailflow.engines.env.worker import EnvironmentWorker

    worker = EnvironmentWorker(config(tmp_path))
    try:
        before = worker.reset("before", 0)
        os.kill(worker.launcher.process.pid, signal.SIGKILL)
        assert is_gone(before.env_pid)  # PDEATHSIG: the launcher was its parent
        assert worker.step("before", "x").failure.reason == StopReason.ENV_ERROR
        after = worker.reset("after", 0)
        assert after.failure is None and worker.step("after", "x").observation == "x."
    finally:
        worker.close_all()
        worker.launcher.close()


def test_close_all_kills_an_environment_in_the_middle_of_a_step_at_once(tmp_path):
    import threading

    from tailflow.engines.env.worker import EnvironmentWorker

    worker = EnvironmentWorker(config(tmp_path, step_timeout_s=60.0))
    try:
        hung = worker.reset("hung", 0)
        outcomes = []
        stepping = threading.Thread(target=lambda: outcomes.append(worker.step("hung", "hang")))
        stepping.start()
        time.sleep(0.2)
        started = time.monotonic()
        assert worker.close_all() == 1
        stepping.join(timeout=5)
        assert time.monotonic() - started < 1.0 and is_gone(hung.env_pid)
        assert outcomes[0].failure.reason == StopReason.ENV_ERROR
    finally:
        worker.launcher.close()


def test_a_worker_retries_a_failing_reset_and_counts_it(tmp_path):
    from tailflow.engines.env.worker import EnvironmentWorker

    worker = EnvironmentWorker(config(tmp_path, settings={"log_dir": str(tmp_path), "fail_resets": 99},
                                      reset_retries=1, reset_backoff_s=0.05))
    try:
        outcome = worker.reset("flaky", 0)
        assert (outcome.failure.reason, outcome.attempts) == (StopReason.ENV_ERROR, 2)
        counters = worker.counters()
        assert (counters.resets, counters.reset_retries, counters.failures) == (1, 1, {"env_error": 1})
        assert counters.active_environments == 0 and is_gone(outcome.env_pid)
    finally:
        worker.launcher.close()


# ---- injected faults (env.faults, engines/env/faults.py) ------------------------------------------------------

def test_fault_plans_are_drawn_per_trajectory_id_at_the_configured_rates():
    from tailflow.config import EnvFaults
    from tailflow.engines.env.faults import FaultPlan

    faults = EnvFaults(step_latency_median_s=0.1, step_latency_sigma=1.5, fail_slow_fraction=0.1,
                       fail_stop_fraction=0.05, fail_stop_within_steps=3)
    plans = [FaultPlan.of(f"p{n}#0", faults) for n in range(4000)]
    assert FaultPlan.of("p7#0", faults) == plans[7]  # the same id, the same faults
    slow = sum(plan.slow_factor > 1 for plan in plans) / len(plans)
    stopped = [plan.stop_at_step for plan in plans if plan.stop_at_step is not None]
    assert abs(slow - 0.1) < 0.02 and abs(len(stopped) / len(plans) - 0.05) < 0.015
    assert set(stopped) == {0, 1, 2}
    delays = sorted(plans[0].latency_s(step) for step in range(2000))
    assert delays[1000] == pytest.approx(0.1, rel=0.15) and delays[-20] > 10 * delays[1000]  # heavy-tailed
    assert plans[0].latency_s(5) == plans[0].latency_s(5)


def test_injected_faults_happen_in_the_environments_process(tmp_path):
    """A delay is slept in the environment's process (the step takes at least that long); one past the step
    timeout is that step's timeout (the process killed); a fail-stop environment's process is SIGKILLed before
    its drawn step, which then finds it dead."""
    from tailflow.engines.env.worker import EnvironmentWorker

    slow = EnvironmentWorker(config(tmp_path, faults={"step_latency_median_s": 0.3}))
    stuck = EnvironmentWorker(config(tmp_path, faults={"step_latency_median_s": 0.3, "fail_slow_fraction": 1.0,
                                                       "fail_slow_factor": 10.0}))
    dying = EnvironmentWorker(config(tmp_path, faults={"fail_stop_fraction": 1.0, "fail_stop_within_steps": 1}))
    try:
        slow.reset("a", 0)
        outcome = slow.step("a", "x")
        assert outcome.failure is None and outcome.observation == "x." and outcome.seconds >= 0.3
        hung = stuck.reset("b", 0)
        outcome = stuck.step("b", "x")
        assert outcome.failure.reason == StopReason.TIMEOUT and outcome.seconds >= 1.0 and is_gone(hung.env_pid)
        victim = dying.reset("c", 0)
        outcome = dying.step("c", "x")
        assert outcome.failure.reason == StopReason.ENV_ERROR and is_gone(victim.env_pid)
        assert dying.counters().failures == {"env_error": 1} and stuck.counters().failures == {"timeout": 1}
    finally:
        for worker in (slow, stuck, dying):
            worker.launcher.close()


def test_under_the_async_schedule_a_hung_environment_costs_its_trajectory_and_holds_no_other(ray_with_test_envs,
                                                                                           tmp_path):
    """Trajectories on real environment workers, one of whose environments is fail-slow past the step timeout:
    under `env.schedule: async` the others take all their turns while it hangs; it ends `timeout` after the step
    timeout. Costs ~8 s (two environment workers, the 4 s timeout: the healthy trajectories' time to finish)."""
    from tailflow.config import EnvFaults
    from tailflow.engines.cluster.env_connector import RemoteEnvironments
    from tailflow.engines.cluster.env_group import EnvGroup
    from tailflow.engines.data.chat_turns import PlainTextTurns
    from tailflow.engines.env.faults import FaultPlan
    from tailflow.engines.rollout import NativeEngine, SamplingParams
    from tailflow.engines.rollout.protocol import Request
    from tailflow.engines.rollout.trajectory_engine import EnvSchedule, TrajectoryEngine, TurnLimits
    from test_multi_turn import EOS, STOPS, TOKENIZER, tiny_model

    faults = EnvFaults(step_latency_median_s=0.02, fail_slow_fraction=0.3, fail_slow_factor=400.0)
    ids = [f"p{n}#0" for n in range(40)]
    hung = next(i for i in ids if FaultPlan.of(i, faults).slow_factor > 1)
    healthy = [i for i in ids if FaultPlan.of(i, faults).slow_factor == 1][:3]
    group = EnvGroup(config(tmp_path, faults=faults.model_dump(), step_timeout_s=4.0))  # the others' ample time
    try:
        inner = NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,))
        engine = TrajectoryEngine(inner, RemoteEnvironments(group.workers), PlainTextTurns(TOKENIZER),
                                  TurnLimits(3, 8, 60, 128), schedule=EnvSchedule.ASYNC)
        params = SamplingParams(temperature=1.0, seed=3, stop_token_ids=STOPS)
        engine.submit([Request(i, tuple(TOKENIZER.encode("12ab ")), params, problem_id=i.split("#")[0])
                       for i in [hung, *healthy]])
        ended = []
        while engine.has_unfinished():
            ended += engine.step()
        assert [c.request_id for c in ended][-1] == hung and sorted(c.request_id for c in ended[:-1]) == sorted(healthy)
        assert ended[-1].outcome.stop_reason is StopReason.TIMEOUT and ended[-1].outcome.env_step_s[-1] >= 4.0
        assert all(c.outcome.stop_reason is not StopReason.TIMEOUT for c in ended[:-1])
    finally:
        group.shutdown()


def test_a_trajectory_closed_during_its_step_or_reset_is_stopped_not_counted_as_a_failure(tmp_path):
    """The async schedule closes an aborted trajectory's environment without waiting: a step killed under it
    fails (its reply is never read) but is not the environment's failure, so it is not counted; a trajectory
    closed while its reset runs has its environment closed the moment the reset returns (nothing left
    running)."""
    import threading

    from tailflow.engines.env.worker import EnvironmentWorker

    worker = EnvironmentWorker(config(tmp_path, step_timeout_s=60.0, faults={"step_latency_median_s": 30.0}))
    try:
        stepped = worker.reset("s", 0)
        outcomes = []
        stepping = threading.Thread(target=lambda: outcomes.append(worker.step("s", "x")))
        stepping.start()
        time.sleep(0.2)
        worker.close("s")
        stepping.join(timeout=10)
        assert outcomes[0].failure.reason == StopReason.ENV_ERROR and is_gone(stepped.env_pid)
        assert worker.counters().failures == {} and worker.counters().active_environments == 0
        assert worker.step("s", "y").failure.reason == StopReason.ENV_ERROR  # closed: an outcome, not an error
        assert worker.counters().failures == {}
    finally:
        worker.launcher.close()
    slow_reset = EnvironmentWorker(config(tmp_path, settings={"log_dir": str(tmp_path), "slow_reset_s": 1.0}))
    try:
        resets = []
        resetting = threading.Thread(target=lambda: resets.append(slow_reset.reset("r", 0)))
        resetting.start()
        time.sleep(0.3)
        slow_reset.close("r")
        resetting.join(timeout=10)
        assert resets[0].failure is None and is_gone(resets[0].env_pid)
        assert slow_reset.counters().active_environments == 0
    finally:
        slow_reset.launcher.close()
