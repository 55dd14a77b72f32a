#!/usr/bin/env bash
# Install what the tests need (idempotent: fast when already installed), then run them.
#   scripts/test.sh            the whole suite (CI)
#   scripts/test.sh -m "not slow"   the fast subset
set -euo pipefail
cd "$(dirname "$0")/.."
# The code-reward sandbox defaults to bubblewrap where it works (the tests run every attack through it).
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  { apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; }; } \
    || echo "scripts/test.sh: could not install bubblewrap; its sandbox tests will be skipped"
fi
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
exec python3 -m pytest "$@"
