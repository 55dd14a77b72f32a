"""`tailflow`: train, evaluate and warm-start from the command line.

Every command takes the same `-c FILE` / `--set key=value` options; the config
is validated before any work starts.
"""
from __future__ import annotations

import argparse
import os
import sys


def quiet_prefect_defaults() -> None:
    """Ephemeral-server defaults that work offline (set before prefect is imported)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", help="YAML run config (default: the embedded default task)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config value, e.g. --set train.lr=2e-5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run RL training (a Prefect flow of iterations on Ray workers)")
    config_arguments(train)
    train.add_argument("--run-id", help="name of the run directory under storage.uri (default: generated)")
    evaluate = commands.add_parser("eval", help="greedy held-out accuracy of model.path (default: the warm start)")
    config_arguments(evaluate)
    warm = commands.add_parser("warmstart", help="SFT the embedded tiny model (cached in the artifact store)")
    config_arguments(warm)
    show = commands.add_parser("config", help="print the resolved config as YAML")
    config_arguments(show)
    show.add_argument("--reference", action="store_true", help="print the configuration reference (markdown)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_prefect_defaults()
    from tailflow.config import config_reference_markdown, config_to_yaml, load_config

    try:
        config = load_config(args.config, args.overrides)  # fail before any work starts
        if args.command == "config":
            print(config_reference_markdown() if args.reference else config_to_yaml(config), end="")
        elif args.command == "train":
            return run_train(args)
        elif args.command == "eval":
            from tailflow.flows.evaluate import evaluate_model

            print(f"greedy accuracy: {evaluate_model(args.config, args.overrides):.1%}")
        elif args.command == "warmstart":
            from tailflow.flows.warmstart import warm_start

            print(f"warm-start checkpoint: {warm_start(args.config, args.overrides)}")
        return 0
    except user_errors() as error:
        print(f"tailflow: error: {error}", file=sys.stderr)
        return 2


def user_errors() -> tuple[type[Exception], ...]:
    """Errors about the user's input: printed as one line, not a traceback."""
    from tailflow.config import ConfigError
    from tailflow.engines.data.dataset import DatasetError
    from tailflow.engines.models import UnsupportedModelError
    from tailflow.engines.store import StoreError

    return (ConfigError, DatasetError, UnsupportedModelError, StoreError, FileNotFoundError)


def run_train(args) -> int:
    from tailflow.flows.training import rl_training

    summary = rl_training(config_path=args.config, overrides=args.overrides, run_id=args.run_id)
    final = summary.final_accuracy if summary.final_accuracy is not None else float("nan")
    print(
        f"\n[tailflow] run {summary.run_id} finished {summary.iterations} iterations\n"
        f"  held-out greedy accuracy: {summary.initial_accuracy:.1%} -> {final:.1%} "
        f"({(final - summary.initial_accuracy) * 100:+.1f} points)\n"
        f"  mean step time: {summary.mean_step_seconds:.1f}s\n"
        f"  artifacts: {summary.run_dir}\n"
        f"    metrics: {summary.metrics_path}\n"
        f"    checkpoint: {summary.latest_checkpoint}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
