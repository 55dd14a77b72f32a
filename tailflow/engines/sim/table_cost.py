"""Cost models read from a calibration file: `cpu` (this machine's native engine) and `measured` (a GPU).

One JSON format for both, written by `tailflow calibrate` on CPU and by the
GPU calibration (issue 15) on a lent GPU:

    {"format": "tailflow-step-costs/1",
     "kind": "cpu" | "measured",
     "device": "2-core CPU, torch 2.13.0+cpu", "engine": "native", "model": "<path or preset>", "tp": 1,
     "attention": "padded" | "paged",
     "rows": [1, 4, ...], "context": [16, 64, ...],
     "decode_seconds": [[...], ...], "prefill_seconds": [[...], ...],
     "kv_budget_tokens": null | int, "train_s_per_token": null | float, "weight_sync_s": null | float}

What each field means, and the bilinear interpolation: docs/simulator.md
(`cpu` and `measured`). Prefill is a table, not a line: attention makes it
superlinear in length. Below the grid's smallest point the cost is that point's.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from tailflow.engines.sim.costs import CostModel, CostModelError

FORMAT = "tailflow-step-costs/1"


@dataclass(frozen=True)
class StepCostTable:
    kind: str
    device: str
    engine: str
    model: str
    tp: int
    attention: str
    rows: tuple[int, ...]
    context: tuple[int, ...]
    decode_seconds: tuple[tuple[float, ...], ...]
    prefill_seconds: tuple[tuple[float, ...], ...]
    kv_budget_tokens: int | None = None
    train_s_per_token: float | None = None
    weight_sync_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's fields in the schema's order (the tuples are written as JSON lists)."""
        return {"format": FORMAT, **asdict(self)}


def read_table(path: str | Path) -> StepCostTable:
    """Parse and check a calibration file; any problem is one line naming the file and the field."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CostModelError(f"{path}: no such calibration file") from None
    except (OSError, json.JSONDecodeError) as error:
        raise CostModelError(f"{path}: not a JSON calibration file ({error})") from None

    def field(name: str, parent: dict = None) -> Any:
        holder = data if parent is None else parent
        if not isinstance(holder, dict) or name not in holder:
            raise CostModelError(f"{path}: missing field {name!r}")
        return holder[name]

    if field("format") != FORMAT:
        raise CostModelError(f"{path}: field 'format' is {data['format']!r}, expected {FORMAT!r}")
    rows, context = field("rows"), field("context")
    check_axis(path, "rows", rows)
    check_axis(path, "context", context)
    decode = check_grid(path, "decode_seconds", field("decode_seconds"), len(rows), len(context), positive=True)
    prefill = check_grid(path, "prefill_seconds", field("prefill_seconds"), len(rows), len(context), positive=False)
    attention = data.get("attention", "padded")
    if attention not in ("padded", "paged"):
        raise CostModelError(f"{path}: field 'attention' must be 'padded' or 'paged', got {attention!r}")
    return StepCostTable(
        kind=data.get("kind", "measured"), device=str(data.get("device", "?")), engine=str(data.get("engine", "?")),
        model=str(data.get("model", "?")), tp=int(data.get("tp", 1)), attention=attention,
        rows=tuple(rows), context=tuple(context), decode_seconds=decode, prefill_seconds=prefill,
        kv_budget_tokens=data.get("kv_budget_tokens"), train_s_per_token=data.get("train_s_per_token"),
        weight_sync_s=data.get("weight_sync_s"))


def check_axis(path: Path, name: str, values: Any) -> None:
    if (not isinstance(values, list) or len(values) < 2 or any(not isinstance(v, int) or v < 1 for v in values)
            or values != sorted(set(values))):
        raise CostModelError(f"{path}: field {name!r} must be >= 2 increasing positive integers, got {values!r}")


def check_grid(path: Path, name: str, grid: Any, num_rows: int, num_context: int,
               positive: bool) -> tuple[tuple[float, ...], ...]:
    shaped = isinstance(grid, list) and len(grid) == num_rows and all(
        isinstance(line, list) and len(line) == num_context for line in grid)
    if not shaped:
        raise CostModelError(f"{path}: field {name!r} must be {num_rows} lists (one per rows value) of "
                             f"{num_context} numbers (one per context value)")
    if any(not isinstance(x, (int, float)) or x < 0 or (positive and x == 0) for line in grid for x in line):
        raise CostModelError(f"{path}: field {name!r} must hold {'positive' if positive else 'non-negative'} seconds")
    return tuple(tuple(float(x) for x in line) for line in grid)


def bilinear(grid: Sequence[Sequence[float]], rows: Sequence[int], context: Sequence[int], num_rows: float,
             per_row: float) -> float:
    i, wi = interpolate(rows, num_rows)
    j, wj = interpolate(context, per_row)

    def at(row: int) -> float:
        return (1 - wj) * grid[row][j] + wj * grid[row][j + 1]

    return max((1 - wi) * at(i) + wi * at(i + 1), 0.0)


def interpolate(axis: Sequence[int], x: float) -> tuple[int, float]:
    """(segment index i, weight w) so the value is (1-w) * at[i] + w * at[i+1]; w > 1 extrapolates the last segment."""
    if x <= axis[0]:
        return 0, 0.0
    i = min(bisect.bisect_right(axis, x) - 1, len(axis) - 2)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


class TableCost(CostModel):
    def __init__(self, table: StepCostTable) -> None:
        self.table = table

    @classmethod
    def from_file(cls, path: str | Path) -> "TableCost":
        return cls(read_table(path))

    def decode_s(self, num_rows: int, context_tokens: int, max_context: int) -> float:
        if num_rows == 0:
            return 0.0
        t = self.table
        per_row = max_context if t.attention == "padded" else context_tokens / num_rows
        return bilinear(t.decode_seconds, t.rows, t.context, num_rows, per_row)

    def prefill_s(self, num_tokens: int, num_seqs: int) -> float:
        if num_tokens <= 0 or num_seqs <= 0:
            return 0.0
        t = self.table
        return bilinear(t.prefill_seconds, t.rows, t.context, num_seqs, num_tokens / num_seqs)

    def describe(self) -> str:
        t = self.table
        return f"{t.kind}: {t.engine} engine on {t.device}, model {t.model}, TP {t.tp} ({t.attention} attention)"
