"""One writer per run: the store lease refuses a second writer by name, frees a dead holder's lease as documented,
and is exclusive under races, on a local folder and on S3 (moto over HTTP, conditional writes)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from test_s3_store import aws_env, bucket, moto_server, raw  # noqa: F401 - fixtures

from tailflow.engines.runs.lease import (LeaseLostError, RunBusyError, acquire_lease, hold_lease, new_lease,
                                         read_lease)
from tailflow.engines.runs.layout import lease_key
from tailflow.engines.store import LocalStore, S3Store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    bucket_name = request.getfixturevalue("bucket")
    return S3Store(bucket_name, "runs", cache_dir=tmp_path / "cache")


def forge(store, run_id: str, **fields) -> None:
    """A lease written by someone else (another host, another process)."""
    lease = new_lease(run_id, "someone else's flow run", timeout_s=fields.pop("timeout_s", 60.0))
    store.write_text(lease_key(run_id), lease.model_copy(update=fields).model_dump_json())


def test_second_writer_is_refused_with_the_holder_named_and_gets_the_run_once_released(store):
    with hold_lease(store, "r1", "flow run first (abc)", heartbeat_s=3600) as held:
        with pytest.raises(RunBusyError, match=r"run r1 is being written by .*flow run first \(abc\) \(pid \d+ on "):
            acquire_lease(store, "r1", "second")
        with hold_lease(store, "r2", "other run", heartbeat_s=3600):  # other run ids are not blocked
            pass
        assert read_lease(store, "r1")[0].token == held.lease.token
    assert read_lease(store, "r1") is None  # released: nothing left behind
    assert store.list_dir("") == []  # the lease is hidden: `runs list` shows no run for it
    with hold_lease(store, "r1", "second", heartbeat_s=3600):
        pass


def test_a_heartbeat_renews_and_a_taken_over_holder_learns_it_lost(store):
    held = acquire_lease(store, "r1", "first", heartbeat_s=3600)
    before = read_lease(store, "r1")[0].heartbeat_at
    assert held.renew() and read_lease(store, "r1")[0].heartbeat_at >= before
    taker = acquire_lease(store, "r1", "operator", take_over=True, heartbeat_s=3600)
    assert taker.taken_from.token == held.lease.token
    assert not held.renew()  # its conditional write no longer matches
    with pytest.raises(LeaseLostError, match="taken by .*operator"):
        held.check()
    held.release()  # must not delete the new holder's lease
    assert read_lease(store, "r1")[0].token == taker.lease.token
    taker.release()


def test_a_killed_holder_on_this_host_frees_the_lease_at_once(store, tmp_path):
    """A real process takes the lease and is SIGKILLed: the next writer takes it without waiting."""
    script = tmp_path / "holder.py"
    script.write_text(
        "import os, signal, sys\n"
        "from tailflow.engines.store import open_store, S3Store\n"
        "from tailflow.engines.runs.lease import acquire_lease\n"
        f"store = {'S3Store(%r, %r)' % (store.bucket, store.prefix) if isinstance(store, S3Store) else 'open_store(%r)' % str(store.root)}\n"
        "acquire_lease(store, 'r1', 'doomed', heartbeat_s=3600)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.run([sys.executable, str(script)], env=dict(os.environ), capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    dead = read_lease(store, "r1")[0]
    assert dead.holder.endswith("doomed") and dead.pid != os.getpid()
    held = acquire_lease(store, "r1", "resumer", heartbeat_s=3600)  # no take_over, no waiting
    assert held.taken_from.pid == dead.pid
    held.release()


def test_a_holder_on_another_host_blocks_until_its_heartbeat_times_out(store):
    forge(store, "r1", host="node-7", timeout_s=60.0)
    with pytest.raises(RunBusyError, match="on node-7.*frees itself after 60s without a heartbeat"):
        acquire_lease(store, "r1", "resumer")
    forge(store, "r1", host="node-7", timeout_s=1.0)
    time.sleep(2.2)  # the store's clock (S3: LastModified, whole seconds) must see it older than its timeout
    held = acquire_lease(store, "r1", "resumer", heartbeat_s=3600)
    assert held.taken_from.host == "node-7"
    held.release()


def test_racing_writers_exactly_one_wins(store):
    """Eight threads race for a free lease, then eight for a stale one: one winner each time."""
    def race() -> list:
        winners, barrier = [], threading.Barrier(8)

        def contender(n: int) -> None:
            barrier.wait()
            try:
                winners.append(acquire_lease(store, "r1", f"contender {n}", heartbeat_s=3600))
            except RunBusyError:
                pass
        threads = [threading.Thread(target=contender, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return winners

    (first,) = race()
    first._stop.set()  # its holder "dies": no release, and a lease from another host with a lapsed heartbeat
    forge(store, "r1", host="node-7", timeout_s=0.0)
    time.sleep(1.1)
    (second,) = race()
    assert second.taken_from.host == "node-7"
    second.release()


def store_uri(store) -> str:
    return f"s3://{store.bucket}/{store.prefix}" if isinstance(store, S3Store) else str(store.root)


@pytest.mark.slow
def test_the_flow_refuses_a_second_writer_before_writing_anything(store, prefect_api):
    """Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~2 s."""
    from tailflow.driver.inputs import shipped_warmstart_dir
    from tailflow.flows.training import rl_training

    with hold_lease(store, "busy", "flow run first (abc)", heartbeat_s=3600):
        with pytest.raises(RunBusyError, match="run busy is being written by .*flow run first"):
            rl_training(overrides=[f"model.path={shipped_warmstart_dir()}", f"storage.uri={store_uri(store)}",
                                   "data.num_train=16", "data.num_eval=4"], run_id="busy")
    assert store.list_dir("") == []  # no run directory


@pytest.mark.slow
def test_the_cli_refuses_a_second_writer_in_one_line(tmp_path):
    """Costs ~25 s here (one `tailflow train` process, whose imports and start-up are most of it, refused by the
    held lease): the one-line refusal and the exit code are the CLI's, so they need the CLI's own process."""
    from tailflow.driver.inputs import shipped_warmstart_dir

    store = LocalStore(tmp_path / "runs")
    with hold_lease(store, "busy", "flow run first (abc)", heartbeat_s=3600):
        result = subprocess.run([sys.executable, "-m", "tailflow.cli", "train", "--run-id", "busy",
                                 "--set", f"model.path={shipped_warmstart_dir()}", "--set", f"storage.uri={store.root}",
                                 "--set", "data.num_train=16", "--set", "data.num_eval=4"],
                                capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [line for line in result.stderr.strip().splitlines()
                                                  if line.startswith("tailflow: error: run busy is being written by")]
    assert "--take-over" in result.stderr and store.list_dir("") == []
