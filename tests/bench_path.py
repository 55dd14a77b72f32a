"""Puts bench/ on sys.path (at the end, so nothing there shadows an installed name): tests import the research
predictions the product does not run (`from research.spot import ...`), as the benches do."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.append(str(BENCH_DIR))
