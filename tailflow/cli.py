"""`tailflow`: train, evaluate and warm-start from the command line; inspect, resume and export runs.

Every command takes the same `-c FILE` / `--set key=value` options; the config
is validated before any work starts. For `runs`, `resume` and `export` they
name the artifact store (`storage.uri`) that holds the run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path


def quiet_prefect_defaults(command: str = "train") -> None:
    """Ephemeral-server defaults that work offline (set before prefect is imported). Prefect's INFO records stay
    off the terminal of a run (its own lines say where it is), but not off a worker's: there they are its
    lifecycle (flow run submitted, started, finished), and the flow runs it starts inherit its level. A level the
    user set is kept either way."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    if command != "worker":
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="YAML run config (default: the embedded default task)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set train.lr=2e-5 (repeatable)")


def allow_change_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-change", action="append", default=[], metavar="KEY[,KEY...]",
                        help="config keys a resumed run may change, e.g. train.iterations (repeatable)")


def take_over_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--take-over", action="store_true",
                        help="take the run's lease from the writer holding it (only if you know it is dead or "
                             "must stop; a dead holder on this host, or one silent for 60 s, is replaced anyway)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    training_commands(commands)
    run_inspection_commands(commands)
    workers_arguments(commands.add_parser(
        "workers", help="add or remove rollout workers of a running run (read between rollout polls)"))
    model_commands(commands)
    sandbox_commands(commands)
    plan_arguments(commands.add_parser(
        "plan", help="simulate tail batching on a GPU cluster from a trace; print the best settings, write a heatmap"))
    calibrate_arguments(commands.add_parser(
        "calibrate", help="measure this machine's native engine for the `cpu` cost model"))
    prefect_commands(commands)
    return parser


def training_commands(commands) -> None:
    train = commands.add_parser("train", help="run RL training (a Prefect flow of iterations on Ray workers)")
    config_arguments(train)
    train.add_argument("--run-id", help="name of the run directory under storage.uri (default: generated); "
                       "an existing run with a commit resumes")
    allow_change_argument(train)
    take_over_argument(train)
    resume = commands.add_parser("resume", help="continue a run from its last commit (default: its saved config)")
    run_id_argument(resume)
    config_arguments(resume)
    allow_change_argument(resume)
    take_over_argument(resume)


def run_id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", metavar="RUN_ID", help="a run directory under storage.uri")


def run_inspection_commands(commands) -> None:
    report = commands.add_parser("report", help="draw a run's report.html (plots) and index.html in its directory")
    run_id_argument(report)
    config_arguments(report)
    runs = commands.add_parser("runs", help="list the runs in the artifact store, or show one")
    runs_commands = runs.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_commands.add_parser("list", help="one line per run: progress, queue, eval, checkpoint")
    config_arguments(runs_list)
    runs_show = runs_commands.add_parser("show", help="a run's committed state")
    run_id_argument(runs_show)
    runs_show.add_argument("--json", action="store_true", help="print one JSON object")
    config_arguments(runs_show)
    export = commands.add_parser("export", help="copy a run's committed checkpoint out as a Hugging Face model dir")
    run_id_argument(export)
    export.add_argument("directory", metavar="DIR", help="new or empty directory to write the model into")
    config_arguments(export)
    replay = commands.add_parser("replay", help="run an iteration's optimizer step again on its dumped round "
                                                "(storage.dump_rounds) from the checkpoint before it")
    run_id_argument(replay)
    replay.add_argument("--iteration", type=int, required=True, metavar="K", help="the iteration to replay (0-based)")
    config_arguments(replay)


def model_commands(commands) -> None:
    evaluate = commands.add_parser("eval", help="greedy held-out accuracy of model.path (default: the warm start)")
    config_arguments(evaluate)
    warm = commands.add_parser("warmstart", help="SFT the embedded tiny model (cached in the artifact store)")
    config_arguments(warm)
    show = commands.add_parser("config", help="print the resolved config as YAML")
    config_arguments(show)
    show.add_argument("--reference", action="store_true", help="print the configuration reference (markdown)")


