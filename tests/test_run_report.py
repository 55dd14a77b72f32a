"""The run report: every plot written and non-empty, report.html showing them, index.html listing the run's files;
on a local store through the CLI, and on S3 (moto over HTTP) with content types a browser displays."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_s3_store import aws_env, bucket, moto_server, raw  # noqa: F401 - fixtures

from tailflow.engines.runs.commit import LatestPointer
from tailflow.engines.store import LocalStore, S3Store
from tailflow.engines.track.report import write_report

PLOTS = ("reward", "lengths", "step_times", "long_queue", "wasted_tokens")


def fake_run(store, run_id: str, iterations: int = 6) -> None:
    """A run's files as a run writes them: rows for 6 iterations (every 3rd a long round), one uncommitted."""
    rows, trace = [], []
    for i in range(iterations + 1):
        long_round = i % 3 == 2
        rows.append({"iteration": i, "tail/round": int(long_round), "reward/mean": 0.1 * i, "reward/accuracy": 0.05 * i,
                     "time/step_generate": 2.0, "time/step_reward": 0.5, "time/step_train": 3.0,
                     "time/step_model_update": 0.2, "time/eval": 1.0 if i % 2 else 0.0,
                     "tail/long_queue_size": 0 if long_round else 2 * (i % 3 + 1),
                     "tail/wasted_tokens": 0 if long_round else 100 + i, **({"eval/accuracy": 0.3} if i % 2 else {}),
                     **({"eval/accuracy_initial": 0.25} if i == 0 else {})})
        responses = [{"index": k, "length": 10 * (k + 1) * (3 if long_round else 1), "finish": "eos", "step": 1,
                      "worker": 0, "outcome": "kept"} for k in range(4)]
        trace.append({"format": "tailflow-rollout-trace/1", "iteration": i, "round": "long" if long_round else "short",
                      "max_new_tokens": 720, "generate_s": 1.0,
                      "prompts": [{"problem_id": f"p{i}", "prompt_tokens": 9, "responses": responses}]})
    store.write_text(f"{run_id}/config.yaml", "model: {}\n")
    store.write_text(f"{run_id}/metrics.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    store.write_text(f"{run_id}/rollout_trace.jsonl", "".join(json.dumps(row) + "\n" for row in trace))
    store.write_text(f"{run_id}/states/iter-0005.json", "{}")
    store.write_text(f"{run_id}/checkpoints/iter-0005/model.safetensors", "weights")
    pointer = LatestPointer(iteration=iterations, state=f"{run_id}/states/iter-0005.json",
                            checkpoint=f"{run_id}/checkpoints/iter-0005")
    store.write_text(f"{run_id}/latest.json", pointer.model_dump_json())


def test_tailflow_report_writes_every_plot_the_page_and_the_index(tmp_path):
    store = LocalStore(tmp_path)
    fake_run(store, "r1")
    done = subprocess.run([sys.executable, "-m", "tailflow.cli", "report", "r1", "--set", f"storage.uri={tmp_path}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after 6 iterations" in done.stdout  # the uncommitted 7th row is left out
    for name in PLOTS:
        data = (tmp_path / "r1" / "report" / f"{name}.png").read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5_000, name
    page = (tmp_path / "r1" / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(PLOTS)  # inlined: a link to the page alone shows them
    assert "SSLSSL" in page  # the rounds, short and long
    index = (tmp_path / "r1" / "index.html").read_text()
    for name in ("report.html", "latest.json", "metrics.jsonl", "states/iter-0005.json",
                 "checkpoints/iter-0005/model.safetensors", "report/lengths.png"):
        assert f'href="{name}"' in index, name


class StreamedOnly(LocalStore):
    """A store on which the run's growing files can only be streamed: reading one whole raises."""

    def read_bytes(self, key: str) -> bytes:
        assert not key.endswith(".jsonl"), f"{key} read whole"
        return super().read_bytes(key)


def test_a_redraw_streams_the_growing_files_and_draws_what_the_whole_rows_say(tmp_path):
    """The driver redraws every `report_every` iterations for the run's life: metrics.jsonl and
    rollout_trace.jsonl are streamed into the drawn columns and length counts, not held whole."""
    from tailflow.engines.track.report_data import read_columns, response_lengths

    store = StreamedOnly(tmp_path)
    fake_run(store, "r1")
    assert write_report(store, "r1").iterations == 6
    columns = read_columns(store, "r1")
    assert list(columns.iterations) == [0, 1, 2, 3, 4, 5]  # the uncommitted row left out
    assert columns.series("eval/accuracy") == ([1, 3, 5], [0.3, 0.3, 0.3])
    assert columns.first("eval/accuracy_initial") == 0.25
    assert columns.filled("time/eval") == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    lengths = response_lengths(store, "r1")
    assert lengths["long"] == {30: 2, 60: 2, 90: 2, 120: 2} and sum(lengths["short"].values()) == 4 * 5


def test_report_of_a_missing_run_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tailflow.cli", "report", "nope", "--set", f"storage.uri={tmp_path}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "no run nope in" in done.stderr


def test_report_on_s3_is_served_as_html_and_png(bucket, raw, tmp_path):  # noqa: F811
    store = S3Store(bucket, "runs", cache_dir=tmp_path / "cache")
    fake_run(store, "r1")
    report = write_report(store, "r1")
    assert report.iterations == 6 and len(report.plots) == len(PLOTS)
    head = lambda key: raw.head_object(Bucket=bucket, Key=f"runs/{key}")  # noqa: E731
    assert head("r1/report.html")["ContentType"] == "text/html"
    assert head("r1/index.html")["ContentType"] == "text/html"
    for key in report.plots:
        assert head(key)["ContentType"] == "image/png" and head(key)["ContentLength"] > 5_000
