"""Tokens per dollar of a schedule of rollout workers, on demand vs spot (issue 17's cost model).

    python bench/sim_spot.py [--on-demand 83.79] [--spot 21.28] [--preemptions-per-hour 0.1]
                             [--schedule 1,2,3,4] [--hours-each 0.25] [--model qwen2.5-7b] [--quick]

Prices are FluidRL's guide (an H100 x 8 worker: $83.79/h on demand, $21.28/h
spot). The schedule is FluidRL's example of workers joining one at a time,
1 -> 4; how long each count lasts (`--hours-each`) is ours. Throughput per
worker count comes from the simulator's rollout model
(bench/research/spot_workers.py: the policy's rounds on k x 8 H100s,
`roofline` model, paper-like lengths at an 8k cap, P0 = 128, R0 = 8), with
tail batching off and on; FluidRL's reported 12,000 -> 18,000 tokens/s
(straight line between 1 and 4 workers) is run through the same cost model
beside them. The preemption rates are illustrative, not measured.

The last line is `RESULT spot_tokens_per_dollar_gain=<spot / on-demand tokens per dollar>` for the simulated
throughput with tail batching off at --preemptions-per-hour.
"""
from __future__ import annotations

import argparse

import common  # noqa: F401  (puts bench/ on sys.path, as the other benches)

from research.spot import (FLUIDRL_ON_DEMAND_PER_HOUR, FLUIDRL_SPOT_PER_HOUR, Interval, ScheduleCost, SpotTerms,
                           WorkerModel, schedule_cost)
from research.spot_workers import reported_workers, simulated_workers

FLUIDRL_THROUGHPUT = {1: 12_000.0, 4: 18_000.0}
"""FluidRL's guide: ~12,000 -> 18,000 tokens/s as rollout workers grow 1 -> 4 (it reports ~60% more tokens per
dollar on spot)."""
RATES = (0.0, 0.1, 1.0, 10.0, 1000.0)


def print_costs(workers: WorkerModel, schedule: list[Interval], args) -> dict[float, ScheduleCost]:
    print(f"\n{workers.source}")
    print("  tokens/s by workers up: " + ", ".join(f"{k}: {t:,.0f}" for k, t in sorted(workers.throughput.items()))
          + f"; re-prefill after a preemption {workers.reprefill_s:.1f} s")
    print(f"  {'preempt/h':>9s}{'tok/s od':>10s}{'tok/s spot':>11s}{'$ od':>8s}{'$ spot':>8s}{'tok/$ od':>10s}"
          f"{'tok/$ spot':>11s}{'gain':>7s}{'preempts':>9s}{'tokens lost':>13s}")
    costs = {}
    for rate in sorted(set(RATES) | {args.preemptions_per_hour}):
        terms = SpotTerms(args.on_demand, args.spot, rate, args.replacement_s, args.poll_interval_s)
        c = costs[rate] = schedule_cost(schedule, workers, terms)
        print(f"  {rate:9.1f}{c.tokens_per_s_on_demand:10,.0f}{c.tokens_per_s_spot:11,.0f}{c.dollars_on_demand:8.2f}"
              f"{c.dollars_spot:8.2f}{c.tokens_per_dollar_on_demand:10,.0f}{c.tokens_per_dollar_spot:11,.0f}"
              f"{c.tokens_per_dollar_spot / c.tokens_per_dollar_on_demand:7.2f}{c.preemptions:9.2f}"
              f"{c.tokens_lost:13,.0f}")
    hours = sum(i.hours for i in schedule)
    single = schedule_cost([Interval(hours, 1)], workers, SpotTerms(args.on_demand, args.spot, 0.0))
    gain = costs[args.preemptions_per_hour].tokens_per_dollar_spot / single.tokens_per_dollar_on_demand
    print(f"  one on-demand worker throughout instead: {single.tokens_per_dollar_on_demand:,.0f} tokens/$; the spot "
          f"schedule at {args.preemptions_per_hour}/h gives {gain:.2f}x that")
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--on-demand", type=float, default=FLUIDRL_ON_DEMAND_PER_HOUR, help="$ per worker-hour on demand")
    parser.add_argument("--spot", type=float, default=FLUIDRL_SPOT_PER_HOUR, help="$ per worker-hour on spot")
    parser.add_argument("--preemptions-per-hour", type=float, default=0.1, help="per spot worker (for RESULT)")
    parser.add_argument("--replacement-s", type=float, default=300.0, help="preemption -> replacement joined")
    parser.add_argument("--poll-interval-s", type=float, default=1.0, help="most generation lost at a preemption")
    parser.add_argument("--schedule", default="1,2,3,4", help="workers per interval")
    parser.add_argument("--hours-each", type=float, default=0.25)
    parser.add_argument("--model", default="qwen2.5-7b")
    parser.add_argument("--rounds", type=int, default=10, help="simulated rounds per worker count (whole cycles)")
    parser.add_argument("--quick", action="store_true", help="smoke run: P0 = 16, 2 rounds, a 2k cap")
    args = parser.parse_args()

    schedule = [Interval(args.hours_each, int(n)) for n in args.schedule.split(",")]
    most = max(i.num_workers for i in schedule)
    sizes = dict(prompts_per_step=16, min_rounds=2, max_new_tokens=2048) if args.quick else dict(min_rounds=args.rounds)
    print(f"schedule: {', '.join(f'{i.num_workers} x {i.hours} h' for i in schedule)}; ${args.on_demand}/h on demand, "
          f"${args.spot}/h spot per worker; replacement after {args.replacement_s:.0f} s; "
          f"poll {args.poll_interval_s} s")
    simulated = simulated_workers(args.model, most, **sizes)
    headline = print_costs(simulated, schedule, args)[args.preemptions_per_hour]
    print_costs(simulated_workers(args.model, most, tail=True, **sizes), schedule, args)
    fluid = reported_workers(FLUIDRL_THROUGHPUT, most, "FluidRL's reported throughput (1: 12,000, 4: 18,000 "
                             "tokens/s, straight line between), same cost model", simulated.reprefill_s)
    print_costs(fluid, schedule, args)
    print(f"RESULT spot_tokens_per_dollar_gain="
          f"{headline.tokens_per_dollar_spot / headline.tokens_per_dollar_on_demand:.2f}")


if __name__ == "__main__":
    main()
