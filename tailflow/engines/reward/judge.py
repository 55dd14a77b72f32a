"""LLM-as-judge: a judge model says whether a response matches the reference.

    reward = p(yes) / (p(yes) + p(no)),   correct = reward > 0.5

with p(yes) and p(no) the judge's next-token probabilities of the first tokens of `judge_yes` and `judge_no`
after the prompt built from `reward.judge_template`: graded even when the judge is unsure. docs/rewards.md,
"LLM judge", says which engine holds it and which yes/no texts are refused at start. Prompts longer than the
judge's context keep their end (the response and the question of the template's tail).
"""
from __future__ import annotations

import math

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.result import RewardResult


class JudgeError(ValueError):
    pass


class JudgeReward:
    def __init__(self, model_path: str, template: str, yes_text: str = "Yes", no_text: str = "No") -> None:
        from transformers import AutoConfig, AutoTokenizer

        from tailflow.engines.rollout.native import NativeEngine

        self.template = template
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.yes_id = self._first_token(yes_text, "reward.judge_yes")
        self.no_id = self._first_token(no_text, "reward.judge_no")
        if self.yes_id == self.no_id:
            raise JudgeError(f"reward.judge_yes ({yes_text!r}) and reward.judge_no ({no_text!r}) start with the same "
                             f"token in the judge's vocabulary ({model_path})")
        self.context = int(AutoConfig.from_pretrained(model_path).max_position_embeddings)
        self.engine = NativeEngine.from_pretrained(model_path, num_slots=1, max_seq_len=self.context)

    def _first_token(self, text: str, key: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise JudgeError(f"{key}: {text!r} encodes to no tokens")
        if self.tokenizer.unk_token_id is not None and ids[0] == self.tokenizer.unk_token_id:
            raise JudgeError(f"{key}: {text!r} starts with a character the judge's vocabulary lacks (unknown token)")
        return ids[0]

    def prompt_ids(self, response_text: str, problem: Problem) -> list[int]:
        reference = problem.answer or (problem.solution or "")
        prompt = self.template.format(prompt=problem.prompt, reference=reference, response=response_text)
        ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        return ids[-self.context:]

    def score_problem(self, response_text: str, problem: Problem, timeout_s: float | None = None) -> RewardResult:
        yes, no = self.engine.next_token_logprobs(self.prompt_ids(response_text, problem), (self.yes_id, self.no_id))
        p_yes = 1.0 / (1.0 + math.exp(no - yes))
        return RewardResult(reward=p_yes, correct=p_yes > 0.5, formatted=True)
