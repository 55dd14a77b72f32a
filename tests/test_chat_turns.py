"""Observation boundaries from a chat template (`tailflow/engines/data/chat_turns.py`): the prompt, then each model
turn's sampled tokens and the observation tokens `ChatTurns` appends, must equal `apply_chat_template` of the same
conversation. Real tokenizers (the repository's byte-level one over printable ASCII, with the templates' special
tokens added) and three templates written here: ChatML (Qwen2's format), Llama 3's headers, and a Qwen3-style
ChatML that drops earlier turns' reasoning, where equality cannot hold and the trajectory keeps what was sampled.
"""
from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from tailflow.engines.data.chat_turns import ChatTurns, PlainTextTurns, turn_codec
from tailflow.engines.data.tokenizer import PRINTABLE_ASCII, build_char_tokenizer

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

LLAMA3 = ("{{ bos_token }}{% for m in messages %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")

QWEN3_STYLE = ("{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
               "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
               "{% for m in messages %}{% set content = m['content'] %}"
               "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
               "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
               "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
"""ChatML whose assistant turns before the last user message lose their `<think>...</think>` block (as Qwen3's)."""


def chat_tokenizer(template: str, specials: list[str], bos: str | None = None) -> PreTrainedTokenizerFast:
    tokenizer = build_char_tokenizer(PRINTABLE_ASCII)
    tokenizer.add_special_tokens({"additional_special_tokens": specials, **({"bos_token": bos} if bos else {})})
    tokenizer.chat_template = template
    return tokenizer


CHATML_SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
FORMATS = {
    "chatml": (lambda: chat_tokenizer(CHATML, CHATML_SPECIALS), "<|im_end|>"),
    "llama3": (lambda: chat_tokenizer(LLAMA3, LLAMA3_SPECIALS, bos="<|begin_of_text|>"), "<|eot_id|>"),
    "qwen3-style": (lambda: chat_tokenizer(QWEN3_STYLE, CHATML_SPECIALS), "<|im_end|>"),
}
TASK = [{"role": "system", "content": "Guess the number."}, {"role": "user", "content": "It is in 0-99."}]


def template_ids(tokenizer, messages, generation_prompt: bool) -> list[int]:
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def assemble(tokenizer, end_of_turn: str, first_observation: str, turns: list[tuple[str, str]]):
    """The conversation as the turn loop builds it (actions as sampled tokens, ending with the end-of-turn
    token), and the same conversation as chat messages."""
    codec = ChatTurns(tokenizer)
    ids = template_ids(tokenizer, TASK, generation_prompt=False) + codec.first_observation_tokens(first_observation)
    messages = TASK + ([{"role": "user", "content": first_observation}] if first_observation else [])
    for action, observation in turns:
        sampled = tokenizer.encode(action, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(end_of_turn)]
        ids += sampled + codec.observation_tokens(sampled, observation)
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
    return ids, messages


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("first_observation", ["Your first guess?", ""])
def test_assembled_turns_equal_the_chat_template_of_the_conversation(name, first_observation):
    make, end_of_turn = FORMATS[name]
    tokenizer = make()
    turns = [("50", "Higher."), ("75", "Lower. 2 guesses left."), ("60", "Yes!")]
    ids, messages = assemble(tokenizer, end_of_turn, first_observation, turns)
    assert ids == template_ids(tokenizer, messages, generation_prompt=True)
    codec = ChatTurns(tokenizer)
    assert codec.action_text(tokenizer.encode("50", add_special_tokens=False)
                             + [tokenizer.convert_tokens_to_ids(end_of_turn)]) == "50"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_turn_that_did_not_end_with_the_end_of_turn_token_is_closed_by_the_boundary(name):
    make, end_of_turn = FORMATS[name]
    tokenizer = make()
    codec = ChatTurns(tokenizer)
    closed = codec.observation_tokens(tokenizer.encode("50", add_special_tokens=False), "Higher.")
    ended = codec.observation_tokens(tokenizer.encode("50", add_special_tokens=False)
                                     + [tokenizer.convert_tokens_to_ids(end_of_turn)], "Higher.")
    assert closed == [tokenizer.convert_tokens_to_ids(end_of_turn)] + ended


def test_qwen3_style_history_rewriting_is_not_followed_the_sampled_reasoning_is_kept():
    """The template would render the first turn without its reasoning once another user message follows; the
    assembled conversation keeps it, since the model sampled its later turns after it. Without the reasoning, the
    two are equal again."""
    make, end_of_turn = FORMATS["qwen3-style"]
    tokenizer = make()
    thought = "<think>\nmid of 0-99\n</think>\n\n"
    ids, messages = assemble(tokenizer, end_of_turn, "Go.", [(thought + "50", "Higher."), ("75", "Yes!")])
    rendered = template_ids(tokenizer, messages, generation_prompt=True)
    assert ids != rendered
    reasoning = tokenizer.encode(thought, add_special_tokens=False)
    start = next(i for i in range(len(ids)) if ids[i:i + len(reasoning)] == reasoning)
    assert ids[:start] + ids[start + len(reasoning):] == rendered


def test_a_tokenizer_without_a_chat_template_gets_plain_text_observations():
    tokenizer = build_char_tokenizer()  # the shipped tiny model's tokenizer: no chat template
    codec = turn_codec(tokenizer)
    assert type(codec) is PlainTextTurns
    assert codec.observation_tokens([4, 5], "12=3") == tokenizer.encode("12=3", add_special_tokens=False)
    assert codec.first_observation_tokens("") == []
    with pytest.raises(ValueError, match="chat_template"):
        ChatTurns(tokenizer)
    assert type(turn_codec(chat_tokenizer(CHATML, CHATML_SPECIALS))) is ChatTurns
