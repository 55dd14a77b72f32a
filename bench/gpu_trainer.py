"""The `trainer` stage: the trainer side on one GPU, which has never run on one.

From one random model of the 0.5B shape, saved once, two trainers take the
same `steps` batches (decoupled_ppo, whose loss reads the model's log-probs):

* FSDP2 over a mesh of one (NCCL on a GPU, gloo on a CPU): the sharded code
  path (`fsdp_mesh_of_one`), which a one-rank run never takes;
* Megatron-core at tensor parallel 1 (the carried wheel on the GPU machine).

For each: build seconds, every step's seconds, peak device memory over the
steps, the stats, and the weight sync into a native engine on the same device
(bf16 on CUDA): the gather (`full_state_dict`, to host memory) and the load
(`load_weights`), each in seconds per GB of the gathered fp32 weights, and
whether the engine then holds exactly those weights rounded to its dtype.

Then, as the CPU test does (tests/test_megatron_alignment.py, whose
tolerances and check are imported, not copied): Megatron's loss, grad norm
and entropy at every step and its weights after the last within the
tolerances of FSDP2's. On the FSDP2 trainer afterwards: the stream trainer's
gradient (`accumulate` in pieces, `finish_step`) against the full step's
(`train_step`), both taken as AdamW is about to step (lr 0, so the weights
stay put), and one offload and reload through `StagedMoves` that must give
back every tensor bit for bit (FSDP2's DTensors, which the offload stage's
unsharded trainer does not have).
"""
from __future__ import annotations

import gc
import importlib
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch

from gpu_offload import local, measure_round
from tailflow.config import TrainConfig
from tailflow.engines.train.batch import TrainSample, count_response_tokens
from tailflow.engines.train.host_moves import StagedMoves
from tailflow.engines.train.trainer import PolicyTrainer

LR = 2e-4


@dataclass(frozen=True)
class WeightSync:
    gigabytes: float
    gather_s: float
    load_s: float
    exact: bool
    """The engine's weights equal the gathered ones rounded to its dtype, every tensor."""

    @property
    def gather_s_per_gb(self) -> float:
        return self.gather_s / self.gigabytes

    @property
    def load_s_per_gb(self) -> float:
        return self.load_s / self.gigabytes


@dataclass
class BackendRun:
    backend: str
    build_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    peak_mib: float | None = None
    """Peak device memory over the steps above what was allocated before the trainer was built (the engine's)."""
    steps: list[dict] = field(default_factory=list)
    """pg_loss, grad_norm, entropy per step."""
    sync: WeightSync | None = None


@dataclass(frozen=True)
class StreamCheck:
    pieces: int
    full_grad_norm: float
    relative_diff: float
    """||g_stream - g_full|| / ||g_full|| over every gradient, unclipped."""
    max_abs_diff: float


@dataclass
class TrainerResult:
    device: str
    fsdp2: BackendRun
    megatron: BackendRun | None
    megatron_missing: str | None
    """Why Megatron did not run (megatron-core not importable), or None."""
    misalignments: list[str]
    stream: StreamCheck
    fsdp2_offload_exact: bool
    fsdp2_offload_gb_s: tuple[float, float]
    """(offload, reload) GB/s of that round trip."""

    @property
    def aligned(self) -> bool | None:
        return None if self.megatron is None else not self.misalignments

    def describe(self) -> list[str]:
        lines = []
        for run in (self.fsdp2, self.megatron):
            if run is None:
                lines.append(f"megatron: not run ({self.megatron_missing})")
                continue
            peak = "-" if run.peak_mib is None else f"{run.peak_mib:,.0f} MiB"
            lines.append(f"{run.backend}: built in {run.build_s:.1f} s; steps "
                         + ", ".join(f"{s:.2f}" for s in run.step_s) + f" s; peak {peak}")
            for index, step in enumerate(run.steps):
                lines.append(f"  step {index}: pg_loss {step['pg_loss']:.6g} grad_norm {step['grad_norm']:.6g} "
                             f"entropy {step['entropy']:.6g}")
            sync = run.sync
            lines.append(f"  weight sync of {sync.gigabytes:.2f} GB: gather {sync.gather_s:.2f} s "
                         f"({sync.gather_s_per_gb:.2f} s/GB), load into the engine {sync.load_s:.2f} s "
                         f"({sync.load_s_per_gb:.2f} s/GB), engine holds exactly those weights: {sync.exact}")
        lines.append(f"megatron within the CPU alignment test's tolerances of FSDP2: {self.aligned}"
                     + "".join(f"\n  {line}" for line in self.misalignments))
        s = self.stream
        lines.append(f"stream trainer ({s.pieces} pieces) vs full step: gradient relative diff {s.relative_diff:.3g}, "
                     f"max |diff| {s.max_abs_diff:.3g} (grad norm {s.full_grad_norm:.4g})")
        lines.append(f"FSDP2 staged offload + reload bit for bit: {self.fsdp2_offload_exact} "
                     f"({self.fsdp2_offload_gb_s[0]:.2f} / {self.fsdp2_offload_gb_s[1]:.2f} GB/s)")
        lines.append(f"RESULT trainer_aligned={self.aligned} stream_rel_diff={s.relative_diff:.3g} "
                     f"offload_exact={self.fsdp2_offload_exact}")
        return lines

    def to_json(self) -> dict:
        return {**asdict(self), "aligned": self.aligned}


