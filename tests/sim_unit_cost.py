"""A cost model whose times a test can work out by hand: 1 s a decode step with any rows, `prefill_s_per_token`
a prefilled token (shared by the simulator's tests)."""
from __future__ import annotations

from tailflow.engines.sim.costs import CostModel


class UnitCost(CostModel):
    def __init__(self, prefill_s_per_token: float = 0.01):
        self.prefill_s_per_token = prefill_s_per_token

    def decode_s(self, num_rows, context_tokens, max_context):
        return 1.0 if num_rows else 0.0

    def prefill_s(self, num_tokens, num_seqs):
        return self.prefill_s_per_token * num_tokens
