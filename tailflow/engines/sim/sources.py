"""Where `tailflow plan` gets its lengths: a run in the store, a trace file, RollPacker's logs, or the generator."""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.track.rollout_trace import TraceError, TraceRound


@dataclass(frozen=True)
class LengthSpec:
    """Exactly one of run_id, trace_path, rollpacker_path, paper_prompts."""

    run_id: str | None = None
    storage_uri: str = "runs"
    trace_path: str | None = None
    rollpacker_path: str | None = None
    paper_prompts: int | None = None
    """The paper-like generator with this many synthetic prompts."""
    max_new_tokens: int | None = None
    """The cap: required for the generator; optional for RollPacker logs (default: their longest response)."""
    seed: int = 0

    def check(self) -> None:
        given = [name for name in ("run_id", "trace_path", "rollpacker_path", "paper_prompts") if getattr(self, name)]
        if len(given) != 1:
            raise TraceError("give exactly one of --run, --trace, --rollpacker, --paper "
                             f"(got {', '.join(given) or 'none'})")
        if self.paper_prompts and not self.max_new_tokens:
            raise TraceError("--paper needs --max-new-tokens (the response cap, e.g. 16384)")


def load_lengths(spec: LengthSpec) -> tuple[LengthSource, str]:
    """The source and one line saying what it is."""
    from tailflow.engines.sim.paper_lengths import PaperLikeLengths
    from tailflow.engines.sim.rollpacker import read_rollpacker_lengths
    from tailflow.engines.sim.trace import pools_from_trace
    from tailflow.engines.track.rollout_trace import read_trace

    spec.check()
    if spec.paper_prompts:
        lengths = PaperLikeLengths(spec.paper_prompts, spec.max_new_tokens, spec.seed)
        return lengths, lengths.describe()
    if spec.rollpacker_path:
        pools = read_rollpacker_lengths(spec.rollpacker_path, spec.max_new_tokens, spec.seed)
        return pools, f"RollPacker length log {spec.rollpacker_path} ({len(pools.pools)} prompts)"
    if spec.trace_path:
        rounds, where = read_trace(spec.trace_path), spec.trace_path
    else:
        rounds, where = run_trace(spec.run_id, spec.storage_uri), f"run {spec.run_id}"
    pools = pools_from_trace(rounds, spec.seed, where)
    return pools, f"{where}: {len(rounds)} rounds, {len(pools.pools)} prompts, cap {pools.max_new_tokens}"


def run_trace(run_id: str, storage_uri: str):
    from tailflow.engines.track.rollout_trace import RolloutTraceLog
    from tailflow.engines.store import open_store

    log = RolloutTraceLog(open_store(storage_uri), run_id)
    try:
        return log.rounds()
    except FileNotFoundError:
        raise TraceError(f"run {run_id}: no {log.key} in {storage_uri} (a run before traces, or "
                         "storage.rollout_trace: false)") from None


def run_policy_sizes(run_id: str, storage_uri: str) -> tuple[int, int]:
    """(P0, R0) from the run's saved config."""
    import yaml

    from tailflow.config import config_from_dict
    from tailflow.engines.runs.layout import config_key
    from tailflow.engines.store import open_store

    store = open_store(storage_uri)
    key = config_key(run_id)
    if not store.exists(key):
        raise TraceError(f"run {run_id}: no {key} in {storage_uri}")
    config = config_from_dict(yaml.safe_load(store.read_text(key)) or {}, source=key)
    return config.data.prompts_per_step, config.rollout.n


def policy_sizes(spec: LengthSpec, prompts_per_step: int | None, responses_kept: int | None) -> tuple[int, int]:
    """P0 and R0 to plan for: as given, else the run's own config, else the paper's (128, 8) for the generator
    and RollPacker logs, and tailflow's defaults (32, 8) for a trace file."""
    if spec.run_id:
        default = run_policy_sizes(spec.run_id, spec.storage_uri)
    elif spec.trace_path:
        default = (32, 8)
    else:
        default = (128, 8)
    return prompts_per_step or default[0], responses_kept or default[1]


def longest_request(lengths: LengthSource) -> int:
    """Prompt + cap of the longest request the source can make: what one replica's KV budget must hold."""
    return max(lengths.prompt_tokens(p) for p in lengths.problem_ids()) + lengths.max_new_tokens


def env_trace(path: str, prompts_per_step: int | None, responses_kept: int | None
              ) -> tuple[list[TraceRound], str, int, int]:
    """`--env-trace`: a rollout_trace.jsonl file, or a run folder holding one (every iteration's last row, as the
    run's log reads it), or round dumps (storage.dump_rounds): one `rounds/iter-NNNN.json`, or a run's `rounds/`
    folder (every dump in it, each its iteration's kept trajectories). Its rounds, the source's name, and (P0,
    R0): as given, else the run folder's own config's, else tailflow's defaults (32, 8)."""
    from pathlib import Path

    from tailflow.engines.runs.layout import config_key, rollout_trace_key
    from tailflow.engines.track.rollout_trace import read_trace

    folder = Path(path)
    run_folder: Path | None = None
    if folder.is_dir() and folder.name == "rounds":
        dumps = sorted(folder.glob("iter-*.json"))
        if not dumps:
            raise TraceError(f"{folder}: no round dumps (iter-NNNN.json) in it")
        rounds, where, run_folder = [dumped_round(dump) for dump in dumps], str(folder), folder.parent
    elif folder.is_dir():
        run_id, storage_uri = folder.name, str(folder.parent)
        rounds, where, run_folder = run_trace(run_id, storage_uri), str(folder.parent / rollout_trace_key(run_id)), \
            folder
    elif folder.suffix == ".json":
        rounds, where = [dumped_round(folder)], str(folder)
        run_folder = folder.parent.parent if folder.parent.name == "rounds" else None
    else:
        rounds, where = read_trace(folder), str(folder)
    default = (32, 8)
    if run_folder is not None and (run_folder.parent / config_key(run_folder.name)).exists():
        default = run_policy_sizes(run_folder.name, str(run_folder.parent))
    return rounds, where, prompts_per_step or default[0], responses_kept or default[1]


def dumped_round(path) -> TraceRound:
    """A round dump's kept trajectories as a trace round; a TraceError naming the file if it cannot be read."""
    from tailflow.engines.runs.round_dump import parse_round_dump, round_as_trace

    try:
        return round_as_trace(parse_round_dump(path.read_bytes(), str(path)))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such round dump") from None
    except ValueError as error:
        raise TraceError(str(error)) from None
