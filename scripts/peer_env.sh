#!/usr/bin/env bash
# The peer benchmark's TRL environment (bench/peer.py), never part of the default install.
#
#   scripts/peer_env.sh [VENV_DIR]        # default /work/venvs/trl; then: python bench/peer.py --trl-python VENV_DIR/bin/python
#
# A virtualenv that sees the system's packages (--system-site-packages): the TRL side of the benchmark imports
# tailflow's own task and reward code (so both sides train on the same prompts with the same reward), which
# needs tailflow's dependencies; TRL and what it pulls in (accelerate, datasets) go into the venv only. torch
# and transformers are pinned to the versions the benchmark was written against (and that tailflow's
# environment has: torch 2.13.0 CPU, transformers 5.24.0), so pip keeps them and pulls no CUDA build.
set -euo pipefail
VENV_DIR="${1:-/work/venvs/trl}"
python3 -m venv --system-site-packages "$VENV_DIR"
"$VENV_DIR/bin/pip" install --quiet "torch==2.13.0" "transformers==5.24.0" "trl==1.16.0"
"$VENV_DIR/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
