"""`tailflow runs`, `resume` and `export` against a store built by hand: no Ray, no Prefect flow runs.

The store holds `demo` (7 iterations committed, a checkpoint, a long queue), `fresh` (a config, never
committed) and a warm-start cache folder that is not a run.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tailflow.cli import main
from tailflow.config import config_to_yaml, load_config
from tailflow.engines.run_state import RunState
from tailflow.engines.runs.checkpoint import OPTIMIZER_FILE, weights_sha256, write_checkpoint
from tailflow.engines.runs.commit import commit_state
from tailflow.engines.runs.layout import checkpoint_key, config_key
from tailflow.engines.store import open_store
from tailflow.engines.tail.queue import LongPromptQueue
from tailflow.engines.tail.state import TailState

ROUNDS = [0, 0, 0, 0, 1, 0, 0]
QUEUED = [f"arith-{n}" for n in (17, 3, 42, 8, 99, 5, 61)]


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoTokenizer

    from tailflow.engines.models import load_model
    from tailflow.driver.inputs import shipped_warmstart_dir

    shipped = shipped_warmstart_dir()
    return load_model(shipped), AutoTokenizer.from_pretrained(shipped)


@pytest.fixture
def store_uri(tmp_path, tiny_model) -> str:
    uri = str(tmp_path / "store")
    store = open_store(uri)
    yaml_text = config_to_yaml(load_config(None, [f"storage.uri={uri}", "train.iterations=20"]))
    for run_id in ("demo", "fresh"):
        store.write_text(config_key(run_id), yaml_text)
    store.write_text("warmstart/abc/recipe.json", "{}")  # shares the store, is no run

    model, tokenizer = tiny_model
    key = checkpoint_key("demo", 6)
    optimizer = {"state": {0: {"step": torch.tensor(7.0)}}, "param_groups": [{"lr": 1e-5, "params": [0]}]}
    write_checkpoint(store.path(key), {"model": model.state_dict(), "optimizer": optimizer}, model.config, tokenizer)
    queue = LongPromptQueue()
    queue.defer(QUEUED[:4], iteration=2)
    queue.defer(QUEUED[4:], iteration=5)
    commit_state(store, RunState(run_id="demo", iteration=7, weight_version=7,
                                 tail=TailState(queue=tuple(queue.prompts())),
                                 latest_checkpoint=key, weights_sha256=weights_sha256(store.path(key)),
                                 round_history=ROUNDS, initial_eval_accuracy=0.375, last_eval_accuracy=0.41))
    return uri


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_runs_list_shows_each_run_once_sorted(store_uri, capsys):
    code, out, _ = run_cli(capsys, "runs", "list", "--set", f"storage.uri={store_uri}")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["RUN", "demo", "fresh"]  # the warm-start folder is no run
    demo, fresh = lines[1], lines[2]
    assert demo.split()[1:5] == ["7/20", "short", "7", "41.0%"]
    assert demo.endswith(str(Path(store_uri) / "demo/checkpoints/iter-0006"))
    assert "0/20" in fresh and "no commit" in fresh


def test_runs_list_names_an_unreadable_run_and_lists_the_others(store_uri, capsys):
    store = open_store(store_uri)
    store.write_text(config_key("broken"), store.read_text(config_key("fresh")))
    store.write_text("broken/latest.json", "{not json")
    code, out, _ = run_cli(capsys, "runs", "list", "--set", f"storage.uri={store_uri}")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {"broken", "demo", "fresh"}
    assert "unreadable:" in lines["broken"] and "latest.json is not a commit pointer" in lines["broken"]


def test_runs_list_of_an_empty_store(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "runs", "list", "--set", f"storage.uri={tmp_path / 'none'}")
    assert code == 0 and out.startswith("no runs in ")


def test_runs_show_json_reports_the_commit(store_uri, capsys):
    code, out, _ = run_cli(capsys, "runs", "show", "demo", "--json", "--set", f"storage.uri={store_uri}")
    assert code == 0
    shown = json.loads(out)
    checkpoint = Path(store_uri) / "demo/checkpoints/iter-0006"
    assert shown["run_id"] == "demo"
    assert shown["iteration"] == 7 and shown["iterations_planned"] == 20
    assert shown["round_history"] == ROUNDS
    assert shown["long_queue_size"] == 7 and shown["long_queue_oldest"] == QUEUED[:5]  # oldest first
    assert shown["latest_checkpoint"] == str(checkpoint)
    assert shown["weights_sha256"] == weights_sha256(checkpoint)
    assert (shown["initial_eval_accuracy"], shown["last_eval_accuracy"]) == (0.375, 0.41)
    assert shown["config"] == str(Path(store_uri) / "demo/config.yaml")


def test_runs_show_text(store_uri, capsys):
    code, out, _ = run_cli(capsys, "runs", "show", "demo", "--set", f"storage.uri={store_uri}")
    assert code == 0
    assert "7 of 20 committed" in out
    assert "SSSSL SS (6 short, 1 long)" in out
    assert "7 prompts, oldest: arith-17, arith-3, arith-42, arith-8, arith-99, ..." in out
    assert "37.5% initial, 41.0% last" in out
    code, out, _ = run_cli(capsys, "runs", "show", "fresh", "--set", f"storage.uri={store_uri}")
    assert code == 0 and "no commit yet" in out


def test_export_writes_a_loadable_model_without_the_optimizer(store_uri, tmp_path, tiny_model, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path / "exported"
    code, out, _ = run_cli(capsys, "export", "demo", str(target), "--set", f"storage.uri={store_uri}")
    assert code == 0
    assert not (target / OPTIMIZER_FILE).exists()
    assert weights_sha256(target) in out
    assert weights_sha256(target) == weights_sha256(Path(store_uri) / "demo/checkpoints/iter-0006")
    exported = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    original, tokenizer = tiny_model
    exported_weights, original_weights = exported.state_dict(), original.state_dict()
    assert exported_weights.keys() == original_weights.keys()
    assert all(torch.equal(exported_weights[name], original_weights[name]) for name in original_weights)
    assert AutoTokenizer.from_pretrained(target)("12+30=")["input_ids"] == tokenizer("12+30=")["input_ids"]


def test_export_into_an_empty_existing_dir(store_uri, tmp_path, capsys):
    target = tmp_path / "empty"
    target.mkdir()
    assert run_cli(capsys, "export", "demo", str(target), "--set", f"storage.uri={store_uri}")[0] == 0
    assert (target / "model.safetensors").is_file()


def test_export_refuses_a_non_empty_dir(store_uri, tmp_path, capsys):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    code, out, err = run_cli(capsys, "export", "demo", str(target), "--set", f"storage.uri={store_uri}")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and str(target) in err and "not empty" in err
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_export_refuses_weights_that_do_not_match_the_commit(store_uri, tmp_path, capsys):
    weights = Path(store_uri) / "demo/checkpoints/iter-0006/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one byte changed: no longer what was committed
    weights.write_bytes(bytes(data))
    target = tmp_path / "out"
    code, _, err = run_cli(capsys, "export", "demo", str(target), "--set", f"storage.uri={store_uri}")
    assert code == 2 and "the commit recorded" in err
    assert not target.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_export_refuses_a_run_without_checkpoint(store_uri, tmp_path, capsys):
    target = tmp_path / "out"
    code, _, err = run_cli(capsys, "export", "fresh", str(target), "--set", f"storage.uri={store_uri}")
    assert code == 2 and "run fresh" in err and "no checkpoint yet" in err
    assert not target.exists()


def test_resume_of_a_run_without_commit_is_refused(store_uri, capsys):
    code, out, err = run_cli(capsys, "resume", "fresh", "--set", f"storage.uri={store_uri}")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"tailflow: error: run fresh has nothing to resume in {store_uri}: it never "
                                        "committed an iteration; start it again with `tailflow train --run-id fresh`"]


@pytest.mark.parametrize("command", [["runs", "show", "ghost"], ["resume", "ghost"], ["export", "ghost", "out"],
                                     ["runs", "show", ".."]])
def test_unknown_run_is_one_line(store_uri, tmp_path, command, capsys):
    command = [str(tmp_path / "out") if word == "out" else word for word in command]
    code, out, err = run_cli(capsys, *command, "--set", f"storage.uri={store_uri}")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "tailflow: error: run" in err
    assert not (tmp_path / "out").exists()


def fake_training(calls: list[dict]):
    from tailflow.flows.training import RunSummary

    def rl_training(**kwargs):
        calls.append(kwargs)
        return RunSummary(run_id=kwargs["run_id"], run_dir="store/demo", iterations=20, initial_accuracy=0.375,
                          final_accuracy=0.5, mean_step_seconds=1.0, latest_checkpoint="ckpt", metrics_path="m")
    return rl_training


def test_resume_uses_the_saved_config_with_overrides(store_uri, tmp_path, monkeypatch, capsys):
    """Without -c: the run's saved config, `--set` on top, storage.uri where the run was found."""
    import shutil

    import tailflow.flows.training as training

    calls: list[dict] = []
    monkeypatch.setattr(training, "rl_training", fake_training(calls))
    moved = tmp_path / "moved"
    shutil.copytree(store_uri, moved)  # the saved config still names the old store
    code, out, _ = run_cli(capsys, "resume", "demo", "--set", f"storage.uri={moved}", "--set", "train.iterations=30",
                           "--allow-change", "train.iterations")
    assert code == 0 and "run demo finished 20 iterations" in out
    (call,) = calls
    assert call["run_id"] == "demo" and call["allow_change"] == ["train.iterations", "storage.uri"]
    expected = load_config(None, [f"storage.uri={moved}", "train.iterations=30"]).model_dump(mode="json")
    assert call["config"] == expected


def test_train_with_run_id_passes_allowed_changes(store_uri, monkeypatch, capsys):
    import tailflow.flows.training as training

    calls: list[dict] = []
    monkeypatch.setattr(training, "rl_training", fake_training(calls))
    code, _, _ = run_cli(capsys, "train", "--run-id", "demo", "--set", f"storage.uri={store_uri}",
                         "--allow-change", "train.iterations,train.lr", "--allow-change", "tail.enabled")
    assert code == 0
    assert calls[0]["run_id"] == "demo"
    assert calls[0]["allow_change"] == ["train.iterations", "train.lr", "tail.enabled"]
    code, _, err = run_cli(capsys, "train", "--run-id", "demo", "--allow-change", "train.lrr")
    assert code == 2 and "--allow-change: train.lrr is not a config key" in err
    assert len(calls) == 1
