"""Rollout traces: write/read round trip, the run's log in the store, bad files, RollPacker's logs, the generator."""
from __future__ import annotations

import json
import statistics

import bench_path  # noqa: F401  (bench/research is not part of the package)
import pytest
from research.replay import TraceLengths

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim.lengths import ResponseLength
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.rollpacker import read_rollpacker_lengths
from tailflow.engines.sim.trace import pools_from_trace
from tailflow.engines.track.rollout_trace import (
    RolloutTraceLog,
    TraceError,
    TracePrompt,
    TraceResponse,
    TraceRound,
    read_trace,
    write_trace,
)
from tailflow.engines.store import LocalStore


def a_round(iteration: int = 0, kind: str = "short") -> TraceRound:
    return TraceRound(iteration, kind, 50, 1.25, (
        TracePrompt("a", 7, (TraceResponse(0, 12, "eos", 12, 0, "kept"), TraceResponse(1, 40, "eos", 40, 0, "kept"),
                             TraceResponse(2, 9, "abort", None, None, "aborted"))),
        TracePrompt("b", 4, (TraceResponse(0, 3, "eos", 3, 0, "finished"), TraceResponse(1, 20, "abort", None, None,
                                                                                          "aborted"))),
    ))


def request(name: str) -> Request:
    """"a#1": response 1 of prompt a."""
    problem_id, _, index = name.partition("#")
    return Request.for_problem(problem_id, int(index), (1, 2, 3), SamplingParams(max_new_tokens=50))


def test_trace_round_trip(tmp_path):
    rounds = [a_round(0), a_round(1, "long")]
    write_trace(tmp_path / "t.jsonl", rounds)
    assert read_trace(tmp_path / "t.jsonl") == rounds


def test_replayed_lengths_and_censored_aborts():
    lengths = TraceLengths([a_round(0)])
    assert lengths.draw(0, request("a#0")).num_tokens == 12
    assert lengths.draw(0, request("a#1")) == ResponseLength(40, FinishReason.EOS)
    # aborted a#2 had 9 tokens; its prompt's longest finished response (40 < cap) is longer: that is its length
    assert lengths.draw(0, request("a#2")).num_tokens == 40
    # aborted b#1 had 20 tokens, more than any finished response of b (3): only "still going" is known -> the cap
    assert lengths.draw(0, request("b#1")) == ResponseLength(50, FinishReason.LENGTH)
    with pytest.raises(KeyError, match="never launched 'c#0'"):
        lengths.draw(0, request("c#0"))
    with pytest.raises(KeyError, match="no round 1"):
        lengths.draw(1, request("a#0"))


def test_a_launched_request_keeps_its_length_while_later_rounds_launch():
    """Rounds overlap when the rollout runs ahead, and a request paused at a weight sync is submitted again
    later: its length is the one its own round drew, whatever rounds launched since."""
    lengths = TraceLengths([a_round(0), TraceRound(1, "long", 50, 1.0, (
        TracePrompt("c", 4, (TraceResponse(0, 7, "eos", 7, 0, "kept"),)),))])
    lengths.launch(0, [request("a#1")])
    lengths.launch(1, [request("c#0")])
    assert lengths.length_of(request("a#1")).num_tokens == 40 and lengths.length_of(request("c#0")).num_tokens == 7
    with pytest.raises(KeyError, match="'b#0' was never launched"):
        lengths.length_of(request("b#0"))
    pools = pools_from_trace([a_round(0)])
    assert pools.pools == {"a": [12, 40], "b": [3]}


def test_run_log_keeps_the_last_row_of_an_iteration_and_drops_uncommitted_ones(tmp_path):
    log = RolloutTraceLog(LocalStore(tmp_path), "run-1")
    log.append(a_round(0))
    log.append(a_round(1))
    retried = TraceRound(1, "long", 50, 9.0, a_round(1).prompts)
    log.append(retried)  # the iteration ran again after an actor died
    assert log.rounds() == [a_round(0), retried]
    log.keep_committed(1)
    assert log.rounds() == [a_round(0)]
    assert (tmp_path / "run-1" / "rollout_trace.jsonl").is_file()


@pytest.mark.parametrize("line,message", [
    ("{oops", ":1: not JSON"),
    ('{"format": "x"}', ":1: field 'format' must be 'tailflow-rollout-trace/1'"),
    ('{"format": "tailflow-rollout-trace/1", "iteration": 0}', ":1: missing field 'prompts'"),
])
def test_bad_trace_lines_are_one_line_errors(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value) and "\n" not in str(error.value)


def test_bad_outcome_and_finish_are_named(tmp_path):
    data = json.loads(a_round(0).to_line())
    data["prompts"][0]["responses"][0]["outcome"] = "lost"
    (tmp_path / "t.jsonl").write_text(json.dumps(data) + "\n")
    with pytest.raises(TraceError, match="outcome 'lost' of a#0"):
        read_trace(tmp_path / "t.jsonl")
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "absent.jsonl")


def test_rollpacker_length_log(tmp_path):
    path = tmp_path / "response-length-and-rewards-ep0.jsonl"
    lines = [{"domain": "math", "prompt_hash": "h1", "response_lengths": [10, 20], "long_iteration": False},
             {"domain": "math", "prompt_hash": "h2", "response_lengths": [300]},
             {"domain": "math", "prompt_hash": "h1", "response_lengths": [30]}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    pools = read_rollpacker_lengths(path)
    assert pools.pools == {"h1": [10, 20, 30], "h2": [300]} and pools.max_new_tokens == 300
    assert pools.draw(3, request("h2#5")).finish_reason is FinishReason.LENGTH  # 300 is the cap
    assert pools.draw(3, request("h1#0")).num_tokens in (10, 20, 30)
    path.write_text(json.dumps({"prompt_hash": "h3", "response_lengths": [5, -1]}) + "\n")
    with pytest.raises(TraceError, match=r":1: field 'response_lengths' must be a non-empty list of positive"):
        read_rollpacker_lengths(path)


def test_paper_lengths_match_the_characterisation():
    """The paper's 16k characterisation (the generator's only target): P75 755-1.1k, longest/median 25-32x,
    some responses at the cap, and one prompt's responses correlated (hard prompts ramble)."""
    for seed in range(3):
        generator = PaperLikeLengths(128, 16384, seed)
        drawn = {p: [generator.draw_for(p, f"{p}#{k}", 0, 16384) for k in range(8)] for p in generator.problem_ids()}
        lengths = sorted(r.num_tokens for rs in drawn.values() for r in rs)
        median = statistics.median(lengths)
        assert 755 <= lengths[int(0.75 * len(lengths))] <= 1100
        assert 25 <= lengths[-1] / median <= 32
        assert any(r.finish_reason is FinishReason.LENGTH for rs in drawn.values() for r in rs)
        hard = sorted(drawn, key=generator.difficulty)[-10:]
        easy = sorted(drawn, key=generator.difficulty)[:10]
        mean_of = lambda ids: statistics.mean(r.num_tokens for p in ids for r in drawn[p])
        assert mean_of(hard) > 3 * mean_of(easy)
    again = PaperLikeLengths(128, 16384, 0)
    assert again.draw_for("p000007", "p000007#3", 2, 16384) == PaperLikeLengths(128, 16384, 0).draw_for(
        "p000007", "p000007#3", 2, 16384)
