"""A virtual-clock rollout simulator that runs tailflow's own rollout pipeline.

`engine.SimEngine` speaks the native engine's protocol with request lengths
from a trace and time from a cost model; `group.SimGroup` drives several
replicas the way `RolloutGroup` drives Ray workers; `simulate` runs the
product's pipeline on them, synchronous or running ahead of training, with
the trainer's work on the same virtual clock. Cost models: `roofline` (GPU
presets), `cpu` (this machine's calibration) and `measured` (a GPU's), both
`table_cost`. `plan` searches tail-batching settings (`tailflow plan`); `agentic`
simulates multi-turn trajectories under each environment schedule
(`tailflow plan --env-trace`). Predictions
for published settings (the paper's cells, async on split pools, spot
workers) live in bench/research/. See docs/simulator.md.
"""
