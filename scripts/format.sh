#!/usr/bin/env bash
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PYTHON" -m ruff check --fix src tests bench examples
"$PYTHON" -m ruff format src tests bench examples
