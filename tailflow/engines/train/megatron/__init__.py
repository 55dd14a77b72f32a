"""The Megatron-core trainer backend (`train.backend: megatron`): tensor-parallel GPTModel ranks.

`shape.py` reads a Hugging Face config into the numbers Megatron needs,
`convert.py` moves weights between Hugging Face and Megatron layouts (pure
torch, no megatron import), `cpu_stand_in.py` stands in for the CUDA
megatron-core assumes when the trainer computes on a CPU, `gpt.py` builds and
runs the GPTModel, `policy_model.py` is the trainer's model wrapper. Nothing
here imports megatron-core at package import: the FSDP2 backend never needs it.
"""
