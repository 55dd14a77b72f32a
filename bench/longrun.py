"""A multi-day run, compressed: a thousand micro iterations against a real Prefect server and S3, with faults on
the way, sampling what could grow (issue 42).

Setup: a moto S3 server behind the tests' fault proxy (the run talks to the proxy), a Prefect server of the bench's
own (tests/prefect_server.PrefectServer: it can be stopped and started again on the same port and database), and
`tailflow train` as a process of its own. The micro configuration takes about a second an iteration here and runs
the default's code paths: tail batching continuing its deferred prompts, asynchronous rounds (decoupled_ppo),
streamed scoring, a commit with a checkpoint on S3 each iteration, the report every 100 iterations, a Prefect
subflow and artifacts per iteration. Beside it, the same configuration runs without faults on a local store and
Prefect's ephemeral server: the reference its metrics must equal (rows without `time/*`, and the final weights).

Faults, at seeded iterations (fractions of the run): the Prefect server stopped for 60 s and started again
(twice), S3 refusing every request for 30 s (the proxy answers 503 SlowDown), a rollout worker's process SIGKILLed
(the elastic group replaces it), and the run SIGKILLed and launched again with the same run id (what Retry on
the flow run does: the run resumes from its last commit). A fault counts as survived when the run went on past it
and its commit after it is readable.

Every `--memory-every` iterations: RSS and open descriptors of the driver, of each Ray actor (by class: rollout,
trainer, reward) and of the Prefect server (with its children), and the events the server has received. Every
`--sample-every` iterations also: the Prefect database's size; the run's store size on S3; an iteration's wall
time (the median time between the run's last 11 iteration lines: its rollout, training, commit to S3 and
artifacts; it grows if a commit's cost grows with the run); the time to redraw the report (`write_report`, here,
against the run's S3 store). Slopes are least squares per 100
iterations after the warm-up (the first 20% of the run's iterations from each process's first sample; a Prefect
server's warm-up also lasts until that life of it has received `SEEN_EVENTS_CACHE` events), per process, each
process over the samples of its own lifetime; a process's RSS slope is fitted to its least sample in each
`--sample-every` iterations (`floors`: what it holds between iterations, not a peak inside one), and the slope over
every sample is printed beside it. The samples are kept in the work directory's samples.jsonl;
`--refit WORK` prints the memory slopes again from them.

    python bench/longrun.py [--iterations 1000] [--memory-every 5] [--sample-every 25] [--seed 0] [--quick]
                            [--no-faults] [--out DIR] [--refit WORK]
Last line: RESULT iterations=<n> rss_slope_mb_per_100=<largest> fds_slope_per_100=<largest>
           faults_survived=<k>/<n> metrics_equal=<yes|no> report_redraw_ratio=<end / at iteration 100>
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fault proxy and the Prefect server the tests use

from prefect_server import PrefectServer  # noqa: E402
from s3_faults import FOREVER, FaultProxy  # noqa: E402

BUCKET = "longrun"
RUN_ID = "long"
ITERATION_LINE = re.compile(r"\[tailflow\] iter (\d{4}) \|")
ROLES = {"RolloutWorker": "rollout", "TrainerWorker": "trainer", "RewardWorker": "reward"}
FAULT_KEYS = ("rollout/num_workers", "rollout/migrated_requests", "rollout/migrated_tokens", "iteration/attempt")
"""Metrics that count the faults themselves (a worker replaced, requests moved, an iteration run again): left out
of the comparison with the fault-free run, as `time/*` is."""
SEEN_EVENTS_CACHE = 10_000
"""Prefect 3.8's server remembers the ids of the last 10,000 events it has seen, in fixed-size caches
(`prefect/server/events/ordering/memory.py`): its memory grows until a life of it has received that many events
(~35 per micro iteration: its ~290th iteration), then those caches stop growing. The bench counts that filling as
the server's warm-up, and prints the server's slope with the plain warm-up too."""


def micro_config(iterations: int, storage: str) -> dict:
    from tailflow.driver.inputs import shipped_warmstart_dir

    return {"model": {"path": str(shipped_warmstart_dir())},
            "data": {"num_train": 64, "num_eval": 4, "prompts_per_step": 2},
            "rollout": {"n": 2, "max_new_tokens": 8, "num_slots": 8},
            "train": {"iterations": iterations, "eval_every": 100000, "num_workers": 1, "lr": 1e-3,
                      "loss": "decoupled_ppo"},
            "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 3, "continue_deferred": True},
            "reward": {"max_workers": 1},
            "storage": {"uri": storage, "keep_last": 2, "keep_every": 100},
            "tracking": {"report_every": 100}}


# ---- processes: what /proc says ---------------------------------------------------------------------------------

def children_of() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(parent, []).append(int(entry))
    return tree


def descendants(pid: int, tree: dict[int, list[int]]) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, []))
    return found


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, its anonymous part) in MB: RSS also counts the file-backed pages of code and libraries a process
    touches; the anonymous part is its heaps, where a leak shows."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "RssAnon:")):
                found[line.split(":")[0]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found.get("VmRSS", 0.0), found.get("RssAnon", 0.0)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample_processes(driver: int, server: int | None) -> dict[str, tuple[float, float, int]]:
    """name -> (RSS MB, anonymous MB, open fds): the driver, each actor and the Prefect server with its children,
    each named by role and pid, so a process started again (the run relaunched, a worker replaced, the server
    restarted) is a series of its own."""
    tree = children_of()
    found = {f"driver:{driver}": (*memory_mb(driver), open_fds(driver))}
    for pid in descendants(driver, tree)[1:]:
        line = cmdline(pid)
        for marker, role in ROLES.items():
            if line.startswith(f"ray::{marker}"):
                found[f"{role}:{pid}"] = (*memory_mb(pid), open_fds(pid))
    if server is not None:
        pids = descendants(server, tree)
        rss, anon = zip(*(memory_mb(p) for p in pids))
        found[f"prefect-server:{server}"] = (sum(rss), sum(anon), sum(open_fds(p) for p in pids))
    return found


# ---- the run ----------------------------------------------------------------------------------------------------

class Launch:
    """`tailflow train` in its own session; its iteration lines read in a thread."""

    def __init__(self, args: list[str], env: dict, log: Path):
        self.process = subprocess.Popen([sys.executable, "-m", "tailflow.cli", *args], env=env, cwd=REPO,
                                        start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        self.iterations: queue.Queue[int | None] = queue.Queue()
        self.line_times: list[float] = []
        """When each iteration line came: the last ones give an iteration's wall time."""
        self.log = open(log, "a")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.log.write(line)
            found = ITERATION_LINE.search(line)
            if found:
                self.line_times.append(time.monotonic())
                self.iterations.put(int(found.group(1)))
        self.log.flush()
        self.iterations.put(None)

    def iteration_s(self) -> float:
        """The median time between the last 11 iteration lines (a fault's pause is one outlier among them)."""
        gaps = sorted(b - a for a, b in zip(self.line_times[-11:], self.line_times[-10:]))
        return gaps[len(gaps) // 2] if gaps else float("nan")

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Fault:
    at: int
    kind: str
    """server (down 60 s), s3 (down 30 s), worker (a rollout worker SIGKILLed) or run (SIGKILL, launched again)"""
    fired_at: int | None = None
    survived: bool = False


@dataclass
class Samples:
    iterations: list[int] = field(default_factory=list)
    """Where memory was sampled (every `--memory-every`): `processes` and `server_events` are indexed like it."""
    processes: list[dict[str, tuple[float, float, int]]] = field(default_factory=list)
    full_at: list[int] = field(default_factory=list)
    """Where the rest was sampled (every `--sample-every`): `db_mb`, `store_mb`, `report_s` and `iteration_s` are
    indexed like it."""
    db_mb: list[float] = field(default_factory=list)
    store_mb: list[float] = field(default_factory=list)
    report_s: list[float] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)
    server_events: list[int] = field(default_factory=list)
    """Events the Prefect server received in its current life (since its last start), at each sample."""


