"""Predicted speedup of asynchronous training (issue 14) for the RollPacker paper's 7B and 32B settings.

    python bench/sim_async.py [--rounds 20] [--seed 0] [--quick]

The product's own rollout pipeline at alpha (rollout.async_ratio) 1 and 2
over simulated replicas (tailflow/engines/sim/simulate.py, predictions in
bench/research/async_predict.py): the setting's GPUs split into a rollout pool
and a trainer pool, later rounds rolling out while a round trains, with tail
batching off and on, paused requests continuing from their tokens after each
weight sync (partial rollout; restart is printed for alpha 2). Rollout time from
the `roofline` model on H800 presets and the paper-like lengths; reward and
train time fixed on the colocated synchronous step by the paper's Table 1
shares, as bench/sim_validate.py does (docs/simulator.md).

Beside it, ROLL-Flash's reported figure (arXiv 2510.11345): up to 2.24x on
RLVR tasks with the same GPU budget as the synchronous baseline. Ours is a
prediction for other settings (RollPacker's), not a reproduction of theirs.

The last line is `RESULT sim_async_speedup_7b=<x> sim_async_speedup_32b=<y>`:
alpha = 2, tail batching OFF in the async run (async alone, as ROLL-Flash
measures it), speedup over the colocated synchronous step without tail
batching on the same number of GPUs.
"""
from __future__ import annotations

import argparse
import time

import common  # noqa: F401  (puts bench/ on sys.path, as the other benches)
from research.async_predict import AsyncPrediction, predict_async
from research.async_settings import SETTINGS

ROLL_FLASH_RLVR = 2.24
"""ROLL-Flash, abstract: 'up to 2.24x speedup on RLVR tasks ... using the same GPU budget as synchronous baselines'."""
PRESETS = ("7b", "32b")
ALPHAS = (1.0, 2.0)


def header() -> str:
    return (f"{'setting':9s}{'tail':>5s}{'alpha':>6s}{'mode':>8s}{'pools r/t':>10s}{'sync s':>8s}{'tail s':>8s}"
            f"{'split s':>8s}{'async s':>8s}{'x sync':>7s}{'x tail':>7s}{'x pipe':>7s}{'bound':>7s}"
            f"{'util r/t':>11s}  staleness")


def row(p: AsyncPrediction) -> str:
    mode = "partial" if p.partial else "restart"
    return (f"{p.preset:9s}{'on' if p.tail else 'off':>5s}{p.alpha:6.1f}{mode:>8s}"
            f"{f'{p.rollout_gpus}/{p.train_gpus}':>10s}{p.sync_step_s:8.1f}{p.tail_step_s:8.1f}"
            f"{p.split_sync_step_s:8.1f}{p.async_step_s:8.1f}{p.speedup:7.2f}{p.speedup_vs_tail:7.2f}"
            f"{p.pipeline_speedup:7.2f}{p.pipeline_bound:7.2f}"
            f"{f'{p.rollout_utilisation:.2f}/{p.trainer_utilisation:.2f}':>11s}  {p.staleness_histogram}"
            + (f" restarted {p.tokens_restarted:,} tokens" if not p.partial else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="simulated rounds per run at least (whole cycles)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: P0 = 8, 3 rounds, pools half and half, alpha 2, partial only")
    args = parser.parse_args()
    rounds, prompts = (3, 8) if args.quick else (args.rounds, None)

    print("columns: sync s / tail s = colocated synchronous step on all GPUs, tail batching off / on (the existing "
          "prediction); split s = alpha 0 on the async pools; x sync / x tail = speedup of the async step over "
          "them; x pipe = over split s, bounded by (rollout + reward + train + sync) / max(rollout, train + sync)")
    print(header())
    headline: dict[str, float] = {}
    for name in PRESETS:
        started = time.perf_counter()
        split = SETTINGS[name].num_gpus // 2 if args.quick else None
        for tail in (False, True):
            for alpha in (2.0,) if args.quick else ALPHAS:
                p = predict_async(name, alpha, tail=tail, rollout_gpus=split, min_rounds=rounds, seed=args.seed,
                                  prompts_per_step=prompts)
                print(row(p), flush=True)
                if alpha == 2.0 and not tail:
                    headline[name] = p.speedup
            if not args.quick:
                restart = predict_async(name, 2.0, tail=tail, partial=False, rollout_gpus=split, min_rounds=rounds,
                                        seed=args.seed, prompts_per_step=prompts)
                print(row(restart), flush=True)
        print(f"  ({time.perf_counter() - started:.0f} s to simulate {SETTINGS[name].name})")
    print(f"\nROLL-Flash reported (arXiv 2510.11345): up to {ROLL_FLASH_RLVR:.2f}x on RLVR tasks, same GPU budget as "
          f"the synchronous baseline; predicted here at alpha 2, tail off: "
          + ", ".join(f"{SETTINGS[n].name} {headline[n]:.2f}x" for n in PRESETS))
    print(f"RESULT sim_async_speedup_7b={headline['7b']:.2f} sim_async_speedup_32b={headline['32b']:.2f}")


if __name__ == "__main__":
    main()
