#!/usr/bin/env bash
# The full fault sweep (about 20 minutes on 2 cores): every I/O call of every operation fails
# in turn (tests/processes/test_faults.py), and the power is cut at every write and sync of a run
# (tests/processes/test_power_loss.py). `make test` runs a sample of the same points.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
EFFECTFUL_DURABLE_FAULT_SWEEP=full EFFECTFUL_DURABLE_FAULT_REPORT="$report" \
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/processes/test_faults.py tests/processes/test_power_loss.py "$@"
"$PYTHON" - "$report" <<'PY'
import json, sys

rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"\n{'operation':<20} {'fault':<14} {'durability':<10} {'calls':>6} {'failed':>7} {'raised':>7}")
for r in (r for r in rows if r["sweep"] == "faults"):
    print(
        f"{r['operation']:<20} {r['fault']:<14} {r['durability']:<10} {r['calls']:>6}"
        f" {r['tried']:>7} {r['raised']:>7}"
    )
tried = sum(r["tried"] for r in rows if r["sweep"] == "faults")
print(f"{tried} faults injected; every one raised StorageError or was absorbed, nothing lost")
print(f"\n{'power loss':<20} {'durability':<10} {'cuts':>6} {'lost turns':>11}")
for r in (r for r in rows if r["sweep"] == "power"):
    print(f"{r['operation']:<20} {r['durability']:<10} {r['tried']:>6} {r['lost']:>11}")
PY
