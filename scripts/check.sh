#!/usr/bin/env bash
# The fast tier, for while you work: lint, types, and the tests that need no server,
# no child process and no browser (``pytest --fast``; tests/conftest.py says which).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/lint.sh
workers="${EFFECTFUL_DURABLE_TEST_WORKERS:-$("$PYTHON" -c 'import os; print(min(os.cpu_count() or 1, 4))')}"
"$PYTHON" -m pytest --fast -q -n "$workers" "$@"