def random_batches(count: int, num_batches: int, prompt_range: tuple[int, int], response_range: tuple[int, int],
                   vocab: int, seed: int = 0) -> list[list[TrainSample]]:
    """Samples over the whole vocabulary, advantages of both signs, each response token's rollout log-prob -3.0
    at temperature 1 (decoupled_ppo's behaviour policy), as tests/random_samples.py makes them."""
    rng = random.Random(seed)
    batches = []
    for _ in range(num_batches):
        batch = []
        for _ in range(count):
            prompt = tuple(rng.randrange(1, vocab) for _ in range(rng.randint(*prompt_range)))
            response = tuple(rng.randrange(1, vocab) for _ in range(rng.randint(*response_range)))
            batch.append(TrainSample(prompt, response, rng.choice((-1.0, 0.5, 1.0)), tuple(-3.0 for _ in response),
                                     rollout_temperature=1.0))
        batches.append(batch)
    return batches


def train_config(backend: str, micro_batch_tokens: int) -> TrainConfig:
    return TrainConfig(backend=backend, tensor_parallel=1, num_workers=1, loss="decoupled_ppo", lr=LR,
                       max_grad_norm=1.0, max_tokens_per_micro_batch=micro_batch_tokens)


def run_backend(name: str, model_dir: str, config: TrainConfig, batches, engine, version: int, synchronize,
                gather_initial: bool = False, **trainer_kwargs) -> tuple[BackendRun, PolicyTrainer, dict | None, dict]:
    """Build, step through `batches`, sync the weights into `engine`: the run, the trainer, and its gathered
    weights before the first step (`gather_initial`, else None) and after the last."""
    run = BackendRun(name)
    cuda = torch.cuda.is_available()
    baseline = torch.cuda.memory_allocated() if cuda else 0
    started = time.perf_counter()
    trainer = PolicyTrainer(model_dir, config, **trainer_kwargs)
    synchronize()
    run.build_s = time.perf_counter() - started
    initial = trainer.full_state_dict() if gather_initial else None
    if cuda:
        torch.cuda.reset_peak_memory_stats(trainer.device)
    for samples in batches:
        started = time.perf_counter()
        stats = trainer.train_step(samples, count_response_tokens(samples), len(samples))
        synchronize()
        run.step_s.append(time.perf_counter() - started)
        run.steps.append(dict(pg_loss=stats.pg_loss, grad_norm=stats.grad_norm, entropy=stats.entropy))
    run.peak_mib = (torch.cuda.max_memory_allocated(trainer.device) - baseline) / 2**20 if cuda else None
    run.sync, weights = sync_weights(trainer, engine, version, synchronize)
    return run, trainer, initial, weights


def sync_weights(trainer, engine, version: int, synchronize) -> tuple[WeightSync, dict]:
    started = time.perf_counter()
    weights = trainer.full_state_dict()
    gather_s = time.perf_counter() - started
    size = sum(t.numel() * t.element_size() for t in weights.values()) / 1e9
    synchronize()
    started = time.perf_counter()
    engine.load_weights(weights, version)
    synchronize()
    load_s = time.perf_counter() - started
    own = engine.runner.model.state_dict()
    exact = all(torch.equal(own[name], tensor.to(device=own[name].device, dtype=own[name].dtype))
                for name, tensor in weights.items())
    return WeightSync(size, gather_s, load_s, exact), weights