def sandbox_commands(commands) -> None:
    sandbox = commands.add_parser("sandbox", help="run untrusted Python the way rewards do")
    sandbox_actions = sandbox.add_subparsers(dest="sandbox_command", required=True)
    sandbox_run = sandbox_actions.add_parser("run", help="run FILE in the sandbox; print one JSON object")
    sandbox_run.add_argument("file", metavar="FILE", help="a Python program")
    sandbox_run.add_argument("--timeout", type=float, default=10.0, metavar="S", help="wall-clock limit in seconds")
    sandbox_run.add_argument("--stdin", metavar="FILE", help="file to feed the program on stdin")
    sandbox_run.add_argument("--backend", default="auto", choices=["auto", "bwrap", "process", "docker"],
                             help="auto: bwrap where it works, else process (as reward.sandbox)")


def calibrate_arguments(calibrate) -> None:
    calibrate.add_argument("--out", default="cpu_cost.json", help="calibration file to write (default cpu_cost.json)")
    calibrate.add_argument("--model", help="HF model directory (default: the shipped warm start)")
    calibrate.add_argument("--threads", type=int, default=1, help="torch threads, as the rollout worker will have")
    calibrate.add_argument("--quick", action="store_true", help="a 3 x 2 grid (smoke runs)")


def prefect_commands(commands) -> None:
    server = commands.add_parser("server", help="start a Prefect server (the UI) for deployments and workers")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=4200)
    worker = commands.add_parser("worker", help="start a Prefect worker on the tailflow process work pool")
    worker.add_argument("--pool", default="tailflow")
    deploy = commands.add_parser("deploy", help="register deployments/prefect.yaml on the Prefect server")
    deploy.add_argument("--repo", help="the tailflow checkout the worker runs flows from (default: this one)")


def workers_arguments(workers) -> None:
    actions = workers.add_subparsers(dest="workers_command", required=True)
    add = actions.add_parser("add", help="start N rollout workers; each takes requests once it has the weights")
    run_id_argument(add)
    add.add_argument("count", metavar="N", type=int, help="how many workers to add (>= 1)")
    config_arguments(add)
    remove = actions.add_parser("remove", help="worker ID hands its requests to the others and stops")
    run_id_argument(remove)
    remove.add_argument("worker_id", metavar="ID", type=int, help="the worker's id (the run's log names them)")
    config_arguments(remove)
    pending = actions.add_parser("pending", help="commands written but not yet applied by the run")
    run_id_argument(pending)
    config_arguments(pending)


def run_workers(args, config) -> int:
    """Queue the command in the run's store (`engines/cluster/worker_control.py`); the run applies it between
    rollout polls, within `cluster.worker_control_interval_s`, or when it next runs."""
    from tailflow.config import ConfigError
    from tailflow.engines.cluster.worker_control import WorkerCommand, pending_worker_commands, send_worker_command
    from tailflow.engines.runs.layout import config_key
    from tailflow.engines.store import open_store

    store = open_store(config.storage.uri)
    if args.workers_command == "pending":
        for name in pending_worker_commands(store, args.run_id):
            print(name)
        return 0
    if not store.exists(config_key(args.run_id)):
        raise ConfigError(f"no run {args.run_id!r} in {store.uri()}")  # `main` prints it as one line, exit 2
    try:
        command = (WorkerCommand(add=args.count) if args.workers_command == "add"
                   else WorkerCommand(remove=args.worker_id))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    key = send_worker_command(store, args.run_id, command)
    print(f"queued for run {args.run_id}: {args.workers_command} "
          f"{args.count if args.workers_command == 'add' else args.worker_id} ({store.uri(key)})")
    return 0


