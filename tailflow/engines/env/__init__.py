"""Environments for multi-turn (agentic) rollouts: what a user implements (`environment.py`), the record of one
trajectory and the rule for how each way of ending is trained (`trajectory.py`)."""
