"""A Ray node drained under a rollout worker mid-round, in its own multi-node Ray (run by test_node_drain.py
in a subprocess: the test session's Ray is single-node, and a drained node cannot be undrained).

A head node ("stable") and a second node ("spot"), each a real raylet. Worker 0 runs on the spot node, worker 1
on the head. After the first poll, the spot node is drained as Ray's autoscaler drains a preempted instance
(reason PREEMPTION, a deadline); the round then runs to the end. Prints one JSON line: the events, the nodes,
and every finished request's tokens next to those an uninterrupted local engine drew.
"""
from __future__ import annotations

import json
import sys
import time


def main(model_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, resources={"stable": 1},
                                                                include_dashboard=False))
    try:
        print(json.dumps(drain_mid_round(cluster, model_dir)))
    finally:
        ray.shutdown()
        cluster.shutdown()  # also forgets its address: a later ray.init() must start its own Ray


def drain_mid_round(cluster, model_dir: str) -> dict:
    import ray
    from ray.core.generated import autoscaler_pb2

    from tailflow.engines.cluster.membership import ElasticSettings
    from tailflow.engines.cluster.rollout_group import RolloutGroup
    from tailflow.engines.rollout.native import NativeEngine
    from tailflow.engines.rollout.protocol import Request, SamplingParams

    spot = cluster.add_node(num_cpus=1, resources={"spot": 1})
    ray.init(address=cluster.address, configure_logging=False)
    cluster.wait_for_nodes()

    requests = [Request(f"q{p}#{k}", (5 + p, 12 + k, 13), SamplingParams(max_new_tokens=40, seed=1000 * p + k))
                for p in range(4) for k in range(2)]
    engine = NativeEngine.from_pretrained(model_dir, 4, 64)
    engine.load_weights(engine.runner.model.state_dict(), 3)
    expected = {c.request_id: list(c.token_ids) for c in engine.generate(requests)}

    said: list[str] = []
    group = RolloutGroup(model_dir, 2, num_slots=2, max_seq_len=64, seed=0, num_threads=1, num_cpus=0.5,
                         actor_options=[{"num_cpus": 0.5, "resources": {"spot": 1}},
                                        {"num_cpus": 0.5, "resources": {"stable": 0.5}}],
                         elastic=ElasticSettings(say=said.append, drain_check_s=0))
    group.load_weights(engine.runner.model.state_dict(), 3)
    nodes_before = dict(group.membership.node_of)
    group.submit(requests)
    finished = group.poll(2)
    gcs = ray._raylet.GcsClient(address=cluster.address)
    accepted, why = gcs.drain_node(spot.node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                   "spot instance interrupted", int(time.time() * 1000) + 120_000)
    assert accepted, why
    deadline = time.monotonic() + 120
    while len(finished) < len(requests) and time.monotonic() < deadline:
        finished += group.poll(2)  # each poll first admits the workers that hold the weights
    group.wait_for_joins()
    result = dict(
        spot_node=spot.node_id, head_node=cluster.head_node.node_id, nodes_before=nodes_before,
        nodes_after=dict(group.membership.node_of), worker_ids=list(group.membership.worker_ids),
        events=[dict(kind=e.kind.value, worker_id=e.worker_id, num_requests=e.num_requests, detail=e.detail)
                for e in group.membership.log.events],
        finished={c.request_id: list(c.token_ids) for c in finished}, expected=expected,
        versions=sorted({v for c in finished for v in c.token_weight_versions} | {c.weight_version for c in finished}),
        said=said)
    group.shutdown()
    return result


if __name__ == "__main__":
    main(sys.argv[1])
