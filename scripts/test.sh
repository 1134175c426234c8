#!/usr/bin/env bash
# The whole check, as CI runs it: lint, types, tests, docs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/lint.sh
# The tests mostly wait on child processes and servers: they run in up to 4 processes,
# one test file at a time each (EFFECTFUL_DURABLE_TEST_WORKERS=N to choose; 0: this one).
workers="${EFFECTFUL_DURABLE_TEST_WORKERS:-$("$PYTHON" -c 'import os; print(min(os.cpu_count() or 1, 4))')}"
"$PYTHON" -m pytest -n "$workers" --dist loadfile "$@"
bash scripts/docs.sh
