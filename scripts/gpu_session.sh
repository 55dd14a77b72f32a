#!/usr/bin/env bash
# A GPU session's device time, planned (bench/gpu_plan.py, docs/gpu.md): the evidence kit's stages in priority
# order, each in its own process under its own timeout, everything in one tar in $OUT (only 8 files of a device
# call come back). What a device call runs, with `carry: [".whl"]`:
#   scripts/gpu_session.sh                          # call 1: --budget 570, the stages that fit, in order
#   scripts/gpu_session.sh --budget 225 --stages calibrate,rounds    # call 2: what call 1 printed as left
#   scripts/gpu_session.sh --dry-run                # the plan and expected seconds per stage; runs nothing
# Arguments after `--` go to bench/gpu_evidence.py (`-- --dry-run`: every stage on tiny shapes on a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
exec python3 bench/gpu_plan.py "$@"
