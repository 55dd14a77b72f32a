"""The GPU evidence kit: everything a lent GPU should prove about tailflow's rollout and trainer, in one command.

    python bench/gpu_evidence.py [--stages rope,trainer,...] [--dry-run] [--out DIR]

Stages (each prints its own table and a `[stage] N s` line; `bench/gpu_plan.py` runs them one process each, in
priority order, within a session's device time):
  contract    the engine contract suite (tests/test_engine_contract.py, tests/test_decode_graphs.py) on CUDA,
              and engine sleep / trainer offload (tests/test_engine_sleep.py, tests/test_trainer_offload.py)
  calibrate   decode/prefill step time of the native engine, rows x context, for Qwen2.5-0.5B/1.5B/7B shapes
              with random weights; writes gpu_calibration_<gpu>_<model>.json, the simulator's `measured` format
  throughput  our engine's useful tokens/s against transformers' generate() (Qwen2.5-0.5B shape, same lengths),
              within a time budget, printing each part as it ends
  rounds      tailflow's real tail-batching rounds on the GPU, lengths forced from the paper-like trace:
              synchronous rounds vs short + long rounds; prints RESULT rollout_speedup=<x>
  turns       colocated turns on one GPU (Qwen2.5-0.5B shape): memory the engine's sleep and the trainer's
              offload give back, what each move costs, and that a woken engine decodes as before
  rope        the engine's cos/sin tables and logits against Hugging Face's at positions up to 32k, bf16, with
              the pre-fix table as a control (gpu_rope.py)
  trainer     FSDP2 (mesh of one) and Megatron-core TP 1 on the 0.5B shape: step time, peak memory, agreement
              within the CPU alignment test's tolerances, the stream trainer's gradient, weight sync (gpu_trainer.py)
  offload     the trainer's offload and reload, blocking beside staged through pinned memory, and raw copies
              (gpu_offload.py)
  graphs      the sleep/wake token difference with CUDA graphs: state or numerics (gpu_graphs.py)

Needs torch and transformers, plus pydantic (tail state, config), pytest (contract; the trainer stage imports
the alignment test's tolerances) and megatron-core (trainer; without it the stage runs FSDP2 only and says so);
never Ray, Prefect or a network. `--dry-run` runs every stage on tiny shapes on the CPU (a test does, so the kit
cannot rot).
Writes gpu_evidence_<gpu>.json (every number printed) beside the calibration files: in `--out`, by default
bench/results/, or a new temporary directory for a dry run (its path is printed).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]
sys.path.append(str(REPO / "tests"))  # last: the trainer stage imports the alignment test's tolerances

import torch  # noqa: E402

from gpu_calibration import QWEN25, TINY, build_model, calibrate_model, synchronize  # noqa: E402

STAGES = ("contract", "calibrate", "throughput", "rounds", "turns", "rope", "trainer", "offload", "graphs")


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
    throughput_budget_s: float
    rope_model: str
    rope_prompts: tuple[int, ...]
    rope_new_tokens: int
    trainer_model: str
    trainer_samples: int
    trainer_steps: int
    trainer_prompt: tuple[int, int]
    trainer_response: tuple[int, int]
    trainer_micro_tokens: int
    stream_pieces: int
    offload_model: str
    offload_buffer_bytes: int
    graphs_model: str
    graphs_slots: int
    graphs_max_seq_len: int
    graphs_requests: int
    graphs_prompt: int
    graphs_tokens: int


FULL = Sizes(models=tuple(QWEN25), rows=(1, 4, 16, 64, 256), context=(512, 1024, 2048, 4096, 8192), steps=10,
             max_prefill_tokens=65536, throughput_model="qwen2.5-0.5b", throughput_requests=128,
             throughput_prompt=256, throughput_cap=1024, throughput_slots=64, rounds_model="qwen2.5-0.5b",
             prompts_per_step=8, responses_kept=8, responses_launched=10, prompt_ratio=1.25, rounds_cap=4096,
             rounds_slots=128, num_rounds=5, turns_model="qwen2.5-0.5b", turns_slots=64,
             # Two trainers stepping alike are bit-equal on a CPU, not on CUDA (atomic adds in the embedding's
             # backward): those two cases are left to the CPU; `turns` and `offload` measure the CUDA offload itself.
             contract_filter="not offloading_between_steps_changes_nothing and not staged_moves_swap_in_real_copies",
             turns_max_seq_len=2048, turns_requests=16, turns_tokens=64,
             throughput_budget_s=75.0, rope_model="qwen2.5-0.5b", rope_prompts=(1024, 8192, 16384, 32704),
             rope_new_tokens=64, trainer_model="qwen2.5-0.5b", trainer_samples=32, trainer_steps=3,
             trainer_prompt=(64, 256), trainer_response=(64, 512), trainer_micro_tokens=4096, stream_pieces=4,
             offload_model="qwen2.5-0.5b", offload_buffer_bytes=2**30, graphs_model="qwen2.5-0.5b",
             graphs_slots=64, graphs_max_seq_len=2048, graphs_requests=16,
             graphs_prompt=16, graphs_tokens=64)
DRY = Sizes(models=("tiny",), rows=(1, 2), context=(16, 32), steps=3, max_prefill_tokens=32,
            throughput_model="tiny", throughput_requests=6, throughput_prompt=8, throughput_cap=64, throughput_slots=4,
            rounds_model="tiny", prompts_per_step=2, responses_kept=2, responses_launched=3, prompt_ratio=1.5,
            rounds_cap=24, rounds_slots=16, num_rounds=3, turns_model="tiny", turns_slots=4, turns_max_seq_len=64,
            turns_requests=3, turns_tokens=8,
            contract_filter="(OnCPU and qwen3 and greedy) or (test_engine_sleep and woke and qwen3) or park",
            throughput_budget_s=60.0, rope_model="tiny", rope_prompts=(16, 1000, 4000), rope_new_tokens=4,
            trainer_model="tiny", trainer_samples=6, trainer_steps=2, trainer_prompt=(3, 10), trainer_response=(1, 20),
            trainer_micro_tokens=64, stream_pieces=2, offload_model="tiny", offload_buffer_bytes=2**20,
            graphs_model="tiny", graphs_slots=4, graphs_max_seq_len=64, graphs_requests=4,
            graphs_prompt=8, graphs_tokens=8)


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
        del calibration
        gc.collect()  # the engines' graphs and caches sit in reference cycles: 7B found 37 of 140 GiB free without this
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return written


def run_throughput(sizes: Sizes, device: str) -> dict:
    from gpu_throughput import compare_throughput
    from tailflow.engines.rollout.native import default_dtype

    model = build_model(shape_of(sizes.throughput_model), device, default_dtype(device))
    result = compare_throughput(model, device, sizes.throughput_requests, sizes.throughput_prompt,
                                sizes.throughput_cap, sizes.throughput_slots, lambda: synchronize(device),
                                budget_s=sizes.throughput_budget_s, report=lambda line: print(line, flush=True))
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


def run_rope(sizes: Sizes, device: str) -> dict:
    from gpu_rope import measure_rope

    model = build_model(shape_of(sizes.rope_model), device, torch.float32)  # the engine rounds it to bf16
    result = measure_rope(model, device, sizes.rope_prompts, sizes.rope_new_tokens)
    print(f"\n{sizes.rope_model}, rope on {device}:")
    print("\n".join(result.describe()))
    return {"model": sizes.rope_model, **result.to_json()}


def run_trainer(sizes: Sizes, device: str) -> dict:
    from gpu_trainer import measure_trainer, random_batches

    shape = shape_of(sizes.trainer_model)
    batches = random_batches(sizes.trainer_samples, sizes.trainer_steps, sizes.trainer_prompt,
                             sizes.trainer_response, shape["vocab_size"])
    result = measure_trainer(lambda: build_model(shape, device, torch.float32), device, batches,
                             sizes.trainer_micro_tokens, sizes.stream_pieces, lambda: synchronize(device))
    print(f"\n{sizes.trainer_model}, the trainer on {device}:")
    print("\n".join(result.describe()))
    return {"model": sizes.trainer_model, **result.to_json()}


def turns_trainer(shape: dict, device: str):
    """A `PolicyTrainer` (world size 1, unsharded) of `shape` with random weights, configured as the turns stage
    has it."""
    from tailflow.config import TrainConfig
    from tailflow.engines.train.trainer import PolicyTrainer

    with tempfile.TemporaryDirectory() as directory:
        model = build_model(shape, device, torch.float32)
        model.save_pretrained(directory)
        del model
        return PolicyTrainer(directory, TrainConfig(lr=1e-6, max_tokens_per_micro_batch=4096))


def trainer_samples(sizes: Sizes, vocab: int) -> list:
    from gpu_trainer import random_batches

    return random_batches(sizes.trainer_samples, 1, sizes.trainer_prompt, sizes.trainer_response, vocab)[0]


def run_offload(sizes: Sizes, device: str) -> dict:
    from gpu_offload import measure_offload
    from tailflow.engines.train.batch import count_response_tokens

    shape = shape_of(sizes.offload_model)
    trainer = turns_trainer(shape, device)
    samples = trainer_samples(sizes, shape["vocab_size"])
    result = measure_offload(trainer, samples, count_response_tokens(samples), sizes.offload_buffer_bytes,
                             lambda: synchronize(device))
    print(f"\n{sizes.offload_model}, trainer offload on {device}:")
    print("\n".join(result.describe()))
    return {"model": sizes.offload_model, **asdict(result)}


def run_graphs(sizes: Sizes, device: str) -> dict:
    from gpu_graphs import measure_graphs
    from tailflow.engines.rollout.native import default_dtype

    from tailflow.engines.train.batch import count_response_tokens

    shape = shape_of(sizes.graphs_model)

    def trainer_turn():
        """What the turns stage did while the engine slept: a trainer's step, then its offload."""
        trainer = turns_trainer(shape, device)
        samples = trainer_samples(sizes, shape["vocab_size"])
        trainer.train_step(samples, count_response_tokens(samples))
        trainer.offload()
        return trainer

    model = build_model(shape, device, default_dtype(device))
    result = measure_graphs(model, device, sizes.graphs_slots, sizes.graphs_max_seq_len, sizes.graphs_requests,
                            sizes.graphs_prompt, sizes.graphs_tokens, between=trainer_turn)
    print(f"\n{sizes.graphs_model}, sleep / wake with CUDA graphs on {device}:")
    print("\n".join(result.describe()))
    return {"model": sizes.graphs_model, **result.to_json()}


RUNNERS = {"throughput": run_throughput, "rounds": run_rounds, "turns": run_turns, "rope": run_rope,
           "trainer": run_trainer, "offload": run_offload, "graphs": run_graphs}
"""stage -> run(sizes, device); contract and calibrate, which take other arguments, are called by `main`."""


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
    path = args.out / f"gpu_evidence_{slug}_{'-'.join(stages)}.json"
    errors = []
    for stage in stages:
        started = time.perf_counter()
        try:
            if stage == "contract":
                record[stage] = run_contract(sizes)
            elif stage == "calibrate":
                record[stage] = run_calibrate(sizes, device, args.out, slug)
            else:
                record[stage] = RUNNERS[stage](sizes, device)
        except Exception as error:  # one stage's failure is its result; the next stage still runs
            traceback.print_exc()
            record[stage] = {"error": f"{type(error).__name__}: {error}"}
            errors.append(stage)
        print(f"[{stage}] {time.perf_counter() - started:.1f} s", flush=True)
        path.write_text(json.dumps(record, indent=1) + "\n")  # after every stage: a killed run keeps the rest
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    print(f"wrote {path}" + (f"; stages that raised: {', '.join(errors)}" if errors else ""))
    failed = record.get("contract", {}).get("returncode", 0)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