def plan_arguments(plan) -> None:
    source = plan.add_argument_group("lengths (exactly one, or none with --env-trace)")
    source.add_argument("--run", metavar="RUN_ID", help="a run in storage.uri: its rollout_trace.jsonl")
    source.add_argument("--trace", metavar="FILE", help="a rollout_trace.jsonl file")
    source.add_argument("--rollpacker", metavar="FILE", help="RollPacker's response-length-and-rewards JSONL")
    source.add_argument("--paper", action="store_true", help="the paper-like length generator (needs --max-new-tokens)")
    plan.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster (rollout and training share them)")
    plan.add_argument("--hardware", default="h800", help="h100, h800 or a100")
    plan.add_argument("--model", required=True, help="qwen2.5-7b, qwen2.5-14b or qwen2.5-32b")
    plan.add_argument("--tp", type=int, default=None, help="rollout TP (default: the smallest that fits the model)")
    plan.add_argument("--prompts-per-step", type=int, help="P0 (default: the run's; 128 for --paper/--rollpacker)")
    plan.add_argument("--responses", type=int, help="R0 (default: the run's; 8 otherwise)")
    plan.add_argument("--max-new-tokens", type=int, help="response cap for --paper (and --rollpacker)")
    plan.add_argument("--grid", default="paper", choices=["paper", "fine"],
                      help="paper: Figure 11's 4 x 4; fine: 9 prompt ratios x every response count R0..1.5 R0")
    plan.add_argument("--measured", metavar="FILE",
                      help="a `measured` GPU calibration file (docs/simulator.md): replaces the roofline for rollout")
    plan.add_argument("--rounds", type=int, default=10, help="simulated rounds per setting, at least (whole cycles)")
    plan.add_argument("--pricing", default="shares", choices=["shares", "roofline", "measured"],
                      help="reward and train time: shares (RollPacker Table 1 split of the synchronous step), roofline "
                           "(FSDP on the same GPUs, no reward) or measured (--measured FILE's train_s_per_token)")
    plan.add_argument("--stream", choices=["off", "reward", "reward+train"], default="off",
                      help="what runs during rollout: nothing (the paper's '+ tail batching' step), streamed scoring, "
                           "or streamed scoring and the stream trainer")
    plan.add_argument("--jobs", type=int, default=None, help="settings simulated side by side (default: one per CPU)")
    plan.add_argument("--out", default="plan", help="folder for plan.md and plan_heatmap.png")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--env-trace", metavar="FILE_OR_RUN_DIR",
                      help="an agentic run's rollout_trace.jsonl, its run folder, a round dump "
                           "(rounds/iter-NNNN.json, storage.dump_rounds) or its rounds/ folder: predict "
                           "env.schedule lockstep, "
                           "turn_sync and async for P0 x R0 of its trajectories on this cluster (SIMULATED); with "
                           "no lengths source, instead of the tail-batching search")
    config_arguments(plan)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_prefect_defaults(args.command)
    from tailflow.config import load_config

    try:
        # the run config is validated before any work starts; sandbox and the Prefect commands need none
        config = None if args.command in NEEDS_NO_CONFIG else load_config(args.config, args.overrides)
        return COMMANDS[args.command](args, config)
    except user_errors() as error:
        print(f"tailflow: error: {error}", file=sys.stderr)
        return 2


def run_config(args, config) -> int:
    from tailflow.config import config_reference_markdown, config_to_yaml

    print(config_reference_markdown() if args.reference else config_to_yaml(config), end="")
    return 0


def run_eval(args, config) -> int:
    from tailflow.flows.evaluate import evaluate_model

    print(f"greedy accuracy: {evaluate_model(args.config, args.overrides):.1%}")
    return 0


def run_warmstart(args, config) -> int:
    from tailflow.flows.warmstart import warm_start

    print(f"warm-start checkpoint: {warm_start(args.config, args.overrides)}")
    return 0


def user_errors() -> tuple[type[Exception], ...]:
    """Errors about the user's input: printed as one line, not a traceback."""
    from tailflow.config import ConfigError
    from tailflow.engines.data.dataset import DatasetError
    from tailflow.engines.models import UnsupportedModelError
    from tailflow.engines.runs.commit import CommitError
    from tailflow.engines.store import StoreError
    from tailflow.engines.sim.costs import CostModelError
    from tailflow.engines.track.rollout_trace import TraceError
    from tailflow.stored_runs import RunError

    return (ConfigError, DatasetError, UnsupportedModelError, StoreError, FileNotFoundError, RunError, CommitError,
            CostModelError, TraceError)


