"""A character-level tokenizer for the embedded task, built in code.

It is a real byte-level BPE tokenizer with no merges, saved and loaded like
any Hugging Face tokenizer. Byte-level matters: transformers 5 loads the
tokenizer of a `qwen2` checkpoint as `Qwen2Tokenizer`, which re-imposes
byte-level pre-tokenization whatever tokenizer.json says, so a plain
character vocabulary would silently lose its newlines. With byte-level
symbols (space = 'Ġ', newline = 'Ċ') both loaders give the same ids.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
CHARACTERS = "0123456789+-*=#:? \n"
"""The embedded arithmetic task's alphabet (the shipped warm start's vocabulary)."""
PRINTABLE_ASCII = "".join(chr(code) for code in range(32, 127)) + "\n\t"
"""Enough to write Python: the vocabulary of a tiny code model (tests, benchmarks of code rewards)."""


def build_char_tokenizer(characters: str = CHARACTERS) -> PreTrainedTokenizerFast:
    byte_symbols = bytes_to_unicode()  # GPT-2's reversible byte -> printable-character table: '\n' -> 'Ċ'
    symbols = [byte_symbols[ord(character)] for character in characters]
    vocab = {token: index for index, token in enumerate([PAD, EOS, UNK, *symbols])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
