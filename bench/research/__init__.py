"""Predictions for published settings that the product never runs: the RollPacker paper's cells, asynchronous
training on split pools, spot workers' tokens per dollar, and replays of traced rounds on other cost models.

They drive the product's simulator (tailflow/engines/sim: the real rollout pipeline on simulated replicas);
benches and tests import them with bench/ on sys.path (`from research.paper import PAPER`).
"""
