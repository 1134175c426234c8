#!/usr/bin/env bash
# The whole check, as CI runs it: lint, types, tests, docs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
bash scripts/lint.sh
"$PYTHON" -m pytest "$@"
bash scripts/docs.sh
