#!/usr/bin/env bash
# PostgreSQL when the server misbehaves, in full (a few minutes): the worker and runner
# loops with 12 restarts each (fast, immediate, kill -9 of the postmaster), the runner
# at concurrency 1 and 4, and 50 commits cut at random points (tests/processes/test_pg_faults.py).
# `make test` runs a sample of the same.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export EFFECTFUL_DURABLE_REQUIRE_POSTGRES=1
EFFECTFUL_DURABLE_PG_FAULTS=full "$PYTHON" -m pytest -q -p no:cacheprovider -rP \
    tests/processes/test_pg_faults.py "$@"  # -rP: each loop's counts
