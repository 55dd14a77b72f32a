"""Each physical term of the simulator against a hand computation (constants: comm.py, efficiency.py, presets.py).

H800: NVLink 200 GB/s and InfiniBand 50 GB/s per GPU a direction, PCIe 64 GB/s, 8 GPUs a node. NCCL ring
(tuning.cc): LL 6.6 us + 0.47 us an NVLink step / 2.7 us a network step (x 1.8 on NVLink across nodes), a
quarter of the bandwidth; Simple 8.4 us + 3.4 / 9.6 us a step, all of it.
"""
from __future__ import annotations

from statistics import mean

import pytest

import sim_unit_cost

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim.comm import collective_s
from tailflow.engines.sim.engine import SimEngine
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import ResponseLength
from tailflow.engines.sim.presets import hardware_preset, model_preset
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.stragglers import expected_slowest, replica_slowdowns
from tailflow.engines.sim.streamed import drain
from tailflow.engines.sim.trainer_cost import TrainerCost, weight_sync_s
from tailflow.engines.sim.efficiency import Efficiency

H800 = hardware_preset("h800")


def test_a_small_all_reduce_pays_latency_a_large_one_bandwidth():
    # 10 kB over 2 GPUs on NVLink: LL 6.6 + 2 x 0.47 us + 10e3 B / (200 GB/s / 4 x 2/2) = 7.74 us (Simple 15.25 us)
    assert collective_s("all_reduce", 10e3, 2, H800.fabric) == pytest.approx(7.74e-6, rel=1e-9)
    # 1 MB: Simple, 8.4 + 2 x 3.4 us + 1e6 B / 200 GB/s = 20.2 us (LL 27.54 us)
    assert collective_s("all_reduce", 1e6, 2, H800.fabric) == pytest.approx(20.2e-6, rel=1e-9)
    # 8 GPUs, 10 kB: LL, 6.6 + 14 x 0.47 us + 10e3 B x 14/8 / 50 GB/s = 13.18 + 0.35 us: latency grows with TP
    assert collective_s("all_reduce", 10e3, 8, H800.fabric) == pytest.approx(13.18e-6 + 0.35e-6, rel=1e-9)


def test_across_nodes_the_network_sets_latency_and_bandwidth():
    # 16 GPUs on 2 nodes, 10 kB: 30 ring steps, 2 of them over the network. LL: 6.6 + 28 x 0.47 x 1.8 + 2 x 2.7 us
    # = 35.688 us + 10e3 B x 30/16 / (50 GB/s / 4) = 1.5 us
    assert collective_s("all_reduce", 10e3, 16, H800.fabric) == pytest.approx(35.688e-6 + 1.5e-6, rel=1e-9)
    # an all-gather has half the steps: 15, 1 across. Simple for 1.6 GB: 8.4 + 14 x 3.4 + 9.6 us + 1.6e9 x 15/16 / 50e9
    assert collective_s("all_gather", 1.6e9, 16, H800.fabric) == pytest.approx(65.6e-6 + 0.03, rel=1e-9)
    assert collective_s("all_reduce", 1e9, 1, H800.fabric) == 0.0


def test_the_best_tp_depends_on_the_batch():
    """8 GPUs as 8 replicas of TP 1 or one of TP 8. A round's tail (8 long requests left): TP 8 splits the weight
    reads and pays little all-reduce; its bulk (2,048 requests): TP 1's replicas compute side by side while TP 8
    pays the all-reduces of 2,048 rows and reads its KV heads twice (7B has 4). The step, as the round sees it:"""
    def step(tp: int, total_rows: int, context: int) -> float:
        cost = RooflineCost.from_presets("h800", "qwen2.5-7b", 8, tp)
        rows = total_rows // cost.cluster.num_replicas
        return cost.decode_s(rows, rows * context, context)
    assert step(8, 8, 16000) < step(1, 8, 16000)
    assert step(1, 2048, 2000) < step(8, 2048, 2000)
    assert RooflineCost.from_presets("h800", "qwen2.5-7b", 8, 8).allreduce_s(4) > \
        RooflineCost.from_presets("h800", "qwen2.5-7b", 8, 2).allreduce_s(4)


