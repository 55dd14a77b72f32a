"""The trainer's ranks as Ray actors (`engines/train/worker.py`): FSDP2 across them, or Megatron-core tensor-parallel
groups (`train.backend`; `train.tensor_parallel_size` ranks per group, the groups data-parallel replicas).

The driver shards a step's samples by tokens over the data-parallel replicas (every rank of a Megatron
tensor-parallel group gets its replica's samples), counts the global response
tokens and samples once (the loss denominators every rank divides by), and runs all ranks
at once: each call is a collective, so no rank may be skipped. A step can be
started without waiting (`start_train_step` -> `PendingTrainStep`, for
asynchronous training) or streamed (`accumulate` pieces while the round rolls
out, then `finish_step`; Ray runs an actor's calls in order, so every rank
sees the same sequence of collectives). For weight
sync, rank 0's full state dict stays in the object store (`state_dict_ref`,
used by `weight_sync.py`), so rollout workers read it without a copy through
the driver; everything else this group returns is plain data. Checkpoints are rank 0's full state plus, for
Megatron, every rank's own shard (`checkpoint()["shards"]`, one per rank).

The ranks rendezvous at rank 0's node (its IP, a port free there), asked
inside rank 0's actor once Ray has placed it, so a group spread over nodes
(`cluster.spread_trainer_ranks`) finds its rank 0. Colocated on GPUs the
group parks between phases (`park`).

The caller owns `ray.init`.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import ray
import torch

from tailflow.engines.cluster.calls import get_all
from tailflow.engines.train.batch import TrainSample, count_response_tokens, shard_across_ranks
from tailflow.engines.train.critic import CriticStepStats
from tailflow.engines.train.gae import samples_explained_variance
from tailflow.engines.train.rank_setup import free_port
from tailflow.engines.train.samples import samples_with_signal
from tailflow.engines.train.trainer import TrainStepStats
from tailflow.engines.train.updates import plan_updates
from tailflow.engines.train.worker import TrainerRole, TrainerWorker

START_ATTEMPTS = 3


def rendezvous_address(rank0) -> tuple[str, int]:
    """Rank 0's node IP and a port free on that node (rank 0 binds it a moment later), asked inside its actor."""
    return ray.get(rank0.__ray_call__.remote(_free_port_on_this_node))


def _free_port_on_this_node(_actor) -> tuple[str, int]:
    address = ray.util.get_node_ip_address()
    return address, free_port(address)


class PendingValueStep:
    """The critic's step, issued on every rank; `result` waits for them and gives rank 0's stats."""

    def __init__(self, refs: list[ray.ObjectRef], explained_variance: float) -> None:
        self.refs, self.explained_variance = refs, explained_variance

    def result(self) -> CriticStepStats:
        return replace(get_all(self.refs)[0], explained_variance=self.explained_variance)


class PendingTrainStep:
    """A train step whose calls are issued on every rank; `result` waits for them."""

    def __init__(self, refs: list[ray.ObjectRef], num_samples: int, num_skipped: int, started: float,
                 value_step: PendingValueStep | None = None) -> None:
        """`value_step`: the critic's step issued beside this one (train.advantage gae), waited for with it."""
        self.refs = refs
        self.num_samples, self.num_skipped, self.started = num_samples, num_skipped, started
        self.value_step = value_step
        self._stats: TrainStepStats | None = None

    def ready(self) -> bool:
        """Every rank (the critic's too) has finished (or failed: `result` then raises); never waits."""
        refs = self.refs + (self.value_step.refs if self.value_step is not None else [])
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(done) == len(refs)

    def result(self) -> TrainStepStats:
        """Wait for every rank (the first failure raises at once); rank 0's stats, with the critic's. `seconds`
        runs from the start to the first `result()`: call it once `ready()` to time the step itself."""
        if self._stats is None:
            stats = get_all(self.refs)[0]
            critic = self.value_step.result() if self.value_step is not None else None
            self._stats = replace(stats, num_samples=self.num_samples, skipped_samples=self.num_skipped,
                                  seconds=time.perf_counter() - self.started, critic=critic)
        return self._stats


