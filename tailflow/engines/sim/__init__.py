"""A virtual-clock rollout simulator that runs tailflow's own tail-batching code.

`engine.SimEngine` speaks the native engine's protocol with request lengths
from a trace and time from a cost model; `group.SimGroup` drives several
replicas the way `RolloutGroup` drives Ray workers; `simulate` runs the real
policy (`engines/tail`) on them. Cost models: `roofline` (GPU presets),
`cpu_cost` (fitted to this machine), `measured` (a GPU calibration file).
`async_pipeline` pipelines the rounds over separate rollout and trainer pools
(asynchronous training, `async_predict.predict_async`); `spot` prices a
schedule of rollout workers on demand and on spot. See docs/simulator.md.
"""