def store_mb(client, prefix: str) -> float:
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        total += sum(item["Size"] for item in page.get("Contents", []))
    return total / 2**20


def db_mb(home: Path) -> float:
    return sum(path.stat().st_size for path in home.glob("*.db*")) / 2**20


def events_in_db(home: Path) -> int:
    """How many events the Prefect server has stored (it stores every event it receives, for 7 days)."""
    with closing(sqlite3.connect(f"file:{home / 'prefect.db'}?mode=ro", uri=True, timeout=30)) as db:
        return db.execute("SELECT count(*) FROM events").fetchone()[0]


def redraw_seconds(store) -> float:
    from tailflow.engines.track.report import write_report

    started = time.perf_counter()
    write_report(store, RUN_ID)
    return time.perf_counter() - started


def kill_a_rollout_worker(driver: int) -> bool:
    tree = children_of()
    for pid in descendants(driver, tree)[1:]:
        if cmdline(pid).startswith("ray::RolloutWorker"):
            os.kill(pid, signal.SIGKILL)
            return True
    return False


def draw_faults(rng: random.Random, iterations: int) -> list[Fault]:
    """Six faults spread over the run after its first tenth, in a seeded order."""
    kinds = ["server", "s3", "worker", "server", "run", "worker"]
    rng.shuffle(kinds)
    slots = [int(iterations * (0.1 + 0.8 * (i + rng.random() * 0.5) / len(kinds))) for i in range(len(kinds))]
    return [Fault(at, kind) for at, kind in zip(slots, kinds)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--sample-every", type=int, default=25)
    parser.add_argument("--memory-every", type=int, default=5,
                        help="RSS and descriptors are cheap to read: sampled more often, a slope's noise is smaller "
                             "(the Prefect server's RSS swings by ~3 MB between samples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="60 iterations, short faults: a smoke run")
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--refit", type=Path, metavar="WORK",
                        help="only print the memory slopes of a finished run's work directory (its samples.jsonl)")
    args = parser.parse_args()
    if args.refit:
        if not (args.refit / "samples.jsonl").is_file():
            parser.error(f"--refit: {args.refit / 'samples.jsonl'} does not exist (the work directory a run printed)")
        return refit(args)
    args.out.mkdir(parents=True, exist_ok=True)  # the plot goes there: a missing folder must not lose the report
    server_down_s, s3_down_s = (60.0, 30.0)
    if args.quick:
        args.iterations, args.sample_every, args.memory_every, server_down_s, s3_down_s = 60, 5, 1, 10.0, 5.0

    import boto3
    import yaml
    from moto.server import ThreadedMotoServer

    from tailflow.engines.store import S3Store

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    proxy = FaultProxy(*moto.get_host_and_port()).start()
    aws = {"AWS_ACCESS_KEY_ID": "longrun", "AWS_SECRET_ACCESS_KEY": "longrun", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(aws)
    direct = "http://%s:%d" % moto.get_host_and_port()
    client = boto3.client("s3", endpoint_url=direct)
    client.create_bucket(Bucket=BUCKET)
    store = S3Store(BUCKET, "runs", client=boto3.client("s3", endpoint_url=direct))
    work = Path(tempfile.mkdtemp(prefix="tailflow-longrun-"))
    (work / "prefect").mkdir()
    (work / "run.yaml").write_text(yaml.safe_dump(micro_config(args.iterations, f"s3://{BUCKET}/runs")))
    (work / "reference.yaml").write_text(yaml.safe_dump(micro_config(args.iterations, str(work / "reference"))))
    print(f"work directory {work}", flush=True)

    reference_env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "TAILFLOW_FAULT")}
    reference_env["PREFECT_HOME"] = str(work / "reference-prefect")
    reference = Launch(["train", "-c", str(work / "reference.yaml"), "--run-id", RUN_ID], reference_env,
                       work / "reference.log")

    server = PrefectServer(work / "prefect").start()
    events_at_start = events_in_db(work / "prefect")
    env = dict(server.env, AWS_ENDPOINT_URL=proxy.url, **aws)
    env.pop("TAILFLOW_FAULT", None)
    faults = [] if args.no_faults else draw_faults(random.Random(args.seed), args.iterations)
    print("faults: " + ", ".join(f"{f.kind}@{f.at}" for f in faults), flush=True)
    samples = Samples()
    started = time.time()
    run_args = ["train", "-c", str(work / "run.yaml"), "--run-id", RUN_ID]
    launch = Launch(run_args, env, work / "run.log")
    pending = sorted(faults, key=lambda f: f.at)
    last = -1
    try:
        while True:
            try:
                iteration = launch.iterations.get(timeout=900)
            except queue.Empty:
                print("STALLED: no iteration line for 900 s", flush=True)
                launch.kill()
                break
            if iteration is None:
                code = launch.process.wait()
                if code == 0:
                    break
                print(f"the run ended with exit {code}; see {work / 'run.log'}", flush=True)
                break
            last = iteration
            for fault in faults:
                if fault.fired_at is not None and iteration > fault.fired_at:
                    fault.survived = True  # an iteration after it committed (its line comes after the commit)
            final = iteration == args.iterations - 1
            if iteration % args.memory_every == 0 or final:
                samples.iterations.append(iteration)
                samples.processes.append(sample_processes(launch.process.pid, server.pid))
                samples.server_events.append(events_in_db(work / "prefect") - events_at_start)
                kept = {"iteration": iteration, "processes": samples.processes[-1],
                        "server_events": samples.server_events[-1]}
                if iteration % args.sample_every == 0 or final:
                    samples.full_at.append(iteration)
                    samples.db_mb.append(db_mb(work / "prefect"))
                    samples.store_mb.append(store_mb(client, f"runs/{RUN_ID}/"))
                    samples.iteration_s.append(launch.iteration_s())
                    samples.report_s.append(redraw_seconds(store) if iteration >= 100 or args.quick else float("nan"))
                    kept.update(db_mb=samples.db_mb[-1], store_mb=samples.store_mb[-1])
                    memory = {name: round(rss, 1) for name, (rss, _, _) in samples.processes[-1].items()}
                    print(f"[{time.time() - started:6.0f}s] iter {iteration}: RSS MB {memory}; db "
                          f"{samples.db_mb[-1]:.1f} MB; store {samples.store_mb[-1]:.1f} MB; iteration "
                          f"{samples.iteration_s[-1]:.2f}s; report {samples.report_s[-1]:.2f}s", flush=True)
                with open(work / "samples.jsonl", "a") as kept_file:  # to redraw or re-fit after the run
                    kept_file.write(json.dumps(kept) + "\n")
            while pending and pending[0].at <= iteration:
                fault = pending.pop(0)
                fault.fired_at = iteration
                print(f"[{time.time() - started:6.0f}s] fault at iteration {iteration}: {fault.kind}", flush=True)
                if fault.kind == "server":
                    server.stop()
                    time.sleep(server_down_s)
                    server.start()
                    events_at_start = events_in_db(work / "prefect")
                elif fault.kind == "s3":
                    proxy.inject("503", FOREVER)
                    time.sleep(s3_down_s)
                    proxy.inject(None, 0)
                elif fault.kind == "worker":
                    kill_a_rollout_worker(launch.process.pid)
                elif fault.kind == "run":
                    launch.kill()
                    launch.process.wait()
                    while launch.iterations.get() is not None:
                        pass
                    launch = Launch(run_args, env, work / "run.log")  # the same run id: it resumes
    except BaseException:
        reference.kill()
        launch.kill()
        raise
    finally:
        server.stop()
        proxy.stop()
    reference_code = reference.process.wait()
    wall = time.time() - started
    verdict_parts = report(args, samples, faults, store, work, reference_code, last, wall)
    moto.stop()
    return verdict_parts


