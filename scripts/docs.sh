#!/usr/bin/env bash
# Build the HTML documentation; any Sphinx warning (broken reference included) fails it.
#   bash scripts/docs.sh            -> docs/_build/html/index.html
#   PYTHON=python3 bash scripts/docs.sh   to use another interpreter
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-.venv/bin/python}"

exec "$PYTHON" -m sphinx -W -n --keep-going -b html docs/source docs/_build/html "$@"
