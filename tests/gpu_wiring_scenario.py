"""A `cluster.device: gpu` run's actors on Ray's logical GPUs, in a Ray of its own (run by test_gpu_wiring.py in a
subprocess: the test session's Ray has no GPUs, and Ray's resources are fixed when it starts).

This machine has no GPU, so Ray is started with two *logical* GPUs and `TAILFLOW_CUDA_STAND_IN=cpu` keeps the
tensors on the CPU (the stand-in, named as such: placement.CUDA_STAND_IN). Everything else is the real path:
`driver/workers.start_workers` reserves the placement groups, seats two trainer ranks, two critic ranks
(train.advantage gae) and two rollout workers colocated, the trainer ranks rendezvous at rank 0's node, the phases take turns (engines asleep for the step,
the trainer parked for the rollout), a worker that leaves gives its seat to the next one, and shutting the groups
down frees the GPUs. Prints one JSON line of what it saw.
"""
from __future__ import annotations

import json
import random
import sys


def main(model_dir: str) -> None:
    import os

    import ray

    from tailflow.engines.cluster.placement import CUDA_STAND_IN

    os.environ[CUDA_STAND_IN] = "cpu"  # read by the driver, which hands each actor its device (driver/workers.py)
    ray.init(num_cpus=6, num_gpus=2, include_dashboard=False, configure_logging=False,
             runtime_env={"env_vars": {"TQDM_DISABLE": "1"}})
    try:
        print(json.dumps(take_turns_on_logical_gpus(model_dir)))
    finally:
        ray.shutdown()


def engine_state(actor) -> tuple[bool, int]:
    return actor.__ray_call__.remote(lambda worker: (worker.engine.is_asleep, worker.engine.weight_version))


def engine_weights(actor):
    return actor.__ray_call__.remote(
        lambda worker: {name: tensor.clone() for name, tensor in worker.engine.runner.model.state_dict().items()})


def take_turns_on_logical_gpus(model_dir: str) -> dict:
    import ray
    import torch

    from tailflow.config import load_config
    from tailflow.engines.cluster.placement import gpu_seat, takes_turns
    from tailflow.engines.cluster.weight_sync import push_weights
    from tailflow.engines.rollout.protocol import Request, SamplingParams
    from tailflow.engines.train.batch import TrainSample
    from tailflow.driver.workers import reserve_gpus, start_workers

    config = load_config(None, ["cluster.device=gpu", "rollout.num_workers=2", "train.num_workers=2",
                                f"model.path={model_dir}", "train.lr=1e-3", "train.advantage=gae"])
    result: dict = {"takes_turns": takes_turns(config), "gpus_before": ray.available_resources().get("GPU", 0.0)}
    rollout, trainer, critic, pool = start_workers(config, model_dir, max_seq_len=64)
    try:
        seats = ray.get([gpu_seat(actor) for actor in [*trainer.workers, *rollout.membership.workers,
                                                       *critic.workers]])
        result["trainer_gpus"] = [list(gpus) for _, gpus in seats[:2]]
        result["rollout_gpus"] = [list(gpus) for _, gpus in seats[2:4]]
        result["critic_gpus"] = [list(gpus) for _, gpus in seats[4:]]
        result["rank0_node_ip"] = ray.get(trainer.workers[0].__ray_call__.remote(
            lambda _: ray.util.get_node_ip_address()))
        result["master_addr"] = trainer.master_addr
        result["gpus_reserved"] = ray.available_resources().get("GPU", 0.0)
        result["devices"] = ray.get(trainer.workers[0].__ray_call__.remote(
            lambda worker: str(worker.trainer.device)))

        rng = random.Random(0)
        samples = [TrainSample(tuple(rng.randrange(3, 22) for _ in range(5)),
                               tuple(rng.randrange(3, 22) for _ in range(rng.randint(2, 9))), rng.choice([-1.0, 1.0]))
                   for _ in range(8)]
        result["offloaded_at_start"] = (trainer.offload(), trainer.is_offloaded())[1]
        result["critic_offloaded_at_start"] = (critic.offload(), critic.is_offloaded())[1]
        rollout.sleep()
        result["engines_during_step"] = ray.get([engine_state(actor) for actor in rollout.membership.workers])
        trainer.train_step(samples)
        result["critic_values_after_offload"] = len(critic.values(samples))
        result["trainer_offloaded_after_step"] = trainer.is_offloaded()
        result["critic_offloaded_after_step"] = critic.is_offloaded()
        push_weights(trainer, rollout, 1, take_turns=True, critic=critic)
        result["trainer_offloaded_after_sync"] = trainer.is_offloaded()
        result["critic_offloaded_after_sync"] = critic.is_offloaded()
        result["engines_after_sync"] = ray.get([engine_state(actor) for actor in rollout.membership.workers])
        parked = trainer.checkpoint()  # served from the parked copy: the trainer stays off the GPU
        result["trainer_offloaded_after_checkpoint"] = trainer.is_offloaded()
        served = ray.get(engine_weights(rollout.membership.workers[1]))
        result["engine_weights_equal_parked"] = all(torch.equal(served[name].float(), parked["model"][name].float())
                                                    for name in parked["model"])
        result["optimizer_parked"] = parked["optimizer"] is not None
        done = rollout.generate([Request(f"r{i}", (3, 4, 5), SamplingParams(max_new_tokens=4, seed=i))
                                 for i in range(4)])
        result["versions"] = sorted({completion.weight_version for completion in done})

        rollout.remove_worker(1)  # its seat (the GPU of trainer rank 1) goes to the next worker
        (added,) = rollout.add_workers(1, wait=True)
        result["added_worker"] = added
        result["added_gpu"] = list(ray.get(gpu_seat(rollout.membership.workers[-1]))[1])
    finally:
        rollout.shutdown()
        trainer.shutdown()
        critic.shutdown()
        pool.shutdown()
    result["groups_after"] = sorted({entry["state"] for entry in ray.util.placement_group_table().values()})

    evaluation = reserve_gpus(config, with_trainer=False)  # `tailflow evaluate`: the rollout workers' bundles only
    result["evaluate_seats"] = [len(evaluation.layout.trainer), len(evaluation.layout.rollout)]
    result["evaluate_gpus_reserved"] = ray.available_resources().get("GPU", 0.0)
    evaluation.drop()
    return result


if __name__ == "__main__":
    main(sys.argv[1])
