"""Ray node drains as preemption notices (issue 17): which workers a drain names, how often the GCS is asked,
and a real two-node Ray cluster whose node is drained under a rollout worker mid-round."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ray._common.utils import get_ray_address_file

from tailflow.engines.cluster.node_drain import DrainNotice, DrainWatch, notices_for
from tailflow.engines.models import write_random_tiny_model


def test_notices_name_the_workers_on_draining_nodes_only():
    node_of = {2: "bbbb", 0: "aaaa", 5: "cccc", 3: "aaaa"}
    assert notices_for(node_of, {"aaaa": 1_000, "zzzz": 7}) == [DrainNotice(0, "aaaa", 1_000),
                                                                DrainNotice(3, "aaaa", 1_000)]
    assert notices_for(node_of, {}) == []
    assert DrainNotice(0, "aaaabbbbcccc", 61_400).detail(now_s=1.0) == "node aaaabbbb draining (60 s before it goes)"
    assert DrainNotice(0, "aaaabbbbcccc", 0).detail(now_s=1.0) == "node aaaabbbb draining (no deadline)"


def test_the_watch_asks_at_most_every_interval_and_survives_a_failing_gcs():
    now, asked, said = [0.0], [], []
    answers = iter([{"n1": 5}, TimeoutError("gcs busy"), TimeoutError("gcs busy"), {"n2": 0}])

    def query():
        asked.append(now[0])
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watch = DrainWatch(interval_s=1.0, query=query, clock=lambda: now[0], say=said.append)
    assert watch.notices({}) == [] and asked == []  # no worker placed: nothing to ask
    assert watch.notices({0: "n1", 1: "n2"}) == [DrainNotice(0, "n1", 5)]
    now[0] = 0.5
    assert watch.notices({0: "n1", 1: "n2"}) == [] and asked == [0.0]  # within the interval: not asked
    for t in (1.0, 2.0):  # two failures in a row are said once
        now[0] = t
        assert watch.notices({1: "n2"}) == []
    assert len(said) == 1 and "gcs busy" in said[0]
    now[0] = 3.0
    assert watch.notices({1: "n2"}) == [DrainNotice(1, "n2", 0)] and asked == [0.0, 1.0, 2.0, 3.0]


def test_a_ray_without_the_call_turns_the_watch_off_saying_so():
    said, asked = [], []

    def query():
        asked.append(1)
        raise AttributeError("'GcsClient' object has no attribute 'get_draining_nodes'")

    watch = DrainWatch(interval_s=0, query=query, say=said.append)
    assert watch.notices({0: "n"}) == [] and watch.notices({0: "n"}) == []
    assert asked == [1] and len(said) == 1 and "moved only when the node dies" in said[0]


@pytest.mark.slow
@pytest.mark.long  # its own two-node Ray (two raylets) and three workers: ~30 s on 2 cores
def test_a_worker_on_a_drained_node_hands_over_and_its_replacement_lands_elsewhere(tmp_path):
    """Costs ~41 s here (node_drain_scenario.py as its own process: its own two-node Ray, two raylets, and three
    rollout workers started): a drain is a property of a node, so the scenario needs a second raylet to drain and
    another node for the replacement to land on, which the session's one-node Ray cannot give."""
    write_random_tiny_model(tmp_path, seed=1)
    scenario = Path(__file__).with_name("node_drain_scenario.py")
    # The scenario's Ray records itself as this machine's current cluster (as `ray start` does) and forgets it on
    # shutdown; should it die first, the record must not outlive it, or every later ray.init() would join it.
    address_file = Path(get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    try:
        run = subprocess.run([sys.executable, str(scenario), str(tmp_path)], capture_output=True, text=True,
                             timeout=400)
    finally:
        if before is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(before)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])

    assert result["nodes_before"] == {"0": result["spot_node"], "1": result["head_node"]}
    kinds = [(e["kind"], e["worker_id"]) for e in result["events"]]
    assert kinds[:2] == [("leave", 0), ("migrate", 0)], result["events"]
    leave = result["events"][0]
    assert leave["detail"].startswith(f"node {result['spot_node'][:8]} draining (") and leave["num_requests"] > 0
    assert ("join", 2) in kinds and ("lost", 0) not in kinds
    assert result["worker_ids"] == [1, 2] and result["nodes_after"]["2"] == result["head_node"]
    # Every request finished once, with the tokens it would have drawn on one uninterrupted engine.
    assert result["finished"] == result["expected"]
    assert result["versions"] == [3]