class TrainerGroup:
    def __init__(
        self,
        model_path: str,
        world_size: int,
        trainer_kwargs: dict[str, Any] | None = None,
        num_cpus_per_worker: float = 1,
        num_gpus_per_worker: float = 0,
        num_threads: int = 1,
        actor_options: list[dict] | None = None,
        reservation: Any = None,
        role: TrainerRole = "policy",
    ) -> None:
        """Start `world_size` actors and wait until their process group is up. `actor_options[r]`, when given,
        places rank r (its placement-group bundle and share: `placement.actor_options`) instead of the
        per-worker asks; `reservation` (a `placement.GpuReservation`) is held until `shutdown`. `trainer_kwargs`:
        each rank's `PolicyTrainer` arguments; their `train` section gives the ranks per tensor-parallel group.
        `role` critic: the ranks hold train.advantage gae's value model (`values`, `start_value_step`, and the
        checkpoint methods; the policy's step methods are not for it).

        The rendezvous port is picked free on rank 0's node, then bound by rank 0 a moment later: another
        process can take it in between (seen in CI: EADDRINUSE, and the other ranks waited forever for rank 0).
        So a failed start kills every actor of the attempt and tries again on a new port.
        """
        self.world_size, self.role = world_size, role
        train = (trainer_kwargs or {}).get("train")
        self.tensor_parallel = train.tensor_parallel_size if train is not None else 1
        if self.tensor_parallel < 1 or world_size % self.tensor_parallel:
            raise ValueError(f"tensor_parallel {self.tensor_parallel} must divide the {world_size} trainer ranks")
        self.data_parallel_size = world_size // self.tensor_parallel
        self.reservation = None
        self._parked: tuple[ray.ObjectRef, ray.ObjectRef, list[ray.ObjectRef]] | None = None
        """While parked: refs to rank 0's full model and optimizer state and to every rank's own shard, taken
        just before it left the GPU."""
        options = list(actor_options) if actor_options is not None else [{}] * world_size
        if len(options) != world_size:
            raise ValueError(f"{len(options)} actor options for {world_size} trainer ranks")
        actor_class = ray.remote(num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker, max_restarts=0)(
            TrainerWorker
        )
        self._start_workers(actor_class, options, model_path, num_threads, dict(trainer_kwargs or {}))
        self.reservation = reservation.hold() if reservation is not None else None

    def _start_workers(self, actor_class, options: list[dict], model_path: str, num_threads: int,
                       trainer_kwargs: dict[str, Any]) -> None:
        """Start the ranks and join their process group, on a new rendezvous port after a failed start."""
        for attempt in range(START_ATTEMPTS):
            self.workers = [actor_class.options(**options[rank]).remote(model_path, rank, self.world_size,
                                                                        num_threads, trainer_kwargs, self.role)
                            for rank in range(self.world_size)]
            self._accumulating: list[ray.ObjectRef] = []
            try:
                self.master_addr, self.master_port = rendezvous_address(self.workers[0])
                get_all([worker.connect.remote(self.master_addr, self.master_port) for worker in self.workers])
                return
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                self.shutdown()
                if attempt == START_ATTEMPTS - 1:
                    raise

    def train_step(self, samples: list[TrainSample], skip_zero_advantage: bool = False, ppo_epochs: int = 1,
                   mini_batches: int = 1, seed: int = 0) -> TrainStepStats:
        """`start_train_step(...).result()`: one step on all ranks, waited for."""
        return self.start_train_step(samples, skip_zero_advantage, ppo_epochs, mini_batches, seed).result()

    def start_train_step(self, samples: list[TrainSample], skip_zero_advantage: bool = False, ppo_epochs: int = 1,
                         mini_batches: int = 1, seed: int = 0,
                         value_step: PendingValueStep | None = None) -> PendingTrainStep:
        """Issue one step's calls on all ranks and return at once (nothing is waited on); every rank returns the
        same stats, rank 0's are the result, with the step's wall time from here.

        `skip_zero_advantage`: samples whose advantage is 0 have no policy gradient (without a KL term), so
        they are left out of the forward and backward while the loss still divides by the whole batch's
        counts: the same gradient for less work. At least one sample is always trained, so a batch with no
        signal still takes a real (zero-gradient) optimizer step, as it would unskipped.

        `ppo_epochs` x `mini_batches`: that many optimizer updates (`train/updates.py` plans them, seeded by
        `seed`; one is `PolicyTrainer.train_step` on the rank's shard); the weight version counts one per step.
        """
        started = time.perf_counter()
        self._parked = None  # the weights are about to change: the parked copy would be stale
        num_tokens_total = count_response_tokens(samples)
        if num_tokens_total == 0:
            raise ValueError("train_step needs at least one response token")
        trained = samples_with_signal(samples, skip_zero_advantage) or samples[:1]
        trained_ids = {id(sample) for sample in trained}
        skipped = [sample for sample in samples if id(sample) not in trained_ids]
        replica_shards = shard_across_ranks(trained, self.data_parallel_size)
        plans = self._per_rank(plan_updates(replica_shards, skipped, ppo_epochs, mini_batches, seed))
        calls = [worker.train_updates.remote(shard, plan, num_tokens_total)
                 for worker, shard, plan in zip(self.workers, self._per_rank(replica_shards), plans)]
        return PendingTrainStep(calls, len(samples), len(samples) - len(trained), started, value_step)

    # ---- the critic's (role critic): values, then its step -------------------------------------------

    def values(self, samples: list[TrainSample]) -> list[tuple[float, ...]]:
        """Each sample's values at the positions predicting its response tokens, in `samples`' order (sharded by
        tokens over the ranks as a step is)."""
        shards = shard_across_ranks(samples, self.data_parallel_size)
        per_rank = get_all([worker.values.remote(shard)
                            for worker, shard in zip(self.workers, self._per_rank(shards))])
        found = {id(sample): values for shard, shard_values in zip(shards, per_rank[::self.tensor_parallel])
                 for sample, values in zip(shard, shard_values)}
        return [found[id(sample)] for sample in samples]

    def start_value_step(self, samples: list[TrainSample], ppo_epochs: int = 1, mini_batches: int = 1,
                         seed: int = 0) -> PendingValueStep:
        """The critic's updates on `samples` (values and returns set), planned as the policy's are (every sample
        trained: each has a value loss), issued on every rank without waiting."""
        shards = shard_across_ranks(samples, self.data_parallel_size)
        plans = self._per_rank(plan_updates(shards, [], ppo_epochs, mini_batches, seed))
        return PendingValueStep([worker.train_value_updates.remote(shard, plan)
                                 for worker, shard, plan in zip(self.workers, self._per_rank(shards), plans)],
                                samples_explained_variance(samples))

    # ---- a streamed step: pieces while the round rolls out, then one optimizer step ------------------

    def accumulate(self, samples: list[TrainSample]) -> None:
        """Send a piece of a streamed step (`PolicyTrainer.accumulate`) to every rank, sharded by tokens, and
        return at once; each call is a collective, so every rank gets one (an empty shard runs a filler)."""
        if not samples:
            return
        self._parked = None
        shards = self._per_rank(shard_across_ranks(samples, self.data_parallel_size))
        self._accumulating += [worker.accumulate.remote(shard) for worker, shard in zip(self.workers, shards)]

    def finish_step(self, num_tokens_total: int, num_sequences_total: int, num_metric_tokens: int) -> TrainStepStats:
        """Close the streamed step on every rank (after the pieces already queued on it) and wait: the gradients
        are divided by the whole batch's loss denominator, then one optimizer step. Rank 0's stats."""
        calls = [worker.finish_step.remote(num_tokens_total, num_sequences_total, num_metric_tokens)
                 for worker in self.workers]
        pieces, self._accumulating = self._accumulating, []
        return get_all(pieces + calls)[-len(calls)]

    def state_dict_ref(self) -> ray.ObjectRef:
        """All ranks gather; the ref to rank 0's full CPU state dict (HF names), left in the object store for
        the rollout workers to read (`weight_sync.py`). Parked: the copy taken when it parked."""
        if self._parked is not None:
            return self._parked[0]
        refs = [worker.full_state_dict.remote() for worker in self.workers]
        get_all(refs[1:])  # the other ranks return {}; this waits for the collective and raises its errors
        ray.wait(refs[:1], fetch_local=False)
        return refs[0]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full policy weights (HF names), gathered on rank 0 and fetched here."""
        return ray.get(self.state_dict_ref())

    def checkpoint(self) -> dict:
        """Rank 0's {"model": ..., "optimizer": ...} full state and, where ranks keep their own (Megatron),
        "shards": every rank's, in rank order; for exact resume (parked: the parked copy, so a commit does not
        bring the state back to the GPU the engines are using)."""
        if self._parked is not None:
            model, optimizer = ray.get(list(self._parked[:2]))
            shards = ray.get(self._parked[2])
        else:
            states = get_all([worker.state_for_checkpoint.remote() for worker in self.workers])
            model, optimizer, shards = states[0].model, states[0].optimizer, [state.shard for state in states]
        checkpoint = {"model": model, "optimizer": optimizer}
        if any(shard is not None for shard in shards):
            checkpoint["shards"] = shards
        return checkpoint

    def load_checkpoint(self, state: dict) -> None:
        """Every rank reads the same full state (one object-store copy) and its own shard, if it has one."""
        self._parked = None
        shards = state.get("shards") or [None] * self.world_size
        if len(shards) != self.world_size:
            raise ValueError(f"the checkpoint holds {len(shards)} rank shards; this trainer has {self.world_size} "
                             "ranks (train.num_workers)")
        ref = ray.put({"model": state["model"], "optimizer": state["optimizer"]})
        get_all([worker.load_checkpoint.remote(ref, shard) for worker, shard in zip(self.workers, shards)])

    # ---- taking turns with the rollout on shared GPUs ------------------------------------------------

    def park(self) -> ray.ObjectRef:
        """Every rank hands its full state to rank 0's copy in the object store, then moves its weights and
        optimizer to host memory (`PolicyTrainer.offload`); the ref to the parked weights (what weight sync
        loads). The next train call or `load_checkpoint` brings the state back to the device."""
        if self._parked is None:
            calls = [worker.park.options(num_returns=3).remote() for worker in self.workers]
            get_all([ref for parts in calls[1:] for ref in parts[:2]])  # the collective; raises its errors
            every_ref = [ref for parts in calls for ref in parts]
            ray.wait(every_ref, num_returns=len(every_ref), fetch_local=False)
            self._parked = (calls[0][0], calls[0][1], [parts[2] for parts in calls])
        return self._parked[0]

    def offload(self) -> None:
        """Every rank's weights and optimizer to host memory, without a parked copy (at start-up, before the
        first rollout); the next call that needs them brings them back."""
        get_all([worker.offload.remote() for worker in self.workers])

    def is_offloaded(self) -> list[bool]:
        """Per rank, whether its state is in host memory now."""
        return ray.get([worker.is_offloaded.remote() for worker in self.workers])

    def worker_pid(self, rank: int = 0) -> int:
        """The OS process of `rank` (fault-injection tests kill it)."""
        return ray.get(self.workers[rank].pid.remote())

    def _per_rank(self, per_replica: list) -> list:
        """Each rank's item of a per-data-parallel-replica list: rank r is replica r // tensor_parallel."""
        return [per_replica[rank // self.tensor_parallel] for rank in range(self.world_size)]

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
        self._parked = None
        if self.reservation is not None:
            self.reservation.drop()
            self.reservation = None
