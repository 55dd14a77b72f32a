"""Build or load the policy model; only architectures the native engine runs."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoConfig, Qwen2Config

if TYPE_CHECKING:  # transformers' model code (~2.5 CPU-s to import) loads where a model is built, not in the driver
    from transformers import PreTrainedModel, Qwen2ForCausalLM

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


class UnsupportedModelError(ValueError):
    pass


def tiny_qwen2_config(vocab_size: int, eos_token_id: int, pad_token_id: int) -> Qwen2Config:
    """The embedded default: a 1.6M-parameter Qwen2 for the arithmetic task."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
    )


def build_tiny_model(vocab_size: int, eos_token_id: int, pad_token_id: int, seed: int) -> Qwen2ForCausalLM:
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(tiny_qwen2_config(vocab_size, eos_token_id, pad_token_id))


def write_random_tiny_model(path: str | Path, characters: str | None = None, seed: int = 0) -> Path:
    """A freshly initialised tiny Qwen2 with a character tokenizer over `characters` (None: the embedded task's
    alphabet), saved as a HF directory: the tests' and benchmarks' untrained policies."""
    from tailflow.engines.data.tokenizer import CHARACTERS, build_char_tokenizer

    tokenizer = build_char_tokenizer(characters or CHARACTERS)
    model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed=seed)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def check_model_dir(path: str | Path) -> None:
    """Refuse, with a message naming the file, anything the engines cannot run."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model.path: {path} is not a Hugging Face model directory (no config.json)")
    model_type = AutoConfig.from_pretrained(path).model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model.path: {path} holds a '{model_type}' model; tailflow's engines run "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints"
        )


def load_model(path: str | Path, dtype=None) -> PreTrainedModel:
    """On CPU in `dtype` (default fp32); an engine moves it to its device."""
    import torch
    from transformers import AutoModelForCausalLM

    check_model_dir(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)


def value_model_config(path: str | Path):
    """The critic's config (train.advantage gae): the policy's architecture at `path` with a one-output token head
    (`...ForTokenClassification`, num_labels 1) in place of the language-model head, untied, without dropout (the
    values a step clips against must be the model's own, as the trainer's log-probs are)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, num_labels=1, tie_word_embeddings=False)
    config.classifier_dropout = 0.0
    config.architectures = [name.replace("ForCausalLM", "ForTokenClassification")
                            for name in config.architectures or ()]
    return config


def load_value_model(path: str | Path, dtype=None) -> PreTrainedModel:
    """A critic built from the policy's model directory at `path`: its backbone's weights, and a value head of
    zeros, so an untrained critic values every state 0 and the first advantages are the rewards to go, not
    noise. (A resumed critic's weights come from its checkpoint, loaded over these.)"""
    import torch
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    check_model_dir(path)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: score.weight, score.bias" is expected here
    try:
        model = AutoModelForTokenClassification.from_pretrained(path, config=value_model_config(path),
                                                                dtype=dtype or torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    with torch.no_grad():
        for parameter in model.score.parameters():
            parameter.zero_()
    return model
