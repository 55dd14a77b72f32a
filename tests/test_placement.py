"""Resource mapping: what colocated and disaggregated runs ask Ray for, refused clearly when it cannot fit; on GPUs,
the placement-group bundles (computed here by hand; tests/test_gpu_wiring.py seats actors in them on Ray's
logical GPUs; no real GPU has run them)."""
from __future__ import annotations

import pytest

from tailflow.config import ConfigError, load_config
from tailflow.engines.cluster.placement import (
    GpuLayout,
    GroupSpec,
    Seat,
    actor_options,
    check_cluster_fits,
    check_fits,
    gpu_layout,
    placement_for,
    placement_of,
    reserve,
)


def test_colocated_actors_share_devices_and_disaggregated_ones_do_not():
    colocated = placement_of(load_config(None, ["rollout.num_workers=2", "train.num_workers=2"]))
    assert colocated.needs() == {"CPU": 2.0}
    apart = placement_of(load_config(None, ["rollout.num_workers=2", "train.num_workers=2",
                                            "cluster.placement=disaggregated"]))
    assert apart.needs() == {"CPU": 4.0}
    gpu = placement_for("gpu", "colocated", num_rollout=4, num_trainer=4)
    assert gpu.needs() == {"CPU": 8.0, "GPU": 4.0}  # 8 actors, two per GPU


def test_colocated_gpus_pair_trainer_rank_and_rollout_worker_in_one_bundle():
    layout = gpu_layout("colocated", num_rollout=2, num_trainer=3)
    (group,) = layout.groups
    assert group == GroupSpec(({"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}), "PACK")
    assert layout.trainer == (Seat(0, 0, 1, 0.5), Seat(0, 1, 1, 0.5), Seat(0, 2, 1, 0.5))  # one GPU per rank
    assert layout.rollout == (Seat(0, 0, 1, 0.5), Seat(0, 1, 1, 0.5))  # beside ranks 0 and 1
    assert layout.needs() == {"CPU": 5.0, "GPU": 3.0}
    spread = gpu_layout("colocated", num_rollout=2, num_trainer=2, spread_trainer_ranks=True)
    assert spread.groups[0].strategy == "STRICT_SPREAD"


def test_a_critic_rank_shares_its_trainer_ranks_gpu_in_either_placement():
    colocated = gpu_layout("colocated", num_rollout=2, num_trainer=2, with_critic=True)
    assert colocated.groups[0].bundles == ({"CPU": 3.0, "GPU": 1.0},) * 2  # trainer, critic and rollout per GPU
    assert colocated.trainer == colocated.critic == (Seat(0, 0, 1, 0.25), Seat(0, 1, 1, 0.25))
    assert colocated.rollout == (Seat(0, 0, 1, 0.5), Seat(0, 1, 1, 0.5))
    assert colocated.needs() == {"CPU": 6.0, "GPU": 2.0}  # no GPU more than without a critic
    apart = gpu_layout("disaggregated", num_rollout=1, num_trainer=2, with_critic=True)
    assert apart.trainer == apart.critic == (Seat(0, 0, 1, 0.5), Seat(0, 1, 1, 0.5))
    assert apart.needs() == {"CPU": 5.0, "GPU": 3.0}
    assert gpu_layout("colocated", 1, 2).critic == ()


def test_disaggregated_gpus_give_every_actor_a_bundle_and_spread_only_the_trainer():
    layout = gpu_layout("disaggregated", num_rollout=1, num_trainer=2, spread_trainer_ranks=True)
    assert layout.groups == (GroupSpec(({"CPU": 1.0, "GPU": 1.0},) * 2, "STRICT_SPREAD"),
                             GroupSpec(({"CPU": 1.0, "GPU": 1.0},), "PACK"))
    assert layout.trainer == (Seat(0, 0, 1, 1), Seat(0, 1, 1, 1)) and layout.rollout == (Seat(1, 0, 1, 1),)
    assert layout.needs() == {"CPU": 3.0, "GPU": 3.0}
    assert gpu_layout("disaggregated", 1, 2).groups[0].strategy == "PACK"


def test_a_gpu_layout_reserves_whole_gpus():
    # 1 rollout worker + 2 trainer ranks colocated: half-GPU asks would total 1.5, but rank 1's bundle is a whole GPU.
    assert placement_for("gpu", "colocated", num_rollout=1, num_trainer=2).needs() == {"CPU": 3.0, "GPU": 1.5}
    with pytest.raises(ConfigError, match=r"needs 2 GPU \(the cluster has 1\)"):
        check_fits(gpu_layout("colocated", 1, 2), {"CPU": 8.0, "GPU": 1.0}, "colocated")


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


def test_placement_groups_are_reserved_or_refused_with_the_numbers(ray_session):
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpu_only = GpuLayout(groups=(GroupSpec(({"CPU": 0.25},), "PACK"),), trainer=(), rollout=(Seat(0, 0, 0.25, 0),))
    (group,) = reserve(cpu_only, timeout_s=60)
    options = actor_options(cpu_only.rollout[0], [group])
    assert (options["num_cpus"], options["num_gpus"]) == (0.25, 0)
    assert isinstance(options["scheduling_strategy"], PlacementGroupSchedulingStrategy)
    assert options["scheduling_strategy"].placement_group_bundle_index == 0
    remove_placement_group(group)
    with pytest.raises(ConfigError, match=r"\(1 bundles PACK\) in 0.5 s: it needs 2 CPU \(the cluster has \d+\), "
                                          r"1 GPU \(the cluster has 0\)"):
        reserve(gpu_layout("colocated", 1, 1), timeout_s=0.5)  # this Ray has no GPU: never reserved
