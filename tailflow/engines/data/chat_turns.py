"""The tokens between turns of a multi-turn conversation: after the prompt, and after each model turn.

The model's turns are never re-encoded (`rollout/multi_turn.py`), so the conversation is assembled from tokens:
prompt, first observation, model turn, observation, model turn... For a chat model each observation must arrive
wrapped as the chat template wraps a user message, so that the assembled tokens are what
`apply_chat_template(messages, add_generation_prompt=True)` gives for the same conversation: the template is
rendered around placeholder messages and the text it puts between them is kept (`ChatTurns`). A model without a
chat template (the shipped tiny one) gets the observation as plain text (`PlainTextTurns`).

Equality with `apply_chat_template` holds where the template renders each earlier model turn as the model wrote it
and the tokenizer splits the text at the template's special tokens (every chat tokenizer does). It cannot hold
where the template rewrites history: Qwen3's drops the `<think>` block of every model turn before the last user
message. The trajectory keeps what the model saw when it sampled (its reasoning included); that is the sequence
whose log-probs were recorded, hence the one to train.
"""
from __future__ import annotations

from typing import Sequence

from transformers import PreTrainedTokenizerBase

PLACEHOLDER_TASK = "\x01task\x01"
PLACEHOLDER_ACTION = "\x01action\x01"


class PlainTextTurns:
    """Observations appended as their plain text tokens (a model without a chat template)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def first_observation_tokens(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def observation_tokens(self, action_token_ids: Sequence[int], text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def action_text(self, action_token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(action_token_ids), skip_special_tokens=True)


class ChatTurns(PlainTextTurns):
    """Observations as user messages of the tokenizer's chat template, found by rendering it.

    The prompt is the task's messages rendered *without* the generation prompt (it ends after its last message);
    the first observation is a user message, then the generation prompt. After a model turn the template's own
    end of an assistant message follows (its first token, the end-of-turn token the model emits to stop, is not
    repeated when the turn already ends with it), then the observation as a user message and the generation
    prompt again.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatTurns needs a tokenizer with a chat_template; PlainTextTurns appends plain text")

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _text_after(self, before: list[dict[str, str]], added: list[dict[str, str]]) -> str:
        """What the template appends to the rendering of `before` (no generation prompt) when `added` messages
        and the generation prompt follow."""
        head = self._render(before, generation_prompt=False)
        whole = self._render(before + added, generation_prompt=True)
        if not whole.startswith(head):
            raise ValueError("the chat template renders earlier messages differently once more follow; its "
                             "observation boundaries cannot be appended as tokens")
        return whole[len(head):]

    def first_observation_tokens(self, text: str) -> list[int]:
        task = [{"role": "user", "content": PLACEHOLDER_TASK}]
        added = [{"role": "user", "content": text}] if text else []
        return self.tokenizer.encode(self._text_after(task, added), add_special_tokens=False)

    def observation_tokens(self, action_token_ids: Sequence[int], text: str) -> list[int]:
        before = [{"role": "user", "content": PLACEHOLDER_TASK}, {"role": "assistant", "content": PLACEHOLDER_ACTION}]
        rendered = self._render(before, generation_prompt=False)
        end_of_turn = rendered[rendered.index(PLACEHOLDER_ACTION) + len(PLACEHOLDER_ACTION):]
        boundary = self.tokenizer.encode(end_of_turn + self._text_after(before, [{"role": "user", "content": text}]),
                                         add_special_tokens=False)
        if action_token_ids and boundary and action_token_ids[-1] == boundary[0]:
            return boundary[1:]
        return boundary


def turn_codec(tokenizer: PreTrainedTokenizerBase) -> PlainTextTurns:
    """`ChatTurns` for a tokenizer with a chat template, else `PlainTextTurns`."""
    return ChatTurns(tokenizer) if getattr(tokenizer, "chat_template", None) else PlainTextTurns(tokenizer)
