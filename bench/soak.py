"""Kill soak: a seeded run on S3 SIGKILLed again and again at random moments, resumed each time, must end exactly
where an uninterrupted run with the same seed ends.

Setup: a moto S3 server over HTTP with the tests' fault proxy in front of it
(the runs talk to the proxy), a real Prefect server (the one PREFECT_API_URL
names, else one started here), and `tailflow train` as
separate processes, each in its own session so a kill takes its Ray workers
with it. First an uninterrupted reference run; then the soak run, launched
again after every kill. Kills are drawn from a seeded generator, three kinds:
- timer: SIGKILL a random 0-3 s after the run says it started or resumed
  (lands in any phase);
- fault point: TAILFLOW_FAULT=crash-<phase>@<iteration> with a random phase,
  including `checkpoint` (stored, not committed) and `commit` (state stored,
  `latest.json` not);
- upload: the proxy stalls the next checkpoint PUT and the run is killed in
  the middle of that S3 upload (some files stored, no manifest).
A kill counts as survived when the commit left behind is readable and equals
the reference's at that iteration (metrics rows outside `time/*`, and the
checkpoint's weights_sha256), and the next launch was not refused (the dead
holder's lease freed at once: the launch after a kill is the one judged). The final run must equal the reference
(weights_sha256 and every row); if it does not, no kill counts.

    python bench/soak.py [--kills 10] [--iterations 10] [--seed 0] [--quick]
Last line: RESULT kills_survived=<n>/<kills>
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fault proxy and the Prefect server helper the tests use

from prefect_server import running_server  # noqa: E402
from s3_faults import FOREVER, FaultProxy  # noqa: E402

PHASES = ("rollout", "reward", "train", "sync", "checkpoint", "commit")
BUCKET = "soak"


@dataclass(frozen=True)
class Kill:
    kind: str
    """timer, fault or upload"""
    delay_s: float = 0.0
    fault: str = ""


def run_config(iterations: int, storage: str, quick: bool) -> dict:
    """Tiny and seeded: one rollout worker (bit for bit), two FSDP ranks (--quick: one, and one reward worker,
    the smoke test's fewest actors to start per launch), tail batching continuing its deferred prompts as
    configs/default.yaml does (the queue and the responses it carries cross commits; decoupled_ppo, which
    continued tokens from older weights need)."""
    from tailflow.driver.inputs import shipped_warmstart_dir

    config = {"model": {"path": str(shipped_warmstart_dir())},
              "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
              "rollout": {"n": 4, "max_new_tokens": 24, "num_slots": 16},
              "train": {"iterations": iterations, "eval_every": 5, "num_workers": 2, "lr": 1e-3,
                        "loss": "decoupled_ppo"},
              "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5, "continue_deferred": True},
              "storage": {"uri": storage}, "tracking": {"report_every": 0}}
    if quick:
        config["train"]["num_workers"] = 1
        config["reward"] = {"max_workers": 1}
    return config


def draw_kills(rng: random.Random, count: int) -> list[Kill]:
    kinds = [("timer", "fault", "upload")[i % 3] for i in range(count)]
    rng.shuffle(kinds)
    return [Kill(kind, delay_s=rng.uniform(0.0, 3.0), fault=f"crash-{rng.choice(PHASES)}@{{iteration}}")
            for kind in kinds]


STALL_S = 240
"""A launch that prints nothing for this long is stalled (a healthy one prints a line per phase within seconds;
a run whose workers died, say killed for memory, can wait on them for many minutes): the soak fails at once."""


class Stalled(RuntimeError):
    """A launch went quiet for STALL_S seconds, or an awaited event never came: the soak cannot judge the kill."""


class Launch:
    """`tailflow train` in its own session; its output read line by line in a thread."""

    def __init__(self, args: list[str], env: dict):
        self.process = subprocess.Popen([sys.executable, "-m", "tailflow.cli", *args], env=env, cwd=REPO,
                                        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self) -> str | None:
        """The next line printed (None once the process closed its output); Stalled after STALL_S quiet seconds."""
        try:
            line = self.lines.get(timeout=STALL_S)
        except queue.Empty:
            self.kill()
            raise Stalled(f"no output for {STALL_S} s; the last lines:\n{''.join(self.output[-30:])}") from None
        if line is not None:
            self.output.append(line)
        return line

    def wait_for(self, text: str) -> bool:
        """True once a line holding `text` was printed; False if the process ended first."""
        while (line := self.next_line()) is not None:
            if text in line:
                return True
        return False

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self) -> int:
        """The exit code, once the output is closed (a SIGKILLed or ended run); Stalled if it goes quiet first."""
        while self.next_line() is not None:
            pass
        code = self.process.wait()
        self.kill()  # whatever the driver started dies with it, as on a lost node
        return code


def committed_view(store, run_id: str):
    """(iterations committed, weights_sha256, rows of the committed iterations without time/*)."""
    from tailflow.engines.runs.commit import read_committed_state
    from tailflow.engines.track.metrics import without_timing

    state = read_committed_state(store, run_id)
    if state is None:
        return 0, None, []
    text = store.read_text(f"{run_id}/metrics.jsonl") if store.exists(f"{run_id}/metrics.jsonl") else ""
    rows = [without_timing(json.loads(line)) for line in text.splitlines() if line.strip()]
    return state.iteration, state.weights_sha256, [row for row in rows if row["iteration"] < state.iteration]


def reference_sha(store, iteration: int) -> str | None:
    from tailflow.engines.runs.layout import state_key

    if iteration == 0:
        return None
    return json.loads(store.read_text(state_key("clean", iteration - 1)))["weights_sha256"]


def soak(args, store, proxy: FaultProxy, env: dict, config_path: Path) -> tuple[int, bool]:
    rng = random.Random(args.seed)
    train = ["train", "-c", str(config_path), "--run-id", "soak"]
    clean = Launch(["train", "-c", str(config_path), "--run-id", "clean"], env)
    assert clean.finish() == 0, "".join(clean.output[-40:])
    _, clean_sha, clean_rows = committed_view(store, "clean")
    print(f"reference run: {len(clean_rows)} iterations, weights_sha256 {clean_sha[:16]}...", flush=True)

    survived = 0
    for number, kill in enumerate(draw_kills(rng, args.kills), start=1):
        committed = committed_view(store, "soak")[0]
        if committed >= args.iterations:
            print(f"kill {number}: the run already finished; no kill possible", flush=True)
            continue
        fault = kill.fault.format(iteration=min(committed + rng.randint(0, 1), args.iterations - 1))
        launch = Launch(train, dict(env, TAILFLOW_FAULT=fault) if kill.kind == "fault" else env)
        started = launch.wait_for("[tailflow] run soak")
        refused = any("is being written by" in line for line in launch.output)
        if kill.kind == "timer" and started:
            time.sleep(kill.delay_s)
        elif kill.kind == "upload" and started:
            proxy.inject("stall", FOREVER, method="PUT", path_part="/checkpoints/")
            deadline = time.time() + STALL_S
            while proxy.faults_served == 0 and launch.process.poll() is None:
                if time.time() > deadline:
                    launch.kill()
                    raise Stalled(f"kill {number}: no checkpoint upload within {STALL_S} s of the start")
                time.sleep(0.05)
        if kill.kind != "fault":
            launch.kill()
        code = launch.finish()
        proxy.inject(None, 0)
        after, sha, rows = committed_view(store, "soak")  # raises if the commit is unreadable
        equal = rows == clean_rows[:after] and sha == reference_sha(store, after)
        ok = code == -signal.SIGKILL and equal and not refused
        survived += ok
        what = {"timer": f"timer {kill.delay_s:.1f}s", "fault": fault, "upload": "stalled checkpoint upload"}[kill.kind]
        print(f"kill {number} ({what}): exit {code}, committed {committed} -> {after}, "
              f"equal to reference: {equal}, {'survived' if ok else 'NOT survived'}", flush=True)
    final = Launch(train, env)
    code = final.finish()
    after, sha, rows = committed_view(store, "soak")
    final_equal = code == 0 and after == args.iterations and sha == clean_sha and rows == clean_rows
    refused = any("is being written by" in line for line in final.output)
    print(f"final run: exit {code}, {after} iterations, weights_sha256 equal: {sha == clean_sha}, "
          f"rows equal: {rows == clean_rows}, refused: {refused}", flush=True)
    return survived, final_equal and not refused


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 kills over a 3-iteration run (smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.iterations = 3, 3
    import boto3
    import yaml
    from moto.server import ThreadedMotoServer

    from tailflow.engines.store import S3Store

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    proxy = FaultProxy(*moto.get_host_and_port()).start()
    aws = {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(aws)
    direct = "http://%s:%d" % moto.get_host_and_port()
    boto3.client("s3", endpoint_url=direct).create_bucket(Bucket=BUCKET)
    store = S3Store(BUCKET, "runs", client=boto3.client("s3", endpoint_url=direct))  # reads bypass the proxy
    work = Path(tempfile.mkdtemp(prefix="tailflow-soak-"))
    config_path = work / "run.yaml"
    config_path.write_text(yaml.safe_dump(run_config(args.iterations, f"s3://{BUCKET}/runs", args.quick)))
    (work / "prefect").mkdir()
    started = time.time()
    # A Prefect server already named in PREFECT_API_URL (the test session's) is used as it is; else one of its own.
    given = os.environ.get("PREFECT_API_URL")
    server_here = contextlib.nullcontext({"env": dict(os.environ)}) if given else running_server(work / "prefect")
    try:
        with server_here as server:
            env = dict(server["env"], AWS_ENDPOINT_URL=proxy.url, **aws)
            env.pop("TAILFLOW_FAULT", None)
            survived, final_ok = soak(args, store, proxy, env, config_path)
    except Stalled as stall:
        print(f"STALLED after {time.time() - started:.0f}s: {stall}\nRESULT kills_survived=0/{args.kills}")
        return 1
    finally:
        proxy.stop()
        moto.stop()
    print(f"{args.kills} kills over a {args.iterations}-iteration run in {time.time() - started:.0f}s; "
          f"final run equal to the uninterrupted one: {final_ok}")
    print(f"RESULT kills_survived={survived if final_ok else 0}/{args.kills}")
    return 0 if final_ok and survived == args.kills else 1


if __name__ == "__main__":
    sys.exit(main())
