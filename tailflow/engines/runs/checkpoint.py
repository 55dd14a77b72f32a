"""A training checkpoint directory: a Hugging Face model directory plus the optimizer.

`from_pretrained` loads the directory as it is (weights, config, tokenizer);
`optimizer.pt` next to it is what an exact resume needs beyond the weights
(Adam's moments and step count). The weights file is written from the full
state dict that trainer rank 0 gathers, so its bytes, and the sha256 that
`tailflow runs show` prints, depend only on the weights.

Megatron (`train.backend: megatron`) keeps no full optimizer state: every rank
writes its own shard, its Megatron parameters and its AdamW state, to
`megatron/rank_<r>.pt`, and resumes from it (the HF weights beside them are
the same values, gathered: rollout engines and `tailflow export` read those).

With a critic (train.advantage gae) the directory holds `critic/`, the value model's own checkpoint in the same
form (its config a `...ForTokenClassification` with one label); `weights_sha256` stays the policy's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tailflow.engines.store.local import sha256_of_file

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SHARDS_DIR = "megatron"
CRITIC_DIR = "critic"
"""train.advantage gae: the critic's own checkpoint (a model directory and optimizer.pt) inside the policy's."""
TIED_HEAD = "lm_head.weight"


def write_checkpoint(directory: str | Path, checkpoint: dict[str, Any], model_config: Any, tokenizer: Any) -> None:
    """`checkpoint` is `TrainerGroup.checkpoint()`'s {"model", "optimizer"}; written into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = dict(checkpoint["model"])
    if getattr(model_config, "tie_word_embeddings", False):
        weights.pop(TIED_HEAD, None)  # the same tensor as the embedding; HF drops it the same way
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, directory / WEIGHTS_FILE,
              metadata={"format": "pt"})
    model_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if checkpoint.get("optimizer") is not None:
        torch.save(checkpoint["optimizer"], directory / OPTIMIZER_FILE)
    for rank, shard in enumerate(checkpoint.get("shards") or ()):
        (directory / SHARDS_DIR).mkdir(exist_ok=True)
        torch.save(shard, directory / SHARDS_DIR / shard_file_name(rank))


def shard_file_name(rank: int) -> str:
    return f"rank_{rank:05d}.pt"


def read_checkpoint(directory: str | Path, model_config: Any) -> dict[str, Any]:
    """The {"model", "optimizer"} dict `TrainerGroup.load_checkpoint` takes (optimizer None if absent), with
    "shards" where the checkpoint holds per-rank ones."""
    directory = Path(directory)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no {WEIGHTS_FILE}")
    weights = load_file(weights_path)
    if getattr(model_config, "tie_word_embeddings", False) and TIED_HEAD not in weights:
        embedding = next(name for name in weights if name.endswith("embed_tokens.weight"))
        weights[TIED_HEAD] = weights[embedding]
    optimizer_path = directory / OPTIMIZER_FILE
    optimizer = torch.load(optimizer_path, weights_only=True) if optimizer_path.is_file() else None
    checkpoint = {"model": weights, "optimizer": optimizer}
    if (directory / SHARDS_DIR).is_dir():
        checkpoint["shards"] = read_shards(directory / SHARDS_DIR)
    return checkpoint


def read_shards(shards_dir: Path) -> list[dict[str, Any]]:
    """Every rank's shard, in rank order; a missing rank is an error naming the folder."""
    files = sorted(shards_dir.glob("rank_*.pt"))
    expected = [shard_file_name(rank) for rank in range(len(files))]
    if [path.name for path in files] != expected:
        raise FileNotFoundError(f"{shards_dir} holds {[path.name for path in files]}, not the ranks {expected}")
    return [torch.load(path, weights_only=True) for path in files]


def weights_sha256(directory: str | Path) -> str:
    return sha256_of_file(Path(directory) / WEIGHTS_FILE)
