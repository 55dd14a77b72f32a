"""The work of a run, importable without Prefect (and, outside `cluster/`, without Ray): rollout, rewards,
training, data, stores, commits, tracking, tail batching, the simulator, and the run's state and outcome records."""