def test_kv_heads_are_replicated_past_their_count():
    # Qwen2.5-7B has 4 KV heads: at TP 8 every GPU holds one, so a token takes twice its 57,344 B
    tp8 = RooflineCost.from_presets("h800", "qwen2.5-7b", 8, 8)
    assert tp8.kv_bytes_per_token == 2 * 57_344
    assert tp8.kv_budget_tokens == int((80e9 * 8 * 0.85 - 2 * 7.61e9) // (2 * 57_344)) == 4_610_595
    tp4 = RooflineCost.from_presets("h800", "qwen2.5-7b", 8, 4)
    assert tp4.kv_bytes_per_token == 57_344


def test_weight_sync_gathers_fans_out_to_every_rollout_node_and_loads_over_pcie():
    model = model_preset("qwen2.5-32b")  # 65 GB of bf16 weights
    # colocated on 64 GPUs (8 nodes), TP 2: gather over 64 GPUs (Simple: 8.4 + 56 x 3.4 + 7 x 9.6 us + 65e9 x 63/64
    # / 50e9), then 7 other nodes pull 65 GB each through the source's 50 GB/s, then 65e9 / 2 over 64 GB/s PCIe
    gather = 266e-6 + 65e9 * 63 / 64 / 50e9
    expected = gather + 7 * 65e9 / 50e9 + 65e9 / 2 / 64e9
    assert weight_sync_s(model, H800, 64, 64, 2, colocated=True) == pytest.approx(expected, rel=1e-9)
    assert weight_sync_s(model, H800, 64, 64, 2, colocated=True) == pytest.approx(10.8877, rel=1e-4)
    # it grows with the rollout nodes: 16 nodes pull 8 more copies (the gather grows a little too)
    bigger = weight_sync_s(model, H800, 128, 128, 2, colocated=True)
    assert bigger - weight_sync_s(model, H800, 64, 64, 2, colocated=True) == pytest.approx(
        8 * 65e9 / 50e9 + (8.4e-6 + 112 * 3.4e-6 + 15 * 9.6e-6 + 65e9 * 127 / 128 / 50e9) - gather, rel=1e-9)
    # disaggregated pools: every rollout node pulls
    assert weight_sync_s(model, H800, 8, 8, 2, colocated=False) == pytest.approx(
        8.4e-6 + 7 * 3.4e-6 + 65e9 * 7 / 8 / 200e9 + 65e9 / 50e9 + 65e9 / 2 / 64e9, rel=1e-9)


def test_data_parallel_communication_weighs_more_as_the_trainer_grows():
    """Twice the GPUs halve the compute of the same tokens, not FSDP's bytes per GPU."""
    model, efficiency = model_preset("qwen2.5-7b"), Efficiency()
    trainer = lambda gpus: TrainerCost(H800, model, efficiency, gpus, gpus, 1, colocated=True)
    comm_share = lambda gpus: trainer(gpus).train_s(0) / trainer(gpus).train_s(1_000_000)  # train_s(0): comm only
    assert trainer(32).train_s(0) == pytest.approx(5 * collective_s("all_gather", 2 * 7.61e9, 32, H800.fabric))
    assert comm_share(64) > 1.5 * comm_share(32)  # the same tokens on twice the GPUs: half the compute, not bytes
    overlapped = TrainerCost(H800, model, Efficiency(dp_comm_overlap=1.0), 32, 32, 1, colocated=True)
    assert overlapped.train_s(0) == 0.0


def test_stragglers_the_slowest_of_n_draws():
    assert expected_slowest(1, 0.08) == pytest.approx(1.04)  # mean of a uniform on [1, 1.08]
    assert expected_slowest(63, 0.08) == pytest.approx(1.07875)
    draws = replica_slowdowns(2000, 1, 0.08)
    assert all(1.0 <= d <= 1.08 for d in draws) and mean(draws) == pytest.approx(1.04, abs=0.003)
    assert mean(replica_slowdowns(2000, 8, 0.08)) == pytest.approx(expected_slowest(8, 0.08), abs=0.003)
    assert replica_slowdowns(5, 2, 0.08, seed=1) == replica_slowdowns(5, 2, 0.08, seed=1)
    assert RooflineCost.from_presets("h800", "qwen2.5-7b", 4, 1).replica_slowdowns(4) == replica_slowdowns(4, 1, 0.08)


class UnitCost(sim_unit_cost.UnitCost):
    """Two replicas, the second one and a half times slower; no prefill."""

    def __init__(self):
        super().__init__(prefill_s_per_token=0.0)

    def replica_slowdowns(self, num_replicas, seed=0):
        return [1.0, 1.5][:num_replicas]


class Lengths:
    def length_of(self, request):
        return ResponseLength(10, FinishReason.EOS)


def test_a_round_ends_when_its_slowest_replica_does():
    group = SimGroup.of(UnitCost(), Lengths(), 2, num_slots=4)
    assert [e.slowdown for e in group.engines] == [1.0, 1.5]
    requests = [Request.for_problem(p, 0, (1, 2), SamplingParams(max_new_tokens=50)) for p in ("a", "b")]
    group.generate(requests)  # one request each: 10 decode steps of 1 s, the second replica 1.5x slower
    assert [e.clock_s for e in group.engines] == [10.0, 15.0] and group.clock_s == 15.0


def test_preemption_recomputes_what_the_kv_budget_lost():
    """Running requests outgrow the budget: the newest is preempted and its prompt and tokens prefilled again."""
    class Prefill(UnitCost):
        def prefill_s(self, num_tokens, num_seqs):
            return 0.001 * num_tokens
    engine = SimEngine(Prefill(), Lengths(), num_slots=4, kv_budget_tokens=26)
    requests = [Request.for_problem(p, 0, tuple(range(5)), SamplingParams(max_new_tokens=10)) for p in ("a", "b")]
    engine.generate(requests)
    # both admitted (5 + 5 cached), each gains a token a step: after 8 steps 26 are cached and the 9th step does
    # not fit: b (13 cached) leaves; a finishes 2 steps later; b comes back, prefilling 12 of its 13 positions
    assert engine.num_preemptions == 1
    assert engine.clock_s == pytest.approx(0.001 * (4 + 4) + 10 + 0.001 * 12 + 2)


def test_drain_queues_work_on_its_servers():
    # two servers, jobs arriving at 0, 0, 1 taking 3, 1, 1 s: the third waits for the second server (free at 1)
    assert drain([0, 0, 1], [3, 1, 1], 2) == [3, 1, 2]
    # one server free only from 5: everything queues behind it
    assert drain([0, 1], [2, 2], 1, free_at=5) == [7, 9]


def test_streamed_scoring_and_the_stream_trainer_run_during_rollout():
    """The product's streamed scorer and stream trainer, on the simulated clock: the same rounds, less of the
    scoring and the train step left once the round is taken; never below the rollout itself."""
    from tailflow.engines.sim.paper_lengths import PaperLikeLengths
    from tailflow.engines.sim.simulate import PolicySimulation, StreamingSettings
    from tailflow.engines.sim.step_time import LinearStepCost
    from tailflow.engines.tail.state import TailSettings

    cost = RooflineCost.from_presets("h800", "qwen2.5-7b", 4, 1)
    lengths = PaperLikeLengths(400, 2048, seed=1)
    trainer = LinearStepCost(train_s_per_token=2e-4, reward_s_per_response=0.05)

    def run(streaming: StreamingSettings):
        group = SimGroup.of(cost, lengths, 4, 64, cost.kv_budget_tokens)
        return PolicySimulation(TailSettings(8, 4, 1.25, 5), lengths, group, trainer=trainer,
                                streaming=streaming).run(4, 4)

    batch, scored, streamed = (run(StreamingSettings()), run(StreamingSettings(reward=True)),
                               run(StreamingSettings(reward=True, train=True)))
    assert [r.kind for r in batch.rounds] == [r.kind for r in scored.rounds] == [r.kind for r in streamed.rounds]
    assert all(s.reward_s == pytest.approx(trainer.reward_s(r.num_kept, 0)) for s, r in zip(batch.steps, batch.rounds))
    assert sum(s.reward_s for s in scored.steps) < 0.5 * sum(s.reward_s for s in batch.steps)
    assert sum(s.train_s for s in streamed.steps) < sum(s.train_s for s in scored.steps)
    assert streamed.step_s < scored.step_s < batch.step_s
    with pytest.raises(ValueError, match="train.stream needs reward.streaming"):
        StreamingSettings(train=True)


def test_a_tp_decode_step_reads_its_share_and_the_replicated_kv_then_all_reduces_every_layer():
    """Qwen2.5-7B at TP 8 on one H800 node, 4 rows, 4,000 tokens of context: every GPU reads 1/8 of the weights
    and of the KV, which is twice the model's (4 KV heads over 8 GPUs: each holds one whole head), then 2 x 28
    all-reduces of 4 x 3584 bf16 values (28,672 B) over 8 GPUs: NCCL LL, 6.6 + 14 x 0.47 us + 28,672 B /
    (200 GB/s / 4 x 8/14) = 14.1835 us (Simple: 56.25 us)."""
    cost = RooflineCost.from_presets("h800", "qwen2.5-7b", 8, 8)
    memory = (2 * 7.61e9 + 4000 * 2 * 57_344) / (8 * 3.35e12 * 0.75)
    compute = (2 * 7.61e9 * 4 + 4 * 28 * 28 * 128 * 4000) / (8 * 989e12 * 0.6)
    all_reduce = 6.6e-6 + 14 * 0.47e-6 + 28_672 / (200e9 / 4 * 8 / 14)
    assert compute < memory
    assert cost.allreduce_s(4) == pytest.approx(56 * all_reduce, rel=1e-9) == pytest.approx(794.28e-6, rel=1e-5)
    assert cost.decode_s(4, 4000, 1000) == pytest.approx(memory + 0.002 + 56 * all_reduce, rel=1e-9)
    # a replica runs at its slowest GPU's pace: the engine multiplies every step by its slowdown
    engine = SimEngine(cost, Lengths(), num_slots=4, kv_budget_tokens=10_000, slowdown=1.05)
    engine.generate([Request.for_problem("a", 0, (1, 2), SamplingParams(max_new_tokens=50))])
    plain = SimEngine(cost, Lengths(), num_slots=4, kv_budget_tokens=10_000)
    plain.generate([Request.for_problem("a", 0, (1, 2), SamplingParams(max_new_tokens=50))])
    assert engine.clock_s == pytest.approx(1.05 * plain.clock_s, rel=1e-12) and plain.clock_s > 0


def test_streamed_scores_and_the_stream_trainer_counted_by_hand():
    """Two prompts of two responses on a clock set by hand; scoring 1 s a response on 2 reward workers, training
    4 s a group on one trainer free from 0."""
    from tailflow.engines.rollout.protocol import Completion
    from tailflow.engines.sim.streamed import StreamedRound

    now = [0.0]
    observed = StreamedRound(lambda: now[0])
    done = {name: Completion(name, (1,), (2, 3), (0.0, 0.0), FinishReason.EOS, 0, problem_id=name[0])
            for name in ("a0", "a1", "b0", "b1")}
    for t, finished, completed in ((1.0, ("a0", "a1"), ()), (2.0, ("b0",), ("a",)), (3.0, ("b1",), ("b",))):
        now[0] = t
        observed.on_finished([done[n] for n in finished])
        observed.on_completed([(p, (done[p + "0"], done[p + "1"])) for p in completed])
    # a response takes 1 s x 2 workers of one worker's time (what scoring the round after rollout takes, spread):
    # a0, a1 arrive at 1 and take both workers to 3; b0 (at 2) and b1 (at 3) wait for them, both end at 5
    scored = observed.scored_at(lambda c: 1.0, 2)
    assert scored == {"a0": 3.0, "a1": 3.0, "b0": 5.0, "b1": 5.0}
    # a is complete at 2 and scored at 3: trained 3 -> 7; b complete at 3, scored at 5, waits for the trainer: 7 -> 11
    assert observed.trained_at(scored, lambda kept: 4.0 * len(kept) / 2, free_at=0.0) == 11.0
    assert observed.trained_at(scored, lambda kept: 4.0, free_at=9.0) == 17.0  # a trainer busy until 9
