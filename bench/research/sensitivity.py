"""How each paper prediction moves when one physical constant of the roofline moves by -30% and +30%.

The constants are `Efficiency`'s (tailflow/engines/sim/efficiency.py, each
with its source). Those that price rollout (HBM and compute efficiency, the
step overhead, the memory the engine may use, the straggler spread) run the
rounds again; those that price only the trainer (MFU, the overlap of FSDP's
collectives) reprice the same rounds. A prediction that moves little under
every constant is robust to what the model does not know; one that swings
with a constant is only as good as that constant.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Sequence

from research.paper import PaperSetting, SimulatedSetting, priced, simulate_setting

from tailflow.engines.sim.efficiency import Efficiency

FIELDS = tuple(f.name for f in fields(Efficiency) if f.name != "extra_forward_passes")
"""The continuous constants (the sensitivity table's rows)."""
TRAINER_ONLY = ("mfu", "dp_comm_overlap")
FACTORS = (0.7, 1.3)
PREDICTIONS: dict[str, Callable[[SimulatedSetting], float]] = {
    "rollout ratio": lambda s: s.rollout_ratio,
    "e2e (shares)": lambda s: s.e2e_speedup,
    "e2e (roofline)": lambda s: s.e2e_speedup_roofline,
}


@dataclass(frozen=True)
class Sensitivity:
    setting: str
    constant: str
    base_value: float
    predictions: dict[str, tuple[float, float, float]]
    """Prediction -> (at -30%, as shipped, at +30%)."""


def moved(efficiency: Efficiency, name: str, factor: float) -> Efficiency:
    """`name` times `factor`; a share stays within (0, 1] and a 0 moves by 0.3 absolute (up only)."""
    value = getattr(efficiency, name)
    new = value * factor if value else factor - 1.0
    if name in ("memory_efficiency", "compute_efficiency", "mfu", "gpu_memory_utilization", "dp_comm_overlap"):
        new = min(max(new, 0.0 if name == "dp_comm_overlap" else 0.01), 1.0)
    return replace(efficiency, **{name: new})


def sensitivity(settings: Sequence[PaperSetting], min_rounds: int, seed: int, prompts_per_step: int,
                progress: Callable[[str], None] = print) -> list[Sensitivity]:
    found = []
    for setting in settings:
        base = simulate_setting(setting, min_rounds, seed, prompts_per_step)
        for name in FIELDS:
            runs = []
            for factor in FACTORS:
                efficiency = moved(Efficiency(), name, factor)
                runs.append(priced(setting, base.sync, base.tail, efficiency) if name in TRAINER_ONLY else
                            simulate_setting(setting, min_rounds, seed, prompts_per_step, efficiency))
            found.append(Sensitivity(setting.name, name, getattr(Efficiency(), name), {
                label: (value(runs[0]), value(base), value(runs[1])) for label, value in PREDICTIONS.items()}))
            progress(f"  sensitivity {setting.name} {name}: done")
    return found


def print_table(rows: Sequence[Sensitivity]) -> float:
    """The table; returns the largest relative move of any prediction."""
    print(f"\n{'setting':10s}{'constant':24s}{'value':>8s}" + "".join(f"{label:>28s}" for label in PREDICTIONS))
    print(f"{'':42s}" + "".join(f"{'-30% / shipped / +30%':>28s}" for _ in PREDICTIONS))
    worst = 0.0
    for row in rows:
        cells = []
        for label in PREDICTIONS:
            low, mid, high = row.predictions[label]
            worst = max(worst, abs(low - mid) / mid, abs(high - mid) / mid)
            cells.append(f"{low:8.2f} /{mid:6.2f} /{high:6.2f}")
        print(f"{row.setting:10s}{row.constant:24s}{row.base_value:8.3g}" + "".join(f"{c:>28s}" for c in cells))
    return worst