def allowed_changes(values: list[str]) -> list[str]:
    """`--allow-change a,b --allow-change c` -> [a, b, c], each checked against the config's keys (the `env`
    section's too, though the default config has none; `env.settings.<name>` are the environment's own)."""
    from tailflow.config import ConfigError, EnvConfig, EnvFaults, RunConfig
    from tailflow.driver.resume import flatten

    known = (set(flatten(RunConfig().model_dump(mode="json"))) | {f"env.{name}" for name in EnvConfig.model_fields}
             | {f"env.faults.{name}" for name in EnvFaults.model_fields})
    keys = [key.strip() for value in values for key in value.split(",") if key.strip()]
    for key in keys:
        if key not in known and not key.startswith("env.settings."):
            raise ConfigError(f"--allow-change: {key} is not a config key (see `tailflow config`)")
    return keys


def run_train(args, config) -> int:
    from tailflow.flows.training import rl_training

    allow_change = allowed_changes(args.allow_change)
    return run_to_its_end(lambda: rl_training(config_path=args.config, overrides=args.overrides, run_id=args.run_id,
                                              allow_change=allow_change, take_over=args.take_over))


def run_resume(args, config) -> int:
    """The run's saved config unless -c is given, in the store where the run was found (`resume_config`)."""
    from tailflow.driver.resume import resume_config
    from tailflow.flows.training import rl_training

    resumed, allow_change = resume_config(args.run_id, args.config, args.overrides,
                                          allowed_changes(args.allow_change))
    return run_to_its_end(lambda: rl_training(config=resumed.model_dump(mode="json"), run_id=args.run_id,
                                              allow_change=allow_change, take_over=args.take_over))


def run_to_its_end(run) -> int:
    """Run the training flow and print its summary. Cancelled (from the UI, with a server), the run has said
    where it stopped and how to resume: exit 1 without a traceback."""
    from tailflow.driver.retry_policy import USER_ERRORS
    from tailflow.tasks.cancellable import RunCancelled
    from tailflow.terminal import quiet_tracebacks_of

    with quiet_tracebacks_of(USER_ERRORS):
        try:
            summary = run()
        except RunCancelled:
            return 1
    print_summary(summary)
    return 0


def run_report(args, config) -> int:
    from tailflow.engines.runs.layout import config_key
    from tailflow.engines.store import open_store
    from tailflow.engines.track.report import write_report
    from tailflow.stored_runs import RunError

    store = open_store(config.storage.uri)
    if not store.exists(config_key(args.run_id)):
        raise RunError(f"no run {args.run_id} in {store.uri()} (see `tailflow runs list`)")
    report = write_report(store, args.run_id)
    print(f"report of run {args.run_id} after {report.iterations} iterations: {store.uri(report.page)}\n"
          f"  plots: {', '.join(store.uri(key) for key in report.plots)}\n"
          f"  index: {store.uri(args.run_id + '/index.html')}")
    return 0


def run_runs(args, config) -> int:
    from tailflow.engines.store import open_store
    from tailflow.stored_runs import list_runs, read_run

    store = open_store(config.storage.uri)
    if args.runs_command == "list":
        print_run_table(store.uri(), list_runs(store))
    elif args.json:
        print(json.dumps(asdict(read_run(store, args.run_id)), indent=2))
    else:
        print_stored_run(read_run(store, args.run_id))
    return 0


def run_prefect_ops(args, config=None) -> int:
    from tailflow import prefect_ops

    if args.command == "server":
        os.execve(sys.executable, prefect_ops.server_command(args.host, args.port),
                  prefect_ops.server_environment(dict(os.environ)))
    if args.command == "worker":
        os.execv(sys.executable, prefect_ops.worker_command(args.pool))
    try:
        print(prefect_ops.deploy(Path(args.repo) if args.repo else None), end="")
    except prefect_ops.DeployError as error:
        print(f"tailflow: error: {error}", file=sys.stderr)
        return 2
    return 0