def flat_gradients(trainer) -> torch.Tensor:
    return torch.cat([local(p.grad).detach().reshape(-1).float() for p in trainer.model.parameters()
                      if p.grad is not None])


def stream_check(trainer, samples: list[TrainSample], pieces: int) -> StreamCheck:
    """The gradient of a streamed step against the full step's, on the same weights (lr 0 keeps them)."""
    captured = []
    hook = trainer.optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: captured.append(
        flat_gradients(trainer)))
    lrs = [group["lr"] for group in trainer.optimizer.param_groups]
    for group in trainer.optimizer.param_groups:
        group["lr"] = 0.0
    try:
        total, count = count_response_tokens(samples), len(samples)
        full = trainer.train_step(samples, total, count)
        size = -(-len(samples) // pieces)
        for start in range(0, len(samples), size):
            trainer.accumulate(samples[start:start + size])
        streamed = trainer.finish_step(total, count)
    finally:
        hook.remove()
        for group, lr in zip(trainer.optimizer.param_groups, lrs):
            group["lr"] = lr
    # both were clipped to max_grad_norm by their own norm before AdamW: undo that to compare raw gradients
    max_norm = trainer.train.max_grad_norm
    raw = [g / min(1.0, max_norm / (stats.grad_norm + 1e-6)) for g, stats in zip(captured, (full, streamed))]
    diff = raw[1] - raw[0]
    return StreamCheck(pieces, full.grad_norm, (diff.norm() / raw[0].norm()).item(), diff.abs().max().item())


def release() -> None:
    """Collect what the caller dropped and give its device memory back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_trainer(make_model, device: str, batches, micro_batch_tokens: int, stream_pieces: int,
                    synchronize) -> TrainerResult:
    """`make_model()`: a random fp32 model (any device), saved once and dropped; both trainers and the engine
    load it from there."""
    from test_megatron_alignment import STAT_REL_TOL, misalignments

    from tailflow.engines.rollout import NativeEngine

    with tempfile.TemporaryDirectory() as model_dir:
        model = make_model()
        model.save_pretrained(model_dir)
        del model
        release()
        engine = NativeEngine.from_pretrained(model_dir, num_slots=1, max_seq_len=64, eos_token_ids=(),
                                              device=device)
        fsdp2, trainer, initial, fsdp2_weights = run_backend("fsdp2 (mesh of one)", model_dir, train_config(
            "fsdp2", micro_batch_tokens), batches, engine, 1, synchronize, gather_initial=True, fsdp_mesh_of_one=True)
        stream = stream_check(trainer, batches[0], stream_pieces)
        offload = measure_round(trainer, "staged", StagedMoves() if trainer.device.type == "cuda"
                                else StagedMoves(copy=torch.Tensor.clone), 1, synchronize)
        del trainer
        release()
        megatron, missing, found = None, None, []
        try:
            importlib.import_module("megatron.core")
        except ImportError as error:
            missing = f"megatron-core not importable: {error}"
        if missing is None:
            megatron, trainer, _, megatron_weights = run_backend("megatron tp1", model_dir, train_config(
                "megatron", micro_batch_tokens), batches, engine, 2, synchronize)
            del trainer
            release()
            for index, (ref, got) in enumerate(zip(fsdp2.steps, megatron.steps)):
                for name in ("pg_loss", "grad_norm", "entropy"):
                    if abs(got[name] - ref[name]) > STAT_REL_TOL * max(abs(ref[name]), 1e-3):
                        found.append(f"step {index} {name}: {got[name]!r} vs {ref[name]!r}")
            last = len(batches) - 1
            found += [line.replace("step 0 weights", f"step {last} weights") for line in misalignments(
                {"initial": initial, "steps": [{**fsdp2.steps[-1], "weights": fsdp2_weights}]},
                {"steps": [{**megatron.steps[-1], "weights": megatron_weights}]}, LR) if "weights" in line]
    return TrainerResult(device, fsdp2, megatron, missing, found, stream, offload.exact,
                         (offload.offload_gb_s, offload.reload_gb_s))
