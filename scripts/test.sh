#!/usr/bin/env bash
# Install what the tests need (idempotent: fast when already installed), then run them.
#   scripts/test.sh            the whole suite (CI)
#   scripts/test.sh -m "not slow"   the fast subset
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[dev]"
exec python3 -m pytest "$@"
