"""The GPU evidence kit: everything a lent GPU should prove about tailflow's rollout, in one command.

    python bench/gpu_evidence.py [--stages contract,calibrate,throughput,rounds,turns] [--dry-run] [--out DIR]

Stages (each prints its own table; run them one per device call if a call's 10 minutes are tight):
  contract    the engine contract suite (tests/test_engine_contract.py, tests/test_decode_graphs.py) on CUDA,
              and engine sleep / trainer offload (tests/test_engine_sleep.py, tests/test_trainer_offload.py)
  calibrate   decode/prefill step time of the native engine, rows x context, for Qwen2.5-0.5B/1.5B/7B shapes
              with random weights; writes gpu_calibration_<gpu>_<model>.json, the simulator's `measured` format
  throughput  our engine's useful tokens/s against transformers' generate() (Qwen2.5-0.5B shape, same lengths)
  rounds      tailflow's real tail-batching rounds on the GPU, lengths forced from the paper-like trace:
              synchronous rounds vs short + long rounds; prints RESULT rollout_speedup=<x>
  turns       colocated turns on one GPU (Qwen2.5-0.5B shape): memory the engine's sleep and the trainer's
              offload give back, what each move costs, and that a woken engine decodes as before

Needs torch and transformers, plus pydantic (tail state) and pytest (contract); never Ray, Prefect or a
network. `--dry-run` runs every stage on tiny shapes on the CPU (a test does, so the kit cannot rot).
Writes gpu_evidence_<gpu>.json (every number printed) beside the calibration files: in `--out`, by default
bench/results/, or a new temporary directory for a dry run (its path is printed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import torch  # noqa: E402

from gpu_calibration import QWEN25, TINY, build_model, calibrate_model, synchronize  # noqa: E402

STAGES = ("contract", "calibrate", "throughput", "rounds", "turns")


@dataclass(frozen=True)
class Sizes:
    """Every size the stages use; `DRY` is the CPU smoke-test version of `FULL`."""

    models: tuple[str, ...]
    rows: tuple[int, ...]
    context: tuple[int, ...]
    steps: int
    max_prefill_tokens: int
    throughput_model: str
    throughput_requests: int
    throughput_prompt: int
    throughput_cap: int
    throughput_slots: int
    rounds_model: str
    prompts_per_step: int
    responses_kept: int
    responses_launched: int
    prompt_ratio: float
    rounds_cap: int
    rounds_slots: int
    num_rounds: int
    contract_filter: str
    turns_model: str
    turns_slots: int
    turns_max_seq_len: int
    turns_requests: int
    turns_tokens: int


FULL = Sizes(models=tuple(QWEN25), rows=(1, 4, 16, 64, 256), context=(512, 1024, 2048, 4096, 8192), steps=10,
             max_prefill_tokens=65536, throughput_model="qwen2.5-0.5b", throughput_requests=128,
             throughput_prompt=256, throughput_cap=2048, throughput_slots=64, rounds_model="qwen2.5-0.5b",
             prompts_per_step=8, responses_kept=8, responses_launched=10, prompt_ratio=1.25, rounds_cap=4096,
             rounds_slots=128, num_rounds=5, turns_model="qwen2.5-0.5b", turns_slots=64,
             # Two trainers stepping alike are bit-equal on a CPU, not on CUDA (atomic adds in the embedding's
             # backward): that case is left to the CPU; `turns` measures the CUDA offload itself.
             contract_filter="not offloading_between_steps_changes_nothing",
             turns_max_seq_len=2048, turns_requests=16, turns_tokens=64)
DRY = Sizes(models=("tiny",), rows=(1, 2), context=(16, 32), steps=3, max_prefill_tokens=32,
            throughput_model="tiny", throughput_requests=6, throughput_prompt=8, throughput_cap=64, throughput_slots=4,
            rounds_model="tiny", prompts_per_step=2, responses_kept=2, responses_launched=3, prompt_ratio=1.5,
            rounds_cap=24, rounds_slots=16, num_rounds=3, turns_model="tiny", turns_slots=4, turns_max_seq_len=64,
            turns_requests=3, turns_tokens=8,
            contract_filter="(OnCPU and qwen3 and greedy) or (test_engine_sleep and woke and qwen3) or park")


def gpu_slug(device: str, dry_run: bool) -> str:
    if dry_run or torch.device(device).type != "cuda":
        return "dryrun-cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")


def shape_of(name: str) -> dict:
    return {**QWEN25, **TINY}[name]


def run_contract(sizes: Sizes) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_engine_contract.py",
               "tests/test_decode_graphs.py", "tests/test_engine_sleep.py", "tests/test_trainer_offload.py"
               ] + (["-k", sizes.contract_filter] if sizes.contract_filter else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
    summary = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"command": " ".join(command[1:]), "returncode": done.returncode, "summary": summary}


def run_calibrate(sizes: Sizes, device: str, out: Path, slug: str) -> dict:
    written = {}
    for name in sizes.models:
        started = time.perf_counter()
        calibration = calibrate_model(name, shape_of(name), device, sizes.rows, sizes.context, sizes.steps,
                                      sizes.max_prefill_tokens)
        path = out / f"gpu_calibration_{slug}_{name}.json"
        path.write_text(json.dumps({**calibration.table.to_json(), "notes": calibration.notes}, indent=1) + "\n")
        t = calibration.table
        print(f"\n{name}: decode step ms (rows x context), {time.perf_counter() - started:.0f} s -> {path}")
        print("rows  " + "".join(f"{c:>9d}" for c in t.context))
        for rows, line in zip(t.rows, t.decode_seconds):
            print(f"{rows:4d}  " + "".join(f"{1e3 * s:9.3f}" for s in line))
        written[name] = str(path)
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return written


def run_throughput(sizes: Sizes, device: str) -> dict:
    from gpu_throughput import compare_throughput
    from tailflow.engines.rollout.native import default_dtype

    model = build_model(shape_of(sizes.throughput_model), device, default_dtype(device))
    result = compare_throughput(model, device, sizes.throughput_requests, sizes.throughput_prompt,
                                sizes.throughput_cap, sizes.throughput_slots, lambda: synchronize(device))
    print(f"\n{sizes.throughput_model}: {result.describe()}")
    return {**asdict(result), "model": sizes.throughput_model, "speedup": result.speedup}


def run_rounds(sizes: Sizes, device: str) -> dict:
    from gpu_rounds import compare_rounds, describe
    from tailflow.engines.rollout import NativeEngine
    from tailflow.engines.rollout.native import default_dtype

    model = build_model(shape_of(sizes.rounds_model), device, default_dtype(device))
    engine = NativeEngine(model, sizes.rounds_slots, 4096 + sizes.rounds_cap, eos_token_ids=(), device=device)
    comparison = compare_rounds(engine, sizes.prompts_per_step, sizes.responses_kept, sizes.responses_launched,
                                sizes.prompt_ratio, sizes.rounds_cap, sizes.num_rounds, lambda: synchronize(device))
    print(f"\n{sizes.rounds_model}, P0={sizes.prompts_per_step} R0={sizes.responses_kept} launched "
          f"{sizes.responses_launched} ratio {sizes.prompt_ratio}, cap {sizes.rounds_cap} tokens:")
    print("\n".join(describe(comparison)))
    return {"model": sizes.rounds_model, "speedup": comparison.speedup,
            "sync": [asdict(r) for r in comparison.sync], "tail": [asdict(r) for r in comparison.tail]}


def run_turns(sizes: Sizes, device: str) -> dict:
    from gpu_turns import measure_turns

    model = build_model(shape_of(sizes.turns_model), "cpu", torch.float32)
    result = measure_turns(model, device, sizes.turns_slots, sizes.turns_max_seq_len, sizes.turns_requests,
                           sizes.turns_tokens, lambda: synchronize(device))
    print(f"\n{sizes.turns_model}, colocated turns on one {device}:")
    print("\n".join(result.describe()))
    return {"model": sizes.turns_model, **asdict(result)}


def results_dir(dry_run: bool) -> Path:
    """Where the files go when --out is not given."""
    if dry_run:
        return Path(tempfile.mkdtemp(prefix="gpu-evidence-dryrun-"))
    return REPO / "bench" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: checks the kit, proves nothing")
    parser.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/; with --dry-run a new temporary directory (a dry run's "
                             "numbers prove nothing and must not land among the results)")
    args = parser.parse_args(argv)
    args.out = args.out or results_dir(args.dry_run)
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; known: {', '.join(STAGES)}")
    device = args.device or ("cpu" if args.dry_run else "cuda")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA device: run with --dry-run (CPU, tiny shapes) or on a GPU")
    sizes = DRY if args.dry_run else FULL
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)  # tiny shapes are overhead-bound; more threads only contend
    slug = gpu_slug(device, args.dry_run)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"device {device} ({slug}), torch {torch.__version__}, stages {', '.join(stages)}", flush=True)
    record = {"device": slug, "torch": torch.__version__, "dry_run": args.dry_run}
    for stage in stages:
        started = time.perf_counter()
        if stage == "contract":
            record[stage] = run_contract(sizes)
        elif stage == "calibrate":
            record[stage] = run_calibrate(sizes, device, args.out, slug)
        elif stage == "throughput":
            record[stage] = run_throughput(sizes, device)
        elif stage == "rounds":
            record[stage] = run_rounds(sizes, device)
        else:
            record[stage] = run_turns(sizes, device)
        print(f"[{stage}] {time.perf_counter() - started:.1f} s", flush=True)
    path = args.out / f"gpu_evidence_{slug}_{'-'.join(stages)}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    failed = record.get("contract", {}).get("returncode", 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
