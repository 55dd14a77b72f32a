"""How a plan prices a step besides rollout (scoring, training, the weight sync): chosen by a flag
(`tailflow plan --pricing`) and printed with the result, because every speedup depends on it.

* `shares`: reward and train time fixed on the simulated synchronous step by
  a stage split (RollPacker's Table 1 for veRL: 72% rollout, 5% reward, 23%
  train), then charged to every round by what it trains and scores; no weight
  sync (inside the train share). What the benches use.
* `roofline`: first principles on the same GPUs (`trainer_cost.py`: FSDP
  compute and collectives, the weight sync tailflow does); no reward (rule
  and sandbox rewards run on CPUs).
* `measured`: a `measured` calibration file's `train_s_per_token` and
  `weight_sync_s` (the roofline's sync where the file has none); no reward.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.sim.costs import CostModelError, NonRolloutCost
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import SimRound
from tailflow.engines.sim.step_time import PAPER_TABLE1, LinearStepCost, StageShares, shares_from_baseline
from tailflow.engines.sim.table_cost import StepCostTable

PRICINGS = ("shares", "roofline", "measured")


def step_pricing(name: str, roofline: RooflineCost, sync: Sequence[SimRound], table: StepCostTable | None,
                 shares: StageShares = PAPER_TABLE1) -> tuple[NonRolloutCost, str]:
    """The pricing and one line saying what it is."""
    if name == "shares":
        return shares_from_baseline(sync, shares), (
            f"shares: reward and train fixed on the simulated synchronous step by the split {shares.rollout:.0%} "
            f"rollout / {shares.reward:.0%} reward / {shares.train:.0%} train (RollPacker Table 1), no weight sync")
    if name == "roofline":
        return roofline.trainer, ("roofline: FSDP train step (compute at MFU, collectives, stragglers) and tailflow's "
                                  "weight sync on the same GPUs, no reward")
    if name == "measured":
        if table is None or not table.train_s_per_token:
            raise CostModelError("--pricing measured needs --measured FILE with train_s_per_token")
        sync_s = table.weight_sync_s if table.weight_sync_s is not None else roofline.weight_sync_s()
        return LinearStepCost(table.train_s_per_token, 0.0, sync_s), (
            f"measured: {table.train_s_per_token:.3g} s a trained token, weight sync {sync_s:.1f} s, no reward")
    raise CostModelError(f"--pricing: unknown {name!r}; known: {', '.join(PRICINGS)}")