def run_sandbox(args, config=None) -> int:
    from tailflow.engines.reward.sandbox import SandboxError, SandboxLimits, run_python

    try:
        missing = next((path for path in (args.file, args.stdin) if path and not os.path.isfile(path)), None)
        if missing:
            raise SandboxError(f"no such file: {missing}")
        stdin = Path(args.stdin).read_text() if args.stdin else ""
        result = run_python(Path(args.file).read_text(), stdin, SandboxLimits(timeout_s=args.timeout), args.backend)
    except (SandboxError, ValueError) as error:  # answered here: the config-error imports take seconds
        print(f"tailflow: error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(result)))
    return 0


def run_plan(args, config) -> int:
    """The `plan` flow's search and outputs, run in-process (no Prefect server needed); with `--env-trace`, the
    environment schedules' table first (and only that when no lengths source is given)."""
    if args.env_trace:
        print(env_schedules(args), flush=True)
        if not (args.run or args.trace or args.rollpacker or args.paper):
            return 0
    from tailflow.engines.sim.plan import PlanRequest, plan, smallest_tp
    from tailflow.engines.sim.plan_pages import text_table, write_plan
    from tailflow.engines.sim.simulate import StreamingSettings
    from tailflow.engines.sim.sources import LengthSpec, load_lengths, longest_request, policy_sizes

    spec = LengthSpec(args.run, config.storage.uri, args.trace, args.rollpacker, 20_000 if args.paper else None,
                      args.max_new_tokens, args.seed)
    spec.check()
    p0, r0 = policy_sizes(spec, args.prompts_per_step, args.responses)
    lengths, description = load_lengths(spec)
    tp = args.tp or smallest_tp(args.hardware, args.model, args.gpus, longest_request(lengths))
    streaming = StreamingSettings(reward=args.stream != "off", train=args.stream == "reward+train")
    request = PlanRequest(args.gpus, args.hardware, args.model, tp, p0, r0, args.grid, args.rounds, seed=args.seed,
                          pricing=args.pricing, streaming=streaming, measured_path=args.measured, jobs=args.jobs)
    result = plan(request, lengths, description, progress=lambda line: print(f"[plan] {line}", flush=True))
    page, heatmap = write_plan(result, args.out)
    print(text_table(result))
    print(f"wrote {page} and {heatmap}")
    return 0


def env_schedules(args) -> str:
    """`plan --env-trace`: the agentic run's trajectories under each environment schedule at this plan's scale."""
    from tailflow.engines.sim.agentic import describe_trajectories
    from tailflow.engines.sim.plan import PlanRequest, env_schedule_plan, smallest_tp
    from tailflow.engines.sim.sources import env_trace
    from tailflow.engines.sim.trace import trajectories_from_trace

    rounds, where, p0, r0 = env_trace(args.env_trace, args.prompts_per_step, args.responses)
    trajectories = trajectories_from_trace(rounds, where)
    longest = max(t.context_tokens for t in trajectories)
    tp = args.tp or smallest_tp(args.hardware, args.model, args.gpus, longest)
    request = PlanRequest(args.gpus, args.hardware, args.model, tp, p0, r0, seed=args.seed,
                          measured_path=args.measured)
    source = f"{where}: {len(trajectories)} trajectories, {describe_trajectories(trajectories)}"
    return env_schedule_plan(request, trajectories, source)


def run_calibrate(args, config) -> int:
    from tailflow.engines.sim.calibrate import calibrate_cpu
    from tailflow.driver.inputs import shipped_warmstart_dir

    table = calibrate_cpu(args.model or shipped_warmstart_dir(), num_threads=args.threads, quick=args.quick)
    Path(args.out).write_text(json.dumps(table.to_json(), indent=1) + "\n")
    print(f"wrote {args.out}: {len(table.rows)} x {len(table.context)} grid ({table.device})")
    return 0


def run_export(args, config) -> int:
    from tailflow.engines.store import open_store
    from tailflow.stored_runs import export_checkpoint

    result = export_checkpoint(open_store(config.storage.uri), args.run_id, args.directory)
    print(f"exported run {args.run_id} after {result.iteration} iterations ({result.checkpoint})\n"
          f"  to: {result.directory}\n"
          f"  model.safetensors sha256: {result.weights_sha256}")
    return 0


def run_replay(args, config) -> int:
    from tailflow.driver.replay import replay_step
    from tailflow.engines.store import open_store

    replayed = replay_step(open_store(config.storage.uri), args.run_id, args.iteration)
    print(f"replayed iteration {replayed.iteration} of run {args.run_id} from {replayed.started_from}")
    ours = replayed.stats.metrics()
    print(f"  {'metric':32} {'replayed':>14} {'the run':>14}")
    for name, value in ours.items():
        theirs = replayed.run_metrics.get(name)
        print(f"  {name:32} {value:14.6g} {'-' if theirs is None else format(theirs, '14.6g'):>14}")
    if replayed.compared_with is None:
        print("  the run's checkpoint after this iteration is not kept: weights not compared")
    else:
        verdict = "equal" if replayed.max_weight_diff == 0 else f"max |difference| {replayed.max_weight_diff:.3g}"
        print(f"  weights against {replayed.compared_with}: {verdict}")
    return 0


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def run_table_row(run) -> list[str]:
    from tailflow.stored_runs import UnreadableRun

    if isinstance(run, UnreadableRun):
        return [run.run_id, "?", "-", "-", "-", f"unreadable: {run.reason}"]
    iterations = f"{run.iteration}/{run.iterations_planned}"
    if not run.committed:
        return [run.run_id, iterations, "-", "-", "-", "no commit (not started)"]
    last_round = ("long" if run.round_history[-1] else "short") if run.round_history else "-"
    return [run.run_id, iterations, last_round, str(run.long_queue_size), percent(run.last_eval_accuracy),
            run.latest_checkpoint or "initial model"]


def print_run_table(store_uri: str, runs: list) -> None:
    if not runs:
        print(f"no runs in {store_uri}")
        return
    rows = [["RUN", "ITERS", "LAST", "QUEUE", "EVAL", "CHECKPOINT"]] + [run_table_row(r) for r in runs]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def print_stored_run(run) -> None:
    from tailflow.stored_runs import rounds_text

    print(f"run {run.run_id}\n  config: {run.config}")
    if not run.committed:
        print(f"  no commit yet: not started, or stopped before its first commit "
              f"(0 of {run.iterations_planned} iterations)")
        return
    oldest = f", oldest: {', '.join(run.long_queue_oldest)}" if run.long_queue_oldest else ""
    more = ", ..." if run.long_queue_size > len(run.long_queue_oldest) else ""
    print(f"  iterations: {run.iteration} of {run.iterations_planned} committed\n"
          f"  rounds: {rounds_text(run.round_history)}\n"
          f"  long queue: {run.long_queue_size} prompts{oldest}{more}\n"
          f"  checkpoint: {run.latest_checkpoint or 'none yet (the initial model)'}\n"
          f"  weights sha256: {run.weights_sha256 or '-'}\n"
          f"  eval accuracy: {percent(run.initial_eval_accuracy)} initial, "
          f"{percent(run.last_eval_accuracy)} last")
    if run.reward_timeout_anchor_s is not None:
        print(f"  code timeout anchor: {run.reward_timeout_anchor_s:.3f}s (quantile of recent correct executions)")


def environment_line(env) -> str:
    """An agentic run's line of the closing summary (flows/training.EnvSummary); nothing for single-turn."""
    if env is None:
        return ""
    return (f"  environment: {env.turns_mean:.1f} turns per trajectory, {env.step_s_mean * 1000:.1f} ms per step, "
            f"{env.failures} failures\n")


def print_summary(summary) -> None:
    final = summary.final_accuracy if summary.final_accuracy is not None else float("nan")
    print(
        f"\n[tailflow] run {summary.run_id} finished {summary.iterations} iterations\n"
        f"  held-out greedy accuracy: {summary.initial_accuracy:.1%} -> {final:.1%} "
        f"({(final - summary.initial_accuracy) * 100:+.1f} points)\n"
        f"  mean step time: {summary.mean_step_seconds:.1f}s\n"
        f"{environment_line(getattr(summary, 'env', None))}"
        f"  artifacts: {summary.run_dir}\n"
        f"    metrics: {summary.metrics_path}\n"
        f"    checkpoint: {summary.latest_checkpoint}"
    )


NEEDS_NO_CONFIG = ("sandbox", "server", "worker", "deploy")
COMMANDS = {"config": run_config, "train": run_train, "eval": run_eval, "warmstart": run_warmstart,
            "resume": run_resume, "report": run_report, "runs": run_runs, "workers": run_workers,
            "export": run_export, "replay": run_replay, "plan": run_plan, "calibrate": run_calibrate,
            "sandbox": run_sandbox, "server": run_prefect_ops, "worker": run_prefect_ops, "deploy": run_prefect_ops}
"""Each command's function, called with its parsed arguments and the validated run config (None for
NEEDS_NO_CONFIG)."""


if __name__ == "__main__":
    sys.exit(main())
