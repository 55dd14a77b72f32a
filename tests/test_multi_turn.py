"""The multi-turn loop (`rollout/trajectory_engine.py`, run by `rollout/multi_turn.py`) on the native engine: a real in-process `Environment`, a real BPE
tokenizer whose decode/encode round trip changes some token sequences, a random tiny Qwen2 over its vocabulary.

What must hold: the trajectory's model tokens are the sampled ones (never re-encoded); their recorded log-probs are a
full forward's over the whole conversation; each stop reason ends a trajectory where trajectory.py says; turns of
different trajectories interleave in the engine's batch, each continuing its previous turn's kept slot.
"""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from engine_contract import one_thread  # noqa: F401 (autouse fixture)
from test_native_engine import perturb
from tailflow.engines.data.chat_turns import PlainTextTurns
from tailflow.engines.env.environment import Environment, EnvStep, InvalidAction
from tailflow.engines.env.trajectory import StopReason
from tailflow.engines.rollout import NativeEngine, SamplingParams
from tailflow.engines.rollout.multi_turn import TrajectoryStart, TurnLimits, run_trajectories

EOS = 1
CHARACTERS = "ab12: "
MERGES = [("a", "b"), ("1", "2"), ("ab", "a"), ("2", ":")]


def merging_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE with merges: the tokens 'a', 'b' decode to 'ab', which encodes as the one token 'ab'."""
    byte = bytes_to_unicode()
    symbols = [byte[ord(c)] for c in CHARACTERS]
    merged = ["".join(byte[ord(c)] for c in left + right) for left, right in MERGES]
    vocab = {token: index for index, token in enumerate(["<pad>", "</s>", "<unk>", *symbols, *merged])}
    merges = [("".join(byte[ord(c)] for c in left), "".join(byte[ord(c)] for c in right)) for left, right in MERGES]
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


TOKENIZER = merging_tokenizer()


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(TOKENIZER), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=EOS, pad_token_id=0)
    model = Qwen2ForCausalLM(config).eval()
    perturb(model, seed)
    return model


class Counter(Environment):
    """Answers each turn with its length in 'a's and '1's; done after `done_after` turns (None: never); raises
    `fail_with` at its first step when set. Records what it saw."""

    def __init__(self, done_after: int | None = None, fail_with: Exception | None = None) -> None:
        self.done_after, self.fail_with = done_after, fail_with
        self.seen: list[str] = []
        self.closed = False

    def reset(self, seed: int) -> str:
        return "ab" * (1 + seed % 2) + ":"

    def step(self, action: str) -> EnvStep:
        self.seen.append(action)
        if self.fail_with is not None:
            raise self.fail_with
        done = self.done_after is not None and len(self.seen) >= self.done_after
        return EnvStep("a" * (len(action) % 3) + "12:", reward=1.0, done=done)

    def close(self) -> None:
        self.closed = True


class RecordingEngine:
    """The engine, with every submit and finish written down in order (what was sampled, and when)."""

    def __init__(self, engine: NativeEngine) -> None:
        self.engine = engine
        self.events: list[tuple[str, str]] = []
        self.completions = {}

    def submit(self, requests):
        self.events += [("submit", r.request_id) for r in requests]
        self.engine.submit(requests)

    def step(self):
        done = self.engine.step()
        for completion in done:
            self.events.append(("finish", completion.request_id))
            self.completions[completion.request_id] = completion
        return done

    def has_unfinished(self):
        return self.engine.has_unfinished()

    def release_kept(self, request_ids):
        self.engine.release_kept(request_ids)

    def __getattr__(self, name):
        return getattr(self.engine, name)


STOPS = (TOKENIZER.convert_tokens_to_ids("12"),)
"""Turns end at the merged token "12": this random model samples it often, so turns end within a few tokens."""


def run(limits: TurnLimits, environments: dict[int, Counter], stop_token_ids=STOPS, num_slots: int = 4,
        num_trajectories: int = 4, model=None):
    engine = RecordingEngine(NativeEngine(model or tiny_model(), num_slots=num_slots, max_seq_len=128,
                                          eos_token_ids=(EOS,)))
    starts = [TrajectoryStart("p", i, tuple(TOKENIZER.encode("12ab ")), env_seed=i) for i in range(num_trajectories)]
    params = SamplingParams(temperature=1.0, seed=7, stop_token_ids=stop_token_ids)
    trajectories = run_trajectories(engine, starts, lambda start: environments.setdefault(start.index, Counter()),
                                    PlainTextTurns(TOKENIZER), limits, params)
    return engine, trajectories


def test_trajectories_keep_the_sampled_tokens_whose_logprobs_are_a_full_forwards():
    model = tiny_model()
    environments: dict[int, Counter] = {}
    limits = TurnLimits(max_turns=4, turn_max_tokens=12, trajectory_max_tokens=80, context_length=128)
    engine, trajectories = run(limits, environments, model=model)
    actions = []
    for trajectory in trajectories:
        first_observation = "ab" * (1 + trajectory.index % 2) + ":"
        assert trajectory.prompt_token_ids == tuple(TOKENIZER.encode("12ab ") + TOKENIZER.encode(first_observation))
        for turn_index, turn in enumerate(trajectory.turns):
            sampled = engine.completions[f"p#{trajectory.index}/turn{turn_index}"]
            assert turn.action_token_ids == sampled.token_ids and turn.action_logprobs == sampled.logprobs
            actions.append(turn.action_token_ids)
        sequence = torch.tensor([trajectory.prompt_token_ids + trajectory.response_token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(sequence).logits[0, :-1].float(), dim=-1)
        targets = sequence[0, 1:]
        chosen = logprobs.gather(1, targets[:, None])[:, 0][len(trajectory.prompt_token_ids) - 1:]
        mask = torch.tensor(trajectory.response_mask)
        torch.testing.assert_close(chosen[mask], torch.tensor(trajectory.rollout_logprobs)[mask], atol=1e-4, rtol=0)
    # the point of never re-encoding: some sampled turn would have come back as other tokens
    assert any(tuple(TOKENIZER.encode(TOKENIZER.decode(a, skip_special_tokens=True))) != a for a in actions)
    assert sum(len(t.turns) for t in trajectories) > len(trajectories)  # multi-turn, not one turn each
    assert all(env.closed for env in environments.values())
    # interleaved, no per-turn barrier: a second turn started while another trajectory's first was still running
    events = engine.events
    last_first_turn = max(i for i, (kind, rid) in enumerate(events) if kind == "finish" and rid.endswith("/turn0"))
    assert any(kind == "submit" and rid.endswith("/turn1") for kind, rid in events[:last_first_turn])
    stats = engine.engine.stats()
    assert stats.reused_prefix_tokens > 0 and stats.num_kept == 0  # continued kept slots; all released at the end


def test_done_and_max_turns_let_the_environment_see_every_turn():
    environments = {0: Counter(done_after=2), 1: Counter()}
    limits = TurnLimits(max_turns=3, turn_max_tokens=16, trajectory_max_tokens=100, context_length=128)
    _, (done, capped) = run(limits, environments, num_trajectories=2)
    assert done.stop_reason is StopReason.DONE and len(done.turns) == 2 and len(environments[0].seen) == 2
    assert capped.stop_reason is StopReason.MAX_TURNS and len(capped.turns) == 3 and len(environments[1].seen) == 3
    for trajectory in (done, capped):
        assert trajectory.turns[-1].observation_token_ids == ()
        assert all(turn.observation_token_ids for turn in trajectory.turns[:-1])
        assert trajectory.reward == len(trajectory.turns)


def test_a_turn_cut_at_its_limit_is_kept_and_never_shown_to_the_environment():
    environments: dict[int, Counter] = {}
    limits = TurnLimits(max_turns=3, turn_max_tokens=5, trajectory_max_tokens=100, context_length=128)
    _, trajectories = run(limits, environments, stop_token_ids=(), num_trajectories=2)
    for trajectory in trajectories:
        # EOS (1 in 13 tokens) may end a turn before 5 tokens; the turn that reached 5 ended the trajectory
        assert trajectory.stop_reason is StopReason.TURN_TOKEN_LIMIT
        assert len(trajectory.turns[-1].action_token_ids) == 5 and trajectory.turns[-1].observation_token_ids == ()
        assert len(environments[trajectory.index].seen) == len(trajectory.turns) - 1


@pytest.mark.parametrize("trajectory_max_tokens, context_length, reason", [
    (7, 128, StopReason.TRAJECTORY_TOKEN_LIMIT), (100, 14, StopReason.CONTEXT_OVERFLOW)])
def test_the_trajectory_and_context_limits(trajectory_max_tokens, context_length, reason):
    environments: dict[int, Counter] = {}
    limits = TurnLimits(max_turns=8, turn_max_tokens=12, trajectory_max_tokens=trajectory_max_tokens,
                        context_length=context_length)
    _, trajectories = run(limits, environments, num_trajectories=3)
    for trajectory in trajectories:
        assert trajectory.stop_reason is reason
        assert len(trajectory.response_token_ids) <= trajectory_max_tokens
        assert len(trajectory.prompt_token_ids) + len(trajectory.response_token_ids) <= context_length
        assert all(len(turn.action_token_ids) < 12 for turn in trajectory.turns)


def test_an_environment_error_fails_its_trajectory_and_an_invalid_action_is_answered():
    environments = {0: Counter(fail_with=RuntimeError("boom")), 1: Counter(fail_with=InvalidAction("no"))}
    limits = TurnLimits(max_turns=2, turn_max_tokens=16, trajectory_max_tokens=100, context_length=128,
                        invalid_action_reward=-1.0)
    _, (failed, refused) = run(limits, environments, num_trajectories=2)
    assert failed.stop_reason is StopReason.ENV_ERROR and len(failed.turns) == 1
    assert refused.turns[0].reward == -1.0 and refused.turns[0].observation_token_ids == tuple(TOKENIZER.encode("no"))
    assert refused.stop_reason is StopReason.MAX_TURNS and environments[0].closed and environments[1].closed


class BrokenReset(Counter):
    def reset(self, seed: int) -> str:
        raise OSError("no sandbox")


class AbortingEngine(RecordingEngine):
    """Aborts one request once it runs (what tail batching's abort does to a turn in flight)."""

    def __init__(self, engine: NativeEngine, victim: str) -> None:
        super().__init__(engine)
        self.victim = victim

    def step(self):
        running = {seq.request_id for seq in self.engine.scheduler.running}
        if self.victim in running:
            return self.engine.abort([self.victim])
        return super().step()


def test_a_failed_reset_and_an_aborted_turn_end_their_trajectories_only():
    environments = {0: BrokenReset()}
    limits = TurnLimits(max_turns=3, turn_max_tokens=16, trajectory_max_tokens=100, context_length=128)
    engine = AbortingEngine(NativeEngine(tiny_model(), num_slots=4, max_seq_len=128, eos_token_ids=(EOS,)),
                            victim="p#1/turn1")
    starts = [TrajectoryStart("p", i, tuple(TOKENIZER.encode("12ab ")), env_seed=i) for i in range(3)]
    broken, aborted, whole = run_trajectories(engine, starts, lambda s: environments.setdefault(s.index, Counter()),
                                              PlainTextTurns(TOKENIZER), limits,
                                              SamplingParams(temperature=1.0, seed=7, stop_token_ids=STOPS))
    assert broken.stop_reason is StopReason.ENV_ERROR and broken.turns == () and environments[0].closed
    assert aborted.stop_reason is StopReason.ABORT and len(aborted.turns) == 2
    assert whole.stop_reason is StopReason.MAX_TURNS and len(whole.turns) == 3
    assert engine.engine.stats().num_kept == 0  # nothing stays kept after the trajectories end


def test_prefix_reuse_changes_no_token_and_prefills_a_fraction():
    """The same trajectories with kept slots off (max_kept_slots=0: every turn prefills its whole conversation)
    and on: equal tokens, log-probs to 1e-5, and far fewer prefilled tokens (682 against 5394 when written)."""
    results = {}
    for max_kept in (0, None):
        engine = NativeEngine(tiny_model(), num_slots=8, max_seq_len=512, eos_token_ids=(EOS,), max_kept_slots=max_kept)
        starts = [TrajectoryStart("p", i, tuple(TOKENIZER.encode("12ab " * 20)), env_seed=i) for i in range(8)]
        trajectories = run_trajectories(engine, starts, lambda start: Counter(), PlainTextTurns(TOKENIZER),
                                        TurnLimits(8, 16, 400, 512),
                                        SamplingParams(temperature=1.0, seed=3, stop_token_ids=STOPS))
        results[max_kept] = trajectories, engine.stats()
    (without, cold), (with_reuse, warm) = results[0], results[None]
    for a, b in zip(without, with_reuse):
        assert a.response_token_ids == b.response_token_ids and a.stop_reason == b.stop_reason
        torch.testing.assert_close(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs), atol=1e-5,
                                   rtol=0)
    assert sum(len(t.turns) for t in with_reuse) > 2 * len(with_reuse)
    assert cold.reused_prefix_tokens == 0 and warm.prefill_tokens * 4 < cold.prefill_tokens
    assert warm.prefill_tokens + warm.reused_prefix_tokens == cold.prefill_tokens
