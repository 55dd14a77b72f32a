"""GRPO-family training: advantages, losses, batching and the policy trainer (FSDP2 or Megatron-core).

(The supervised warm start lives in `sft.py`.) Import each module directly; this package re-exports nothing.
"""
