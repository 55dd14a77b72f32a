"""Environments for multi-turn (agentic) rollouts: what a user implements (`environment.py`), the record of one
trajectory and the rule for how each way of ending is trained (`trajectory.py`); each environment in a process of
its own (`host.py`, started by `launcher.py`), many of them behind one worker (`worker.py`, a Ray actor through
engines/cluster/env_group.py); built-in environments (`builtin/`)."""
