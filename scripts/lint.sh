#!/usr/bin/env bash
# ruff and mypy (strict) on the package.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PYTHON" -m ruff check src tests bench examples
"$PYTHON" -m ruff format --check src tests bench examples
# mypy cannot see through setuptools' package-dir mapping, so show it src/ under its real name.
mkdir -p build/typecheck
ln -sfn ../../src build/typecheck/effectful_durable
"$PYTHON" -m mypy build/typecheck/effectful_durable