def slope_per_100(xs: list[int], ys: list[float]) -> float:
    if len(xs) < 3:
        return 0.0
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    return 100 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var if var else 0.0


def floors(xs: list[int], ys: list[float], block: int) -> tuple[list[int], list[float]]:
    """The least sample of each `block` iterations (where it was taken, and its value): what a process holds
    between its iterations. A sample lands at a random moment of an iteration, and a process's peak inside one
    (the trainer's ~34 MB while it takes its step) is not growth; fitted to every sample, a few peaks late in a
    window tilt the line (2026-11-29: the trainer's samples between its steps stayed at 565-568 MB from iteration
    200 to 690, those inside a step read ~599, and its slope over every sample read +0.89 to +1.30 per 100 as the
    window grew by ten iterations; over the floors, +0.14)."""
    least: dict[int, tuple[int, float]] = {}
    for x, y in zip(xs, ys):
        if x // block not in least or y < least[x // block][1]:
            least[x // block] = (x, y)
    kept = [least[key] for key in sorted(least)]
    return [x for x, _ in kept], [y for _, y in kept]


def series(samples: Samples, warm: int, server_warm_events: int = 0
           ) -> dict[str, tuple[list[int], list[float], list[float], list[int]]]:
    """Each process's samples from `warm` iterations after its first sample on: a process started mid-run (the
    run relaunched, a worker replaced) warms up as the first ones did, loading what it loads once (the report's
    plotting library at its first report, its engine's buffers at its first rounds). A Prefect server's samples
    also wait until that life of it has received `server_warm_events` events."""
    found: dict[str, tuple[list[int], list[float], list[float], list[int]]] = {}
    born: dict[str, int] = {}
    for iteration, processes, events in zip(samples.iterations, samples.processes, samples.server_events):
        for name, (rss, anon, fds) in processes.items():
            if iteration < born.setdefault(name, iteration) + warm:
                continue
            if name.startswith("prefect-server") and events < server_warm_events:
                continue
            xs, rs, anons, fs = found.setdefault(name, ([], [], [], []))
            xs.append(iteration)
            rs.append(rss)
            anons.append(anon)
            fs.append(fds)
    return found


def committed_rows(store, run_id: str) -> list[dict]:
    from tailflow.engines.track.metrics import without_timing

    if not store.exists(f"{run_id}/metrics.jsonl"):
        return []
    return [{key: value for key, value in without_timing(json.loads(line)).items() if key not in FAULT_KEYS}
            for line in store.read_text(f"{run_id}/metrics.jsonl").splitlines() if line.strip()]


def memory_report(args, samples: Samples) -> tuple[float, float]:
    """Print each process's RSS and descriptor slopes after its warm-up; (the largest RSS slope, the largest
    descriptor slope). The RSS slope is fitted to the floor of each `--sample-every` iterations (`floors`); the
    slope over every sample is printed beside it."""
    warm = int(0.2 * args.iterations)
    span = 4 * args.sample_every
    per_process = {name: values for name, values in series(samples, warm, SEEN_EVENTS_CACHE).items()
                   if values[0][-1] - values[0][0] >= span}
    """A process sampled over fewer than `span` iterations after its warm-up (a replaced worker's short life) has no
    slope: over a short span the samples' noise is most of it."""
    plain_warm_up = {name: values for name, values in series(samples, warm).items()
                     if name.startswith("prefect-server") and values[0][-1] - values[0][0] >= span}
    rss_slopes = {name: slope_per_100(*floors(xs, rs, args.sample_every))
                  for name, (xs, rs, _, _) in per_process.items()}
    every_sample = {name: slope_per_100(xs, rs) for name, (xs, rs, _, _) in per_process.items()}
    anon_slopes = {name: slope_per_100(*floors(xs, anons, args.sample_every))
                   for name, (xs, _, anons, _) in per_process.items()}
    fd_slopes = {name: slope_per_100(xs, fs) for name, (xs, _, _, fs) in per_process.items()}
    print(f"\nafter warm-up ({warm} iterations from each process's first sample; for the Prefect server, also until "
          f"that life of it has received {SEEN_EVENTS_CACHE} events), least-squares slopes per 100 iterations (RSS: "
          f"of the least sample in each {args.sample_every} iterations; beside it, of every sample):")
    for name in sorted(per_process):
        xs, rs, _, fs = per_process[name]
        print(f"  {name:22} RSS {rs[0]:7.1f} -> {rs[-1]:7.1f} MB, slope {rss_slopes[name]:+6.2f} MB (every sample "
              f"{every_sample[name]:+6.2f}, anonymous {anon_slopes[name]:+6.2f}); fds {fs[0]:4d} -> {fs[-1]:4d}, "
              f"slope {fd_slopes[name]:+6.2f}  (iterations {xs[0]}..{xs[-1]}, {len(xs)} samples)")
    for name, (xs, rs, _, _) in sorted(plain_warm_up.items()):
        if name not in per_process:
            print(f"  {name:22} never sampled over {span} iterations after {SEEN_EVENTS_CACHE} events in one life: "
                  "no slope")
        print(f"  {name:22} with the plain warm-up only: RSS {rs[0]:7.1f} -> {rs[-1]:7.1f} MB, slope "
              f"{slope_per_100(*floors(xs, rs, args.sample_every)):+6.2f} MB (every sample "
              f"{slope_per_100(xs, rs):+6.2f}; iterations {xs[0]}..{xs[-1]}, {len(xs)} samples)")
    if not per_process:
        print(f"  no process was sampled over {span} iterations after its warm-up: no slopes (run longer)")
    return max(rss_slopes.values(), default=float("nan")), max(fd_slopes.values(), default=float("nan"))


def refit(args) -> int:
    """`--refit WORK`: the memory slopes again, from a finished run's `WORK/samples.jsonl` (the rest of the
    report needs the run)."""
    samples = Samples()
    for line in (args.refit / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        samples.iterations.append(row["iteration"])
        samples.processes.append({name: tuple(values) for name, values in row["processes"].items()})
        samples.server_events.append(row["server_events"])
    largest_rss, largest_fds = memory_report(args, samples)
    print(f"REFIT iterations={samples.iterations[-1] + 1} rss_slope_mb_per_100={largest_rss:.2f} "
          f"fds_slope_per_100={largest_fds:.2f}")
    return 0


def report(args, samples: Samples, faults: list[Fault], store, work: Path, reference_code: int, last: int,
           wall: float) -> int:
    from tailflow.engines.runs.commit import read_committed_state
    from tailflow.engines.store import LocalStore

    warm = int(0.2 * args.iterations)
    largest_rss, largest_fds = memory_report(args, samples)
    after = [(i, d, s) for i, d, s in zip(samples.full_at, samples.db_mb, samples.store_mb) if i >= warm]
    db_slope = slope_per_100([i for i, _, _ in after], [d for _, d, _ in after])
    store_slope = slope_per_100([i for i, _, _ in after], [s for _, _, s in after])
    print(f"  Prefect database: {samples.db_mb[0]:.1f} -> {samples.db_mb[-1]:.1f} MB, {db_slope:+.2f} MB per 100 "
          f"iterations ({1024 * db_slope / 100:.1f} KB per iteration)")
    print(f"  run store on S3: {samples.store_mb[0]:.1f} -> {samples.store_mb[-1]:.1f} MB, {store_slope:+.2f} MB per "
          f"100 iterations ({1024 * store_slope / 100:.1f} KB per iteration)")
    steps = [(i, s) for i, s in zip(samples.full_at, samples.iteration_s) if i >= warm and s > 0]
    if steps:
        print(f"  iteration wall time: {steps[0][1]:.2f} s at iteration {steps[0][0]}, {steps[-1][1]:.2f} s at the end "
              f"(x{steps[-1][1] / steps[0][1]:.2f}; slope {slope_per_100(*map(list, zip(*steps))):+.3f} s per 100)")
    redraws = [(i, s) for i, s in zip(samples.full_at, samples.report_s) if s == s]
    first = next((s for i, s in redraws if i >= 100), redraws[0][1] if redraws else float("nan"))
    redraw_ratio = redraws[-1][1] / first if redraws else float("nan")
    print(f"  report redraw: {first:.2f} s at iteration {redraws[0][0] if redraws else '-'}, "
          f"{redraws[-1][1] if redraws else float('nan'):.2f} s at the end (x{redraw_ratio:.2f})")

    state = read_committed_state(store, RUN_ID)
    expected = read_committed_state(LocalStore(work / "reference"), RUN_ID)
    rows, expected_rows = committed_rows(store, RUN_ID), committed_rows(LocalStore(work / "reference"), RUN_ID)
    equal = (state is not None and expected is not None and reference_code == 0 and rows == expected_rows
             and state.weights_sha256 == expected.weights_sha256 and state.iteration == args.iterations)
    if not equal and rows and expected_rows:
        differing = next((i for i, (a, b) in enumerate(zip(rows, expected_rows)) if a != b), None)
        keys = sorted(k for k in rows[differing].keys() | expected_rows[differing].keys()
                      if rows[differing].get(k) != expected_rows[differing].get(k)) if differing is not None else []
        print(f"  metrics differ: {len(rows)} rows vs {len(expected_rows)}, first differing row {differing}: "
              f"{keys[:8]}")
    for fault in faults:
        print(f"  fault {fault.kind}@{fault.at}: {'survived' if fault.survived else 'NOT survived'}")
    survived = sum(f.survived for f in faults) if state is not None and state.iteration == args.iterations else 0
    plot(samples, work, args)
    ok = largest_rss <= 1.0 and largest_fds <= 1.0 and equal and survived == len(faults) and redraw_ratio <= 2.0
    print(f"\n{last + 1} iterations in {wall / 60:.1f} min; verdict: "
          f"{'all targets met' if ok else 'targets missed'} (RSS slope <= 1 MB/100, fds flat, metrics equal, "
          f"every fault survived, report within 2x)")
    print(f"RESULT iterations={last + 1} rss_slope_mb_per_100={largest_rss:.2f} fds_slope_per_100={largest_fds:.2f} "
          f"faults_survived={survived}/{len(faults)} metrics_equal={'yes' if equal else 'no'} "
          f"report_redraw_ratio={redraw_ratio:.2f}")
    return 0 if ok else 1


def plot(samples: Samples, work: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (memory, disk) = plt.subplots(1, 2, figsize=(12, 4))
    for name, (xs, rs, _, _) in series(samples, 0).items():
        memory.plot(xs, rs, label=name)
    memory.set_xlabel("iteration")
    memory.set_ylabel("RSS (MB)")
    memory.legend(fontsize=6)
    disk.plot(samples.full_at, samples.db_mb, label="Prefect database (MB)")
    disk.plot(samples.full_at, samples.store_mb, label="run store on S3 (MB)")
    disk.set_xlabel("iteration")
    disk.legend(fontsize=8)
    figure.tight_layout()
    target = args.out / f"longrun-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.png"
    figure.savefig(target, dpi=80)
    print(f"  plot: {target}")


if __name__ == "__main__":
    sys.exit(main())
