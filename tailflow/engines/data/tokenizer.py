"""A character-level tokenizer for the embedded task, built in code.

It is a real `PreTrainedTokenizerFast` (saved and loaded like any Hugging Face
tokenizer), so the rest of the system never knows it is special.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
CHARACTERS = "0123456789+-*=#:? \n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate([PAD, EOS, UNK, *CHARACTERS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
