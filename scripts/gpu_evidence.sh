#!/usr/bin/env bash
# The GPU evidence kit, as run on a lent GPU machine (docs/gpu.md):
#   scripts/gpu_evidence.sh [STAGES] [more bench/gpu_evidence.py arguments]
# STAGES: comma-separated of contract,calibrate,throughput,rounds,turns,rope,trainer,offload,graphs (default: the
# first five; each prints its own table). A whole session's stages, planned and timed: scripts/gpu_session.sh.
# Installs the carried wheels (scripts/gpu_env.sh). Results go to $OUT (the device tool's folder that comes back)
# if set, else bench/results/ (a temporary directory for --dry-run); the whole printout is also written there as
# gpu_evidence_<stages>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
stages="${1:-contract,calibrate,throughput,rounds,turns}"
case " ${*:2} " in
  *" --dry-run "*) out="${OUT:-$(mktemp -d -t gpu-evidence-dryrun-XXXXXX)}" ;;  # a dry run proves nothing: not among the results
  *) out="${OUT:-bench/results}" ;;
esac
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
set -o pipefail
python3 bench/gpu_evidence.py --stages "$stages" --out "$out" "${@:2}" 2>&1 | tee "$out/gpu_evidence_${stages//,/-}.log"
