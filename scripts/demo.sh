#!/usr/bin/env bash
# The main job: the offline example, no API key needed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$PYTHON" examples/quickstart.py "$@"
