# Sourced by scripts/gpu_evidence.sh and scripts/gpu_session.sh, on the lent GPU machine (docs/gpu.md): installs
# the carried wheels from .whl/ (scripts/gpu_wheels.sh fetches them) into /tmp/site, never over the machine's own
# packages, and puts them, the repository and tests/ on PYTHONPATH.
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
