"""Resource mapping: what colocated and disaggregated runs ask Ray for, refused clearly when it cannot fit."""
from __future__ import annotations

import pytest

from tailflow.config import ConfigError, load_config
from tailflow.engines.cluster.placement import check_cluster_fits, check_fits, placement_for, placement_of


def test_colocated_actors_share_devices_and_disaggregated_ones_do_not():
    colocated = placement_of(load_config(None, ["rollout.num_workers=2", "train.num_workers=2"]))
    assert colocated.needs() == {"CPU": 2.0}
    apart = placement_of(load_config(None, ["rollout.num_workers=2", "train.num_workers=2",
                                            "cluster.placement=disaggregated"]))
    assert apart.needs() == {"CPU": 4.0}
    gpu = placement_for("gpu", "colocated", num_rollout=4, num_trainer=4)  # no config reaches it (refused below)
    assert gpu.needs() == {"CPU": 8.0, "GPU": 4.0}  # 8 actors, two per GPU


def test_a_gpu_run_is_refused_at_validation_saying_what_is_missing():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["cluster.device=gpu"])
    message = str(error.value)
    assert "cluster.device: " in message and "gpu is not supported yet" in message
    assert "never run on a GPU" in message and "rollout workers are built on the CPU" in message
    assert "two trainer ranks on one GPU" in message  # colocated halves are not exclusive


def test_a_run_that_cannot_fit_is_refused_with_the_numbers():
    placement = placement_for("gpu", "disaggregated", num_rollout=1, num_trainer=2)
    with pytest.raises(ConfigError, match=r"needs 3 GPU \(the cluster has 1\)"):
        check_fits(placement, {"CPU": 64.0, "GPU": 1.0}, "disaggregated")
    check_fits(placement, {"CPU": 64.0, "GPU": 3.0}, "disaggregated")


def test_checked_against_the_attached_ray_cluster(ray_session):
    import ray

    have = int(ray.cluster_resources()["CPU"])  # 4 from the fixture, or what an earlier test's Ray started with
    check_cluster_fits(load_config(None, []))  # colocated 1 rollout + 2 trainer ranks need 1.5
    with pytest.raises(ConfigError, match=rf"needs {have + 2} CPU \(the cluster has {have}\)"):
        check_cluster_fits(load_config(None, ["rollout.num_workers=2", f"train.num_workers={have}",
                                              "cluster.placement=disaggregated"]))
