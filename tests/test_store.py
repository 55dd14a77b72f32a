import json

import pytest

from tailflow.engines.store import LocalStore, StoreError, open_store
from tailflow.engines.track import MetricsLogger


def test_atomic_writes_and_directories(tmp_path):
    store = LocalStore(tmp_path / "root")
    store.write_text("run/config.yaml", "a: 1\n")
    assert store.read_text("run/config.yaml") == "a: 1\n"
    assert (tmp_path / "root" / "run" / "config.yaml").stat().st_mode & 0o044  # readable by others, like any file
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"x" * 10)
    store.put_dir("run/checkpoints/iter-0000", source)
    (source / "model.safetensors").write_bytes(b"y")
    store.put_dir("run/checkpoints/iter-0000", source)  # replaces, never merges half of each
    assert (store.local_dir("run/checkpoints/iter-0000") / "model.safetensors").read_bytes() == b"y"
    assert store.list_dir("run/checkpoints") == ["iter-0000"]
    assert not [p for p in (tmp_path / "root" / "run").rglob(".*")]  # no temp files left behind


def test_keys_cannot_escape_the_root(tmp_path):
    with pytest.raises(StoreError, match="escapes"):
        LocalStore(tmp_path).write_text("../outside", "x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LocalStore(tmp_path).read_text("missing.json")
    with pytest.raises(StoreError, match="storage.uri"):
        open_store("s3:///prefix")


def test_metrics_rows_are_json_lines(tmp_path):
    logger = MetricsLogger(LocalStore(tmp_path), "r1")
    logger.log({"iteration": 0, "reward/mean": 0.5, "actor/kl": float("nan")})
    logger.log({"iteration": 1, "reward/mean": 0.75})
    lines = (tmp_path / "r1" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0, 1]
    assert logger.rows()[0]["actor/kl"] is None
    assert list(logger.recent) == logger.rows()  # what the flow shows, without reading the file


def test_recent_rows_are_bounded_and_follow_a_resume(tmp_path, monkeypatch):
    from tailflow.engines.track import metrics

    monkeypatch.setattr(metrics, "RECENT_ROWS", 3)
    logger = MetricsLogger(LocalStore(tmp_path), "r1")
    for iteration in range(5):
        logger.log({"iteration": iteration})
    assert [row["iteration"] for row in logger.recent] == [2, 3, 4]
    resumed = MetricsLogger(LocalStore(tmp_path), "r1")  # a new process: the file's last rows
    assert [row["iteration"] for row in resumed.recent] == [2, 3, 4]
    resumed.keep_committed(4)  # iteration 4 was written, never committed
    assert [row["iteration"] for row in resumed.recent] == [1, 2, 3]


def test_local_list_files_walks_every_folder_and_skips_hidden_names(tmp_path):
    store = LocalStore(tmp_path)
    for key in ("r1/a.json", "r1/states/iter-0000.json", "r1/.lock", "r1/ckpt/.manifest.json", "r1/ckpt/m.bin"):
        store.write_text(key, "x")
    assert store.list_files("r1") == ["a.json", "ckpt/m.bin", "states/iter-0000.json"]
    assert store.list_files("missing") == []


def test_wandb_offline_run_gets_the_rows(tmp_path, monkeypatch):
    """W&B in offline mode (no network): named after the run id, every row logged."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    from tailflow.engines.track import start_wandb

    run = start_wandb("r-wandb", "tailflow-test", "offline", {"train": {"lr": 1e-4}}, str(tmp_path))
    logger = MetricsLogger(LocalStore(tmp_path), "r-wandb", run)
    logger.log({"iteration": 0, "reward/mean": 0.25})
    logger.log({"iteration": 1, "reward/mean": 0.5})
    assert run.name == "r-wandb" and run.config["train"]["lr"] == 1e-4
    logger.close()
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*-r-wandb"))
    assert run_dirs and list(run_dirs[0].glob("*.wandb"))


def test_stored_directories_get_ordinary_permissions(tmp_path):
    """put_dir stages in a mkdtemp (0700) and libraries write some files 0600: a run's checkpoints must still
    be readable by whoever may read the store (the process umask decides, as for any file)."""
    import os
    import stat

    from tailflow.engines.store.local import PROCESS_UMASK

    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "model.safetensors").write_bytes(b"w")
    os.chmod(source / "model.safetensors", 0o600)
    (source / "sub" / "x.json").write_text("{}")
    store = LocalStore(tmp_path / "store")
    store.put_dir("r/checkpoints/iter-0000", source)
    stored = store.path("r/checkpoints/iter-0000")
    assert stat.S_IMODE(stored.stat().st_mode) == 0o777 & ~PROCESS_UMASK
    assert stat.S_IMODE((stored / "model.safetensors").stat().st_mode) == 0o666 & ~PROCESS_UMASK
    assert (stored / "sub" / "x.json").read_text() == "{}"
    assert not [p for p in stored.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
